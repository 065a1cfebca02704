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
    sentinel: int  # TLS only
    plain_sentinel: int  # plain TCP only, the same deployment

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


def _tls(ca: Path, cert: Path, key: Path, port: int = 0) -> str:
    return (
        f"port {port}\nbind 127.0.0.1\ntls-cert-file {cert}\ntls-key-file {key}\n"
        f"tls-ca-cert-file {ca}\ntls-auth-clients no\ntls-replication yes\n"
    )


def _answering(port: int, ca: Path | None, command: tuple[str, ...], timeout: float = 15) -> None:
    """Wait for ``command`` to answer on ``port`` (TLS with ``ca``, else plain TCP)."""
    tls = {"ssl": True, "ssl_ca_certs": str(ca)} if ca is not None else {}
    deadline = time.monotonic() + timeout
    while True:
        try:
            with redis.Redis(port=port, socket_timeout=2, **tls) as c:  # type: ignore[arg-type]
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
    primary, sentinel, plain = free_port(), free_port(), free_port()
    (directory / "primary.conf").write_text(
        _tls(ca, cert, key) + f'tls-port {primary}\nsave ""\nappendonly no\ndir {directory}\n'
    )
    for name, conf in (
        ("sentinel", _tls(ca, cert, key) + f"tls-port {sentinel}\n"),
        ("plain", _tls(ca, cert, key, plain)),
    ):
        (directory / f"{name}.conf").write_text(
            conf + f"dir {directory}\nsentinel monitor {SERVICE} 127.0.0.1 {primary} 1\n"
        )
    log = (directory / "servers.log").open("ab")
    processes = [
        subprocess.Popen([str(REDIS7), str(directory / "primary.conf")], stdout=log, stderr=log),
    ]
    try:
        _answering(primary, ca, ("PING",))
        for name in ("sentinel", "plain"):
            processes.append(
                subprocess.Popen(
                    [str(REDIS7), str(directory / f"{name}.conf"), "--sentinel"],
                    stdout=log,
                    stderr=log,
                )
            )
        _answering(sentinel, ca, ("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE))
        _answering(plain, None, ("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE))
        found = TlsDeployment(ca, primary, sentinel, plain)
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


def test_sentinel_ssl_no_asks_plain_sentinels_of_a_tls_primary(
    deployment: TlsDeployment,
) -> None:
    """``?sentinel_ssl=no``: Sentinels on plain TCP, the primary on TLS (the meaning
    ``rediss+sentinel://`` had before); it was passed on to the primary's connection, which
    refused it as an unknown option (exit 2)."""
    url = (
        f"rediss+sentinel://127.0.0.1:{deployment.plain_sentinel}/{SERVICE}"
        f"?sentinel_ssl=no&ssl_ca_certs={deployment.ca}"
    )
    done = settle("stats", "--redis-url", url, "--namespace", "tls", timeout=60)
    assert done.returncode == 0, done.stderr
    # The TLS-only Sentinel asked over plain TCP does not answer: exit 3, no traceback.
    url = f"rediss+sentinel://127.0.0.1:{deployment.sentinel}/{SERVICE}?sentinel_ssl=no"
    done = settle("stats", "--redis-url", url, "--namespace", "tls", timeout=60)
    assert done.returncode == 3, done.stderr
    assert f"named the primary of service {SERVICE!r}" in done.stderr
    assert "Traceback" not in done.stderr
