"""Redis URLs in messages: the URL with its secrets hidden, and what redis-py found wrong
with one, in fixed words.

Every message, log line or span that names a Redis URL goes through :func:`redacted`; a
``ValueError`` or ``TypeError`` redis-py raised while parsing one is described by
:func:`url_problem`, never pasted: its text can quote a part of the URL (``Port could not be
cast to integer value as 's3cret'``, ``netloc '...' contains invalid characters``), and so a
password typed with a ``/``, ``?`` or ``#`` in it. :func:`check` refuses such a password
where redis-py parses the URL without complaint (``redis://:123/rest@host:6379/0`` is, to
redis-py, port 123 of localhost, no password), before anything connects and quotes it.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import parse_qs, unquote, unquote_plus, urlsplit

from settle._input import is_utf8

__all__ = ["check", "redacted", "url_problem"]

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
#: Characters that end a URL's authority: a password that holds one unencoded moves it.
_AUTHORITY_ENDS = ("/", "?", "#")


def redacted(url: str) -> str:
    """``url`` without its secrets, for a message: the password of the userinfo, the value
    of every query parameter redis-py takes a password from (``?password=``,
    ``?ssl_password=``) and any fragment (never read, so perhaps the tail of a password
    with a ``#`` in it) become ``***``.

    The userinfo is everything between ``scheme://`` and the *last* ``@``, so a ``/``,
    ``?`` or ``#`` typed unencoded in a password stays inside it. When that reading and
    the usual one (an ``@`` inside a password query value) could each hide a secret the
    other shows, or the URL has no ``scheme://``, only the scheme is shown: ``redis://***``,
    ``redis:***``."""
    scheme = _SCHEME.match(url)
    if scheme is None or url[scheme.end() : scheme.end() + 1] != ":":
        return "***"
    if url[scheme.end() : scheme.end() + 3] != "://":
        return f"{scheme.group()}:***"
    head, rest = url[: scheme.end() + 3], url[scheme.end() + 3 :]
    found = _userinfo(rest)
    if found is None:  # no password in a userinfo: only the query's
        return head + _redacted_location(rest)
    if not found:
        return head + "***"
    user, _, location = found
    return f"{head}{user}:***@{_redacted_location(location)}"


def check(url: str) -> None:
    """Raise ``ValueError`` (described by :func:`url_problem`) for a URL whose password holds
    an unencoded ``/``, ``?`` or ``#``: redis-py ends the host part there, and would connect to
    the host named by the user name (or localhost) at a port read from the password, with no
    password; its connection errors would then quote both. An ``@`` in a query value
    (``?client_name=a@b``) is not taken for the end of a password.

    Also refused: a URL that is no UTF-8 text (a byte of another encoding, from the command
    line or the environment: redis-py failed to send it with a ``UnicodeEncodeError``), and a
    ``redis://`` path that is not a database number, which redis-py ignores or misreads
    (``/O`` for ``/0`` connected to database 0, ``/1/2`` to database 12), and a
    ``socket_timeout`` or ``socket_connect_timeout`` that is not more than 0 seconds and
    finite (at most a day), which the socket refused with a traceback at connect."""
    if not is_utf8(url):  # bytes of no UTF-8 text, from argv or the environment
        raise ValueError(_NOT_TEXT)
    scheme = _SCHEME.match(url)
    if scheme is None or url[scheme.end() : scheme.end() + 3] != "://":
        return
    found = _userinfo(url[scheme.end() + 3 :])
    if found and any(ch in found[1] for ch in _AUTHORITY_ENDS):
        raise ValueError(_UNENCODED)
    parts = urlsplit(url)
    # redis-py drops every "/" of the path and reads the rest with int(), or ignores it
    if scheme.group().lower() in _TCP_SCHEMES and not _DATABASE.fullmatch(
        unquote(parts.path).removeprefix("/").strip()
    ):
        raise ValueError(_NOT_A_DATABASE)
    for name, values in parse_qs(parts.query).items():
        if name in _TIMEOUTS and not _seconds(unquote(values[0])):
            # redis-py takes any float, and the socket refused it at connect (-1, nan: a
            # ValueError traceback; inf: an OverflowError); 0 made it non-blocking
            raise ValueError(f"a timeout out of range in {name!r}")


def _seconds(text: str) -> bool:
    """Whether ``text`` is a number of seconds a socket timeout can be: more than 0, finite."""
    try:
        return 0 < float(text) < _MAX_TIMEOUT
    except ValueError:
        return False


def _userinfo(rest: str) -> tuple[str, str, str] | Literal[False] | None:
    """``(user, password, location)`` of what follows ``scheme://``, the userinfo read up to
    the *last* ``@``; None when that userinfo holds no password; False when the usual reading
    (an ``@`` inside a query value: ``?client_name=a@b``, ``?password=a@b``) could hold a
    secret this one shows, or the user part holds a ``/``, ``?`` or ``#``."""
    userinfo, at, location = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return None
    user, _, password = userinfo.partition(":")
    if any(ch in user for ch in _AUTHORITY_ENDS) or _in_parameter(userinfo):
        return False
    return user, password, location


def _redacted_location(location: str) -> str:
    """``host[:port][/path][?query][#fragment]`` with password parameters and the
    fragment hidden."""
    location, hash_, _ = location.partition("#")
    path, query_sep, query = location.partition("?")
    if query_sep:
        query = "&".join(_redacted_parameter(p) for p in query.split("&"))
    return path + query_sep + query + ("#***" if hash_ else "")


def _redacted_parameter(parameter: str) -> str:
    name, eq, _ = parameter.partition("=")
    return f"{name}=***" if eq and _is_password(name) else parameter


def _is_password(name: str) -> bool:
    return "password" in unquote_plus(name).lower()


def _in_parameter(before_at: str) -> bool:
    """Whether the ``@`` that follows ``before_at`` is, read the usual way (the authority
    ends at the first ``/``, ``?`` or ``#``), inside the value of a query parameter: then
    what follows the ``@`` is part of that value, not a host to show. A password parameter's
    value would be shown (``?password=a@b``); so would a later one's
    (``?username=a@b&password=k``), after what looks like a host."""
    _, query_sep, query = before_at.partition("?")
    if not query_sep:
        return False
    return "=" in query.split("&")[-1]


#: :func:`check`'s ValueErrors (their own words: they quote nothing of the URL).
_UNENCODED = "a password with an unencoded '/', '?' or '#'"
_NOT_TEXT = "a URL that is not UTF-8 text"
_NOT_A_DATABASE = "a database path that is not a number"
#: The schemes whose path is a database number (``unix://``'s is the socket's path).
_TCP_SCHEMES = ("redis", "rediss")
_DATABASE = re.compile(r"[0-9]*", re.ASCII)
#: The query parameters redis-py passes to the socket as a timeout (seconds), and the
#: largest one settle takes (a day: a socket takes no infinite one).
_TIMEOUTS = ("socket_timeout", "socket_connect_timeout")
_MAX_TIMEOUT = 86400.0

#: Words in redis-py's ValueError messages (and urllib's, which it passes on), each with
#: the fixed words that describe it without quoting the URL.
_PROBLEMS = (
    (
        _UNENCODED,
        "the password holds a '/', '?' or '#', which ends the host part of a URL: "
        "percent-encode it (%2F, %3F, %23)",
    ),
    (_NOT_TEXT, "it holds bytes that are not UTF-8 text"),
    (
        _NOT_A_DATABASE,
        "the path is not a database number (redis://host:port/0 is database 0)",
    ),
    (
        "Redis URL must specify one of the following schemes",
        "an unknown scheme (a Redis URL starts with redis://, rediss:// or unix://)",
    ),
    ("Port could not be cast to integer", "the port is not a number"),
    ("Port out of range", "the port is not from 0 to 65535"),
    ("Invalid IPv6 URL", "a '[' or ']' without its pair"),
    ("under NFKC normalization", "characters no host or userinfo may hold"),
    ("does not appear to be an IPv4 or IPv6 address", "a host in [] that is no IP address"),
    # redis-py's RedisError from a connection's constructor: a query value it refuses
    ("protocol must be", "the value of the query parameter 'protocol' is not 2 or 3"),
    (
        "Invalid SSL Certificate Requirements Flag",
        "the value of the query parameter 'ssl_cert_reqs' is not valid",
    ),
)
_INVALID_VALUE = re.compile(r"Invalid value for '(\w+)' in connection URL")
_BAD_TIMEOUT = re.compile(r"a timeout out of range in '(\w+)'")
_UNEXPECTED = re.compile(r"unexpected keyword argument '(\w+)'")


def url_problem(exc: Exception) -> str:
    """What redis-py found wrong with a URL (a ``ValueError`` or ``TypeError`` from parsing
    it, a ``RedisError`` from building a connection of it), in words that quote no part of
    it but the name of a query parameter: ``the port is not a number``, ``an unknown scheme
    (...)``, ``a query parameter no Redis connection takes ('socket_timout')``."""
    text = str(exc)
    if isinstance(exc, TypeError):  # "...__init__() got an unexpected keyword argument 'x'"
        name = _UNEXPECTED.search(text)
        named = f" ({name.group(1)!r})" if name else ""
        return f"a query parameter no Redis connection takes{named}"
    for words, problem in _PROBLEMS:
        if words in text:
            return problem
    name = _BAD_TIMEOUT.search(text)
    if name:
        return (
            f"the value of the query parameter {name.group(1)!r} is not a number of seconds "
            f"above 0 and at most {_MAX_TIMEOUT:.0f}"
        )
    name = _INVALID_VALUE.search(text)
    if name:
        return f"the value of the query parameter {name.group(1)!r} is not valid"
    return "it cannot be parsed as a Redis URL"
