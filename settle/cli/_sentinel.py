"""``--redis-url redis+sentinel://...``: the Sentinels, the service, the primary's connection
options and the Sentinels' own, read from one URL (docs/cli.md, "Behind Sentinel").

The commands connect with the library's Sentinel-following client (``Settler.from_sentinel``
and ``AsyncSettler.from_sentinel``: each new connection asks the Sentinels for the primary),
so a long-running ``settle web`` or ``quarantine tail`` follows a failover; the Sentinels are
also asked once when a command starts, to refuse a service none of them names (exit 3, each
Sentinel's answer said) before anything is served.

The form is the one of docket and Prefect (``redis+sentinel://`` / ``rediss+sentinel://``,
``?sentinel_username=`` / ``?sentinel_password=``), the options redis-py's ``Sentinel`` calls
``sentinel_kwargs``: the userinfo and every other query parameter are the primary's;
``rediss+sentinel://`` is TLS to the Sentinels too, with the URL's ``ssl_*`` options (one CA
for the deployment), unless ``?sentinel_ssl=no``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from redis import ConnectionPool, Redis
from redis.backoff import NoBackoff
from redis.connection import SSLConnection, parse_url
from redis.exceptions import AuthenticationError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from settle._runtime.topology import check_service_name
from settle._runtime.urls import check, redacted, url_problem
from settle._text import as_text
from settle.errors import ConfigurationError, InvalidInput

__all__ = ["SENTINEL_FORM", "SentinelUrl", "ask", "is_sentinel_url", "parse"]

_SCHEMES = ("redis+sentinel", "rediss+sentinel")

SENTINEL_FORM = (
    "redis+sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB][?OPTIONS] (the "
    "userinfo is the primary's; ?sentinel_password= and ?sentinel_username= are the "
    "Sentinels'; rediss+sentinel:// is TLS to the primary and the Sentinels, "
    "?sentinel_ssl=no asks the Sentinels over plain TCP)"
)

#: The query parameters that are the Sentinels', not the primary's.
_USERNAME, _PASSWORD, _SSL = "sentinel_username", "sentinel_password", "sentinel_ssl"
_YES = frozenset({"yes", "true", "1", "on"})
_NO = frozenset({"no", "false", "0", "off"})


def is_sentinel_url(url: str) -> bool:
    return url.split(":", 1)[0].lower() in _SCHEMES and "://" in url


@dataclass(frozen=True)
class SentinelUrl:
    """A parsed ``redis+sentinel://`` URL (:func:`parse`)."""

    given: str
    sentinels: tuple[tuple[str, int], ...]
    service: str
    scheme: str  # the primary's: redis or rediss
    userinfo: str
    database: str
    query: str  # the primary's parameters only
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False  # to the Sentinels

    def primary_url(self, host: str, port: int) -> str:
        """The ``redis://`` (``rediss://``) URL of the primary at ``host:port``, with the
        credentials, database and query the URL gives the primary (messages redact it)."""
        host = f"[{host}]" if ":" in host else host  # a Sentinel names IPv6 bare
        at = f"{self.userinfo}@" if self.userinfo else ""
        query = f"?{self.query}" if self.query else ""
        return f"{self.scheme}://{at}{host}:{port}/{self.database}{query}"

    def client_options(self) -> dict[str, Any]:
        """The primary's connection options (``client_options`` of ``from_sentinel``), as
        redis-py reads them from its URL; TLS is ``ssl=True`` (the Sentinel pool's class)."""
        options: dict[str, Any] = parse_url(self.primary_url("127.0.0.1", 6379))  # type: ignore[no-untyped-call,unused-ignore]
        for name in ("host", "port"):
            options.pop(name, None)
        if options.pop("connection_class", None) is SSLConnection:
            options["ssl"] = True
        return options

    def sentinel_options(self, timeout: float) -> dict[str, Any]:
        """The Sentinels' connection options (``sentinel_options`` of ``from_sentinel``):
        ``timeout`` for a connection and each reply, their credentials, TLS with the URL's
        ``ssl_*`` options."""
        options: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
        if self.username is not None:
            options["username"] = self.username
        if self.password is not None:
            options["password"] = self.password
        if self.tls:
            primary = self.client_options()
            options.update({k: v for k, v in primary.items() if k.startswith("ssl")})
            options["ssl"] = True
        return options


def parse(url: str) -> SentinelUrl:
    """``url`` read, nothing connected; a malformed one is :class:`InvalidInput` (exit 2)
    showing it redacted."""
    parts = urlsplit(url)
    scheme = "rediss" if parts.scheme.lower().startswith("rediss") else "redis"
    userinfo, _, hosts = parts.netloc.rpartition("@")
    path = [p for p in parts.path.split("/") if p]
    if not hosts or not 1 <= len(path) <= 2:
        raise _bad(url, f"a Sentinel URL is {SENTINEL_FORM}")
    sentinels: list[tuple[str, int]] = []
    for host in hosts.split(","):
        name, _, digits = host.rpartition(":")
        if not name or not digits.isdigit() or not 0 < int(digits) < 65536:
            raise _bad(
                url, f"{host!r} is no HOST:PORT of a Sentinel; a Sentinel URL is {SENTINEL_FORM}"
            )
        sentinels.append((name.strip("[]"), int(digits)))
    ours: dict[str, str] = {}
    theirs: list[tuple[str, str]] = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in (_USERNAME, _PASSWORD, _SSL):
            ours[name] = value
        else:
            theirs.append((name, value))
    tls = scheme == "rediss"
    if _SSL in ours:
        said = ours[_SSL].strip().lower()
        if said not in _YES | _NO:
            raise _bad(url, f"?{_SSL}= is yes or no, not {ours[_SSL]!r}")
        if said in _YES and not tls:
            raise _bad(
                url,
                f"?{_SSL}=yes needs rediss+sentinel:// (TLS to the primary and the "
                "Sentinels); redis+sentinel:// asks them over plain TCP",
            )
        tls = tls and said in _YES
    try:  # as from_sentinel: a name no Sentinel can monitor was asked of each, exit 3
        service = check_service_name(unquote(path[0]))
    except InvalidInput as exc:
        raise _bad(url, str(exc)) from None
    found = SentinelUrl(
        given=url,
        sentinels=tuple(sentinels),
        service=service,
        scheme=scheme,
        userinfo=userinfo,
        database=path[1] if len(path) > 1 else "0",
        query=urlencode(theirs),
        username=ours.get(_USERNAME) or None,
        password=ours.get(_PASSWORD) or None,
        tls=tls,
    )
    _check_options(found)
    return found


def _check_options(found: SentinelUrl) -> None:
    """The primary's part as :func:`~settle.cli._context.checked_url` checks a URL (a query
    parameter no connection takes, a database that is not a number, a password read as the
    port...), and the Sentinels' options, by building a connection of each: nothing is
    connected. redis-py's words may quote a password: fixed words instead."""
    template = found.primary_url("127.0.0.1", 6379)
    try:
        ConnectionPool.from_url(template).make_connection()
        check(template)
        Redis(**found.sentinel_options(1.0)).connection_pool.make_connection()
    except (ValueError, TypeError, RedisError) as exc:
        raise _bad(found.given, url_problem(exc)) from None


def _bad(url: str, why: str) -> InvalidInput:
    return InvalidInput(f"bad --redis-url {redacted(url)}: {why}")


def ask(target: SentinelUrl, timeout: float) -> tuple[str, int]:
    """The address of the primary the Sentinels name now: each Sentinel in turn, one try of
    ``timeout`` each, with the URL's Sentinel options. None naming the service is
    :class:`ConfigurationError` (exit 3) with each Sentinel's answer, the secrets never
    shown, and what to give a Sentinel that refused the credentials or the TLS."""
    errors: list[str] = []
    refused = tls_failed = unanswered = False
    options = target.sentinel_options(timeout)
    for host, port in target.sentinels:
        with Redis(host=host, port=port, retry=Retry(NoBackoff(), 0), **options) as sentinel:
            try:
                found = sentinel.execute_command(
                    "SENTINEL", "GET-MASTER-ADDR-BY-NAME", target.service
                )
            except (RedisError, OSError) as exc:
                text = f"{type(exc).__name__}: {exc}"
                refused = refused or isinstance(exc, AuthenticationError) or "NOAUTH" in text
                tls_failed = tls_failed or "SSL" in text
                unanswered = unanswered or isinstance(exc, RedisTimeoutError | TimeoutError)
                errors.append(f"{host}:{port}: {text}")
                continue
        if found:
            address = as_text(found[0])
            return address, int(found[1])
        errors.append(f"{host}:{port} names no primary for {target.service!r}")
    hint = ""
    if refused:
        hint = (
            f"; a Sentinel that requires a password takes ?{_PASSWORD}= (and "
            f"?{_USERNAME}= for an ACL user) in the URL: the userinfo is the primary's"
        )
    elif target.tls and (tls_failed or unanswered):
        # A TLS hello sent to a plain port is read as a command: no answer, a timeout.
        hint = (
            f"; rediss+sentinel:// asks the Sentinels over TLS: Sentinels that listen on "
            f"plain TCP take ?{_SSL}=no"
        )
    detail = " ".join("; ".join(errors).split())
    raise ConfigurationError(
        f"no Sentinel of {redacted(target.given)} named the primary of service "
        f"{target.service!r} ({detail}); check the Sentinels' addresses and the service name "
        f"(SENTINEL MASTERS lists them){hint}"
    )
