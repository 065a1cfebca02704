"""``settle web``: serve the quarantine console (docs/console.md) with uvicorn.

Read-only unless a token is given (``--token`` or ``SETTLE_WEB_TOKEN``); with one, whoever
signs in with it may resolve entries, and each resolution note names ``--principal``.
Listens on 127.0.0.1 by default: put a TLS-terminating proxy in front before exposing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import secrets
import socket
from typing import Any

import click

from settle._async.settler import AsyncSettler
from settle.cli._context import (
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    Connection,
    EnvOption,
    connection_options,
    errors_as_exit_codes,
    fail,
    open_settler,
    options_named,
)
from settle.config import SettleConfig

__all__ = ["web"]

#: What the console's checks call the values of the options (``options_named``).
_OPTIONS = {"principal": "--principal", "token": "--token", "allowed_hosts": "--allow-host"}


@click.command("web")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8321, show_default=True, help="Port."
)
@click.option(
    "--token",
    envvar="SETTLE_WEB_TOKEN",
    cls=EnvOption,
    default=None,
    help="Token that signs a user in to resolve entries (env SETTLE_WEB_TOKEN). Without "
    "one the console is read-only.",
)
@click.option(
    "--principal",
    default="operator",
    show_default=True,
    help="Who a token sign-in resolves as (written into every resolution note).",
)
@click.option(
    "--https-only",
    is_flag=True,
    help="Mark the session cookie Secure (behind a TLS proxy).",
)
@click.option(
    "--allow-host",
    "allow_hosts",
    multiple=True,
    help="Another Host header value to serve (the proxy's name); loopback names and --host "
    "are always served, any other Host gets 400 (DNS rebinding).",
)
@connection_options
def web(
    conn: Connection,
    host: str,
    port: int,
    token: str | None,
    principal: str,
    https_only: bool,
    allow_hosts: tuple[str, ...],
) -> None:
    """Serve the quarantine console in the browser (needs the 'web' extra)."""
    try:
        import uvicorn  # noqa: PLC0415  (optional: the 'web' extra)

        from settle.web import create_app, token_authorizer  # noqa: PLC0415
        from settle.web._security import check_principal  # noqa: PLC0415
        from settle.web.app import (  # noqa: PLC0415
            LOOPBACK_HOSTS,
            _host_header,
            check_allowed_hosts,
        )
    except ImportError as exc:
        fail(
            f"settle web needs the 'web' extra ({exc.name} is missing): "
            "pip install 'settle-sdk[web]'",
            EXIT_UNAVAILABLE,
        )
    # Each option by the rule it meets later, before anything is served: a --principal the
    # console cannot write into a note, a --token no sign-in form can send, an --allow-host
    # pattern Starlette refuses at the first request (every page 500) are exit 2.
    with errors_as_exit_codes(conn), options_named(_OPTIONS):
        authorize = token_authorizer(token, principal) if token else None
        check_principal(principal)
        check_allowed_hosts(allow_hosts)
    # The namespace exists; its stored shard count. Without a token the console only reads:
    # a server whose policy evicts is read (the pages say the policy), as by the read
    # commands, and nothing is written (no shard claimed); a token's resolving writes.
    reads = authorize is None
    with open_settler(conn, reads=reads) as probe:
        config = probe.config
    listening = _listen(host, port)  # before anything is announced
    port = listening[0].getsockname()[1]  # --port 0: the one it got
    settler = _console_settler(conn, config)
    if reads:
        settler._reading()
    hosts = [*LOOPBACK_HOSTS, host, *allow_hosts]
    app = create_app(
        settler,
        authorize=authorize,
        secret_key=secrets.token_urlsafe(32),
        https_only=https_only,
        allowed_hosts=hosts,
        redis_timeout=conn.redis_timeout,  # --redis-timeout: each page's Redis calls in all
    )
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    )
    mode = f"resolving as {principal!r} after sign-in" if token else "read-only (no --token)"
    click.echo(
        # An IPv6 address in brackets: http://::1:8321/ is no URL a browser opens.
        f"settle web: the quarantine console of {conn.namespace} on "
        f"http://{_host_header(host)}:{port}/ "
        f"({mode}); Ctrl-C to stop",
        err=True,
    )
    if token and not _loopback(host):
        click.echo(
            "settle web: warning: the token and session cookie travel in clear text over "
            "plain HTTP; serve it behind a TLS proxy",
            err=True,
        )
    if not _loopback(host):  # with a token too: it guards resolving, never reading
        click.echo(
            f"settle web: warning: the console on {host} is reachable from the network, "
            "and reading needs no sign-in: anyone who reaches it reads every payload and "
            "principal of the quarantine. Listen on 127.0.0.1 behind a reverse proxy that "
            "authenticates (name it with --allow-host); --token or SETTLE_WEB_TOKEN only "
            "guards resolving",
            err=True,
        )

    async def serve() -> None:
        try:
            await server.serve(sockets=listening)
        finally:
            await settler.aclose()

    # Ctrl-C stops the console with 0 (docs/cli.md), as the way to stop a server: uvicorn
    # shuts down, then raises the Ctrl-C again, which the group said as "interrupted", 130.
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


def _console_settler(conn: Connection, config: SettleConfig) -> AsyncSettler:
    """The console's settler. Behind Sentinel it is the library's Sentinel-following one
    (``from_sentinel``): each new connection asks the Sentinels, so after a failover the
    pages load and a resolve is written on the promoted replica, with no restart; the
    console had kept the primary named at start, down or demoted."""
    target = conn.sentinel
    if target is None:
        return AsyncSettler.from_url(conn.url, config)
    return AsyncSettler.from_sentinel(
        list(target.sentinels),
        config,
        service_name=target.service,
        client_options=target.client_options(),
        sentinel_options=target.sentinel_options(conn.redis_timeout),
    )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _listen(host: str, port: int) -> list[socket.socket]:
    """Sockets bound to every address of ``host`` (as uvicorn would bind them), ``port 0``
    one port for all. An address the console cannot listen on (a port in use, a host that
    does not resolve) is one line and exit 2: uvicorn said it in its own log format after
    the console was announced on it, and exited 3 ("Redis unreachable")."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        return bind_each(
            [(family, kind, proto, address) for family, kind, proto, _, address in found]
        )
    except OSError as exc:  # socket.gaierror included
        fail(f"cannot listen on {host}:{port} (--host, --port): {exc.strerror or exc}", EXIT_USAGE)


#: An address of a family the host has turned off (``localhost`` resolving to ``::1`` in a
#: container without IPv6): skipped when another address binds, as asyncio does since 3.12.
_UNAVAILABLE = frozenset({errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT})


#: The listen backlog of the console's sockets (uvicorn's default).
_BACKLOG = 2048


def bind_each(addresses: list[tuple[int, int, int, Any]]) -> list[socket.socket]:
    """A socket bound to each of ``addresses`` (``getaddrinfo``'s family, type, protocol and
    address), listening, duplicates once, port 0 the first bound one's port for all; an address not
    available on this host is skipped unless none binds. Raises ``OSError`` (every socket
    made is closed)."""
    listening: list[socket.socket] = []
    unavailable: OSError | None = None
    try:
        for family, kind, proto, found_address in dict.fromkeys(addresses):
            address = found_address
            if listening:  # --port 0: the port the first address got
                address = (address[0], listening[0].getsockname()[1], *address[2:])
            try:
                sock = socket.socket(family, kind, proto)
            except OSError as exc:
                if exc.errno not in _UNAVAILABLE:
                    raise
                unavailable = exc
                continue
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:  # each family on its own socket, as asyncio does
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(address)
                # Listening before the port is announced: bound alone, it refused the
                # connections of a script that connected on the announcement, until
                # uvicorn started (it listens again with its backlog, which is fine).
                sock.listen(_BACKLOG)
            except OSError as exc:
                sock.close()
                if exc.errno not in _UNAVAILABLE:
                    raise
                unavailable = exc
                continue
            listening.append(sock)
        if not listening:
            raise unavailable or OSError(errno.EADDRNOTAVAIL, "no address to listen on")
    except OSError:
        for sock in listening:
            with contextlib.suppress(OSError):
                sock.close()
        raise
    return listening
