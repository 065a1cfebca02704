"""``python -m benchmarks._http_app --in-process``, the tool docs/benchmarks.md counts the
middleware's instructions with: every variant it measures runs to its JSON line and closes
its Redis clients (no ResourceWarning at exit under ``-X dev``), and a mode the variant
cannot serve is refused with one line that says what to use, before any request."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest

from benchmarks._http_app import PATH
from benchmarks.http import BODY
from settle.embedded import free_port
from tests.benchmarks.test_smoke import ROOT


def _in_process(redis_url: str, variant: str, mode: str) -> subprocess.CompletedProcess[str]:
    tool = [sys.executable, "-X", "dev", "-m", "benchmarks._http_app", "--in-process"]
    return subprocess.run(
        [*tool, variant, mode, "8", redis_url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("variant", "mode"),
    [("bare", "none"), ("settle", "new"), ("settle", "replay"), ("peer", "new")],
)
def test_each_variant_runs_and_closes_its_redis_clients(
    redis_url: str, variant: str, mode: str
) -> None:
    done = _in_process(redis_url, variant, mode)
    assert done.returncode == 0, done.stderr[-3000:]
    # -X dev shows every ResourceWarning: an unclosed settler or store leaves its sockets
    # ("unclosed transport") to the garbage collector after the loop is closed.
    assert "Warning" not in done.stderr, done.stderr[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert (line["variant"], line["mode"]) == (variant, mode)
    assert line["cpu_us"] > 0


@pytest.mark.parametrize("variant", ["settle", "peer"])
def test_mode_none_is_refused_for_a_middleware_with_a_clear_message(
    redis_url: str, variant: str
) -> None:
    done = _in_process(redis_url, variant, "none")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "mode 'none' sends no Idempotency-Key" in done.stderr
    assert f"use 'new' or 'replay' for {variant!r}" in done.stderr
    assert done.stdout == ""


def test_an_unknown_mode_is_refused_rather_than_measured_as_a_new_key(redis_url: str) -> None:
    done = _in_process(redis_url, "settle", "replayed")
    assert done.returncode == 1
    assert done.stderr.strip() == "unknown mode 'replayed': none, new, replay"


def test_an_unknown_variant_is_refused_rather_than_measured_as_the_bare_app(
    redis_url: str,
) -> None:
    done = _in_process(redis_url, "setle", "new")
    assert done.returncode == 1
    assert done.stderr.strip() == "unknown variant 'setle': bare, settle, peer"
    assert done.stdout == ""


def _post(port: int) -> int:
    """The status of one keyed POST of ``benchmarks.http``'s body, once the server answers."""
    headers = {
        "content-type": "application/json",
        "authorization": "Bearer sk_test_acme",
        "idempotency-key": uuid.uuid4().hex,
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{PATH}", data=BODY.encode(), headers=headers, method="POST"
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return int(response.status)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.mark.parametrize("variant", ["settle", "peer"])
def test_served_by_uvicorn_the_app_closes_its_redis_clients_when_the_server_stops(
    redis_url: str, variant: str
) -> None:
    """``python -m benchmarks._http_app VARIANT ...`` (the server docs/benchmarks.md
    drives with wrk): its lifespan closes the settler's or the store's Redis clients when
    uvicorn stops, so ``-X dev`` shows no unclosed connection at exit."""
    port = free_port()
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    app = ["benchmarks._http_app", variant, redis_url, str(port), namespace]
    server = subprocess.Popen(
        [sys.executable, "-X", "dev", "-m", *app],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert _post(port) == 201  # the app's Redis clients are open now
    finally:
        server.send_signal(signal.SIGINT)  # uvicorn's graceful stop: the lifespan ends
        _, err = server.communicate(timeout=60)
    assert server.returncode == 0, err[-3000:]
    assert "ResourceWarning" not in err, err[-3000:]
