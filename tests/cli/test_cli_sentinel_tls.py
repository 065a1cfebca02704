"""Sentinels that listen on TLS only (``port 0``, ``tls-port``): ``rediss+sentinel://``
was TLS to the primary only, the Sentinels asked over plain TCP, so such a deployment
could not be reached at all (exit 3, each Sentinel's connection reset). It is now TLS to
the Sentinels too, with the URL's ``ssl_*`` options (one CA for the deployment), as docket
and Prefect read it; ``?sentinel_ssl=no`` keeps plain TCP to the Sentinels.

Run on Debian's Redis 7 (``.ci/redis7``, built with TLS), certificates made with openssl;
skipped where either is missing."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from settle import Settler
from settle.embedded import free_port
from tests.cli.conftest import settle
from tests.faults.sentinel_support import SERVICE
from tests.progress.harness import REDIS7

pytestmark = [
    pytest.mark.faults,
    pytest.mark.skipif(not REDIS7.exists(), reason="Debian's Redis 7 is not under .ci/redis7"),
    pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl to make certificates"),
]


@dataclass
class TlsDeployment:
    ca: Path
    primary: int
    sentinel: int

    def primary_url(self) -> str:
        return f"rediss://127.0.0.1:{self.primary}/0?ssl_ca_certs={self.ca}"


def _certificates(directory: Path) -> tuple[Path, Path, Path]:
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
    )
    run(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    )
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "san.ext",
        "-out",
        "server.crt",
    )
    return directory / "ca.crt", directory / "server.crt", directory / "server.key"


def _tls(ca: Path, cert: Path, key: Path) -> str:
    return (
        f"port 0\nbind 127.0.0.1\ntls-cert-file {cert}\ntls-key-file {key}\n"
        f"tls-ca-cert-file {ca}\ntls-auth-clients no\ntls-replication yes\n"
    )


def _answering(port: int, ca: Path, command: tuple[str, ...], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with redis.Redis(port=port, ssl=True, ssl_ca_certs=str(ca), socket_timeout=2) as c:
                if c.execute_command(*command):
                    return
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
            pass
        assert time.monotonic() < deadline, f"nothing answered {command} on TLS port {port}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def deployment() -> Iterator[TlsDeployment]:
    directory = Path(tempfile.mkdtemp(prefix="settle-tls-"))
    ca, cert, key = _certificates(directory)
    primary, sentinel = free_port(), free_port()
    (directory / "primary.conf").write_text(
        _tls(ca, cert, key) + f'tls-port {primary}\nsave ""\nappendonly no\ndir {directory}\n'
    )
    (directory / "sentinel.conf").write_text(
        _tls(ca, cert, key)
        + f"tls-port {sentinel}\ndir {directory}\n"
        + f"sentinel monitor {SERVICE} 127.0.0.1 {primary} 1\n"
    )
    log = (directory / "servers.log").open("ab")
    processes = [
        subprocess.Popen([str(REDIS7), str(directory / "primary.conf")], stdout=log, stderr=log),
    ]
    try:
        _answering(primary, ca, ("PING",))
        processes.append(
            subprocess.Popen(
                [str(REDIS7), str(directory / "sentinel.conf"), "--sentinel"],
                stdout=log,
                stderr=log,
            )
        )
        _answering(sentinel, ca, ("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE))
        found = TlsDeployment(ca, primary, sentinel)
        with Settler.from_url(found.primary_url(), namespace="tls", shards=2) as s:
            s.check()
        yield found
    finally:
        for process in processes:  # stopped by their own pids
            process.terminate()
            process.wait(timeout=10)
        log.close()
        shutil.rmtree(directory, ignore_errors=True)


def test_tls_only_sentinels_are_asked_over_tls(deployment: TlsDeployment) -> None:
    url = (
        f"rediss+sentinel://127.0.0.1:{deployment.sentinel}/{SERVICE}?ssl_ca_certs={deployment.ca}"
    )
    for command in (("stats",), ("quarantine", "ls")):
        done = settle(*command, "--redis-url", url, "--namespace", "tls", timeout=60)
        assert done.returncode == 0, (command, done.stderr)


def test_sentinel_ssl_no_asks_them_over_plain_tcp(deployment: TlsDeployment) -> None:
    """``?sentinel_ssl=no`` (the meaning ``rediss+sentinel://`` had before): a TLS-only
    Sentinel asked over plain TCP does not answer, exit 3 with its answer, no traceback."""
    url = f"rediss+sentinel://127.0.0.1:{deployment.sentinel}/{SERVICE}?sentinel_ssl=no"
    done = settle("stats", "--redis-url", url, "--namespace", "tls", timeout=60)
    assert done.returncode == 3, done.stderr
    assert f"named the primary of service {SERVICE!r}" in done.stderr
    assert "Traceback" not in done.stderr
