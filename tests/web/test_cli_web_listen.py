"""``settle web`` listens before it says where: an address it cannot listen on (a port in
use, a host that does not resolve) is one line and exit 2 before anything is announced,
and ``--port 0`` announces the port it got."""

from __future__ import annotations

import errno
import os
import re
import signal
import socket
import subprocess

import httpx
import pytest

from settle import Settler
from settle.cli.web import bind_each
from tests.cli.conftest import SETTLE, _sigint_not_ignored, cli_env, settle


def _console_on_port_0(redis_url: str, namespace: str) -> subprocess.Popen[str]:
    """``settle web --port 0`` on the namespace, its stderr a pipe (the announcement), with
    SIGINT's default whatever pytest inherited (the tests stop it with Ctrl-C)."""
    with _sigint_not_ignored():
        return subprocess.Popen(
            [str(SETTLE), "web", "--redis-url", redis_url, "--namespace", namespace, "--port", "0"],
            env=cli_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )


def test_a_port_in_use_is_one_line_and_exit_2_before_anything_is_announced(
    redis_url: str, namespace: str, writer: Settler
) -> None:
    del writer
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        connection = ("--redis-url", redis_url, "--namespace", namespace)
        done = settle("web", *connection, "--port", str(port))
    # It announced "the quarantine console of ... on http://127.0.0.1:PORT/", then uvicorn's
    # "ERROR:    [Errno 98] error while attempting to bind ...", and exited 3 ("Redis
    # unreachable" in docs/cli.md).
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"settle: cannot listen on 127.0.0.1:{port} (--host, --port): Address already in use\n"
    )


def test_a_host_that_does_not_resolve_is_one_line_and_exit_2(
    redis_url: str, namespace: str, writer: Settler
) -> None:
    del writer
    done = settle(
        "web", "--redis-url", redis_url, "--namespace", namespace, "--host", "no-such-host.invalid"
    )
    assert done.returncode == 2, done.stderr
    said = "settle: cannot listen on no-such-host.invalid:8321 (--host, --port): "
    assert done.stderr.startswith(said), done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr


def test_port_0_announces_the_port_it_listens_on(
    redis_url: str, namespace: str, writer: Settler
) -> None:
    del writer
    proc = _console_on_port_0(redis_url, namespace)
    try:
        assert proc.stderr is not None
        announced = proc.stderr.readline()
        # It said "on http://127.0.0.1:0/", where nothing listens.
        found = re.search(r"on http://127\.0\.0\.1:(\d+)/ ", announced)
        assert found is not None, announced
        assert found.group(1) != "0", announced
        page = httpx.get(f"http://127.0.0.1:{found.group(1)}/static/console.css", timeout=10)
        assert page.status_code == 200
    finally:
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(timeout=10)
        assert proc.stderr is not None
        proc.stderr.close()


def test_the_announced_port_takes_connections_before_the_server_runs(
    redis_url: str, namespace: str, writer: Settler
) -> None:
    """Found in review (test_port_0_announces_the_port_it_listens_on flaked, connection
    refused): the port was announced bound but not listening, until uvicorn started; a
    script that connected on the announcement was refused. The process is stopped right
    after its announcement, so that uvicorn cannot have started: the connection is taken
    (queued), and answered once it runs."""
    del writer
    proc = _console_on_port_0(redis_url, namespace)
    try:
        assert proc.stderr is not None
        announced = proc.stderr.readline()
        os.kill(proc.pid, signal.SIGSTOP)
        found = re.search(r"on http://127\.0\.0\.1:(\d+)/ ", announced)
        assert found is not None, announced
        with socket.create_connection(("127.0.0.1", int(found.group(1))), timeout=5) as conn:
            conn.sendall(b"GET /static/console.css HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            os.kill(proc.pid, signal.SIGCONT)
            conn.settimeout(30)
            assert conn.recv(12) == b"HTTP/1.1 200"
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(timeout=10)
        assert proc.stderr is not None
        proc.stderr.close()


# An address no interface of this host holds (TEST-NET-1): binding it fails with
# EADDRNOTAVAIL, as ``::1`` does where IPv6 is turned off.
_NOT_HERE = (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, ("192.0.2.1", 0))
_LOOPBACK = (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, ("127.0.0.1", 0))


def test_an_address_this_host_does_not_hold_is_skipped_when_another_binds() -> None:
    """Found in review: ``--host localhost`` resolving to ``::1`` and ``127.0.0.1`` in a
    container without IPv6 exited 2, where uvicorn (asyncio, since 3.12) listened on the
    address that binds."""
    for addresses in ([_NOT_HERE, _LOOPBACK], [_LOOPBACK, _NOT_HERE]):
        listening = bind_each(addresses)
        try:
            assert [s.getsockname()[0] for s in listening] == ["127.0.0.1"]
            listening[0].listen()  # as uvicorn does with the sockets it is given
            with socket.create_connection(listening[0].getsockname()[:2], timeout=5):
                pass
        finally:
            for sock in listening:
                sock.close()


def test_no_address_that_binds_is_refused() -> None:
    with pytest.raises(OSError, match="assign") as refused:
        bind_each([_NOT_HERE])
    assert refused.value.errno == errno.EADDRNOTAVAIL


def test_a_port_in_use_on_any_address_is_refused_and_nothing_stays_bound() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        first = (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, ("127.0.0.2", port))
        busy = (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, ("127.0.0.1", port))
        with pytest.raises(OSError, match="in use") as refused:
            bind_each([first, busy])
        assert refused.value.errno == errno.EADDRINUSE
    with socket.socket() as again:  # the first address's socket was closed
        again.bind(("127.0.0.2", port))


def test_ctrl_c_stops_the_console_with_exit_0(
    redis_url: str, namespace: str, writer: Settler
) -> None:
    """Found in review: docs/cli.md (and the CHANGELOG) say Ctrl-C stops ``settle web``
    with 0, as the normal way to stop a server; uvicorn (0.29 on) raises the Ctrl-C again
    once it has shut down, and the console said ``settle: interrupted``, exit 130, which a
    supervisor or script reads as a failed run."""
    del writer
    proc = _console_on_port_0(redis_url, namespace)
    try:
        assert proc.stderr is not None
        found = re.search(r"on http://127\.0\.0\.1:(\d+)/ ", proc.stderr.readline())
        assert found is not None
        page = httpx.get(f"http://127.0.0.1:{found.group(1)}/", timeout=30)
        assert page.status_code == 200  # serving, its first page read
    finally:
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert (proc.returncode, err) == (0, "")
