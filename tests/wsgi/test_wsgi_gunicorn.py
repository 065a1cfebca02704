"""The Django (REST framework) and the Flask shop under a real gunicorn, on a real Redis.

Every run of a guarded handler is counted in Redis by the shop's probe (``shop/probe.py``),
outside the server's processes, so the counts survive a killed server.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.wsgi.servers import Gunicorn, connect, read_answer

CRASH_LEASE = 8.0

PAYMENT = {"amount": 4200, "currency": "EUR", "customer": "cus_1"}


def headers(key: str, token: str = "sk_test_acme") -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Idempotency-Key": f'"{key}"'}


def runs(redis_client: redis.Redis, namespace: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in redis_client.lrange(f"{namespace}:runs", 0, -1)]


def test_a_replay_is_byte_identical(
    shop: Gunicorn, redis_client: redis.Redis, namespace: str
) -> None:
    key = str(uuid.uuid4())
    first = httpx.post(f"{shop.url}/payments", json=PAYMENT, headers=headers(key))
    again = httpx.post(f"{shop.url}/payments", json=PAYMENT, headers=headers(key))
    assert first.status_code == again.status_code == 201
    assert again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"
    assert again.headers["location"] == first.headers["location"]
    assert again.headers["content-type"] == first.headers["content-type"]
    assert first.json()["generation"] >= 1
    assert len(runs(redis_client, namespace)) == 1


def test_fifty_concurrent_requests_with_one_key_run_the_view_once(
    shop: Gunicorn, redis_client: redis.Redis, namespace: str
) -> None:
    key = str(uuid.uuid4())
    redis_client.set(f"{namespace}:hold", 1)  # the first run holds: the others arrive meanwhile
    release = threading.Timer(1.0, redis_client.delete, [f"{namespace}:hold"])
    limits = httpx.Limits(max_connections=50)
    with httpx.Client(base_url=shop.url, limits=limits, timeout=30) as client:
        release.start()
        with ThreadPoolExecutor(50) as pool:
            answers = list(
                pool.map(
                    lambda _: client.post("/payments", json=PAYMENT, headers=headers(key)),
                    range(50),
                )
            )
        release.join()
        later = client.post("/payments", json=PAYMENT, headers=headers(key))
    assert len(runs(redis_client, namespace)) == 1
    fresh = [a for a in answers if a.status_code == 201 and "idempotent-replayed" not in a.headers]
    assert len(fresh) == 1
    for answer in [*answers, later]:
        if answer.status_code == 409:
            assert answer.headers["retry-after"] == "1"
            assert answer.json()["type"] == "urn:settle:problem:request-in-progress"
        else:
            assert answer.status_code == 201
            assert answer.content == fresh[0].content
    assert sum(a.status_code == 409 for a in answers) >= 1
    assert later.headers["idempotent-replayed"] == "true"


def test_a_changed_body_is_422(shop: Gunicorn, redis_client: redis.Redis, namespace: str) -> None:
    key = str(uuid.uuid4())
    assert httpx.post(f"{shop.url}/payments", json=PAYMENT, headers=headers(key)).status_code == 201
    changed = httpx.post(
        f"{shop.url}/payments", json={**PAYMENT, "amount": 1}, headers=headers(key)
    )
    assert changed.status_code == 422
    assert changed.headers["content-type"] == "application/problem+json"
    assert changed.json()["type"] == "urn:settle:problem:idempotency-key-reused"
    assert len(runs(redis_client, namespace)) == 1


def test_two_tenants_never_see_each_others_responses(
    shop: Gunicorn, redis_client: redis.Redis, namespace: str
) -> None:
    key = str(uuid.uuid4())
    acme = httpx.post(f"{shop.url}/payments", json=PAYMENT, headers=headers(key))
    umbrella = httpx.post(
        f"{shop.url}/payments", json=PAYMENT, headers=headers(key, "sk_test_umbrella")
    )
    assert acme.status_code == umbrella.status_code == 201
    assert umbrella.json()["id"] != acme.json()["id"]
    assert "idempotent-replayed" not in umbrella.headers
    nobody = httpx.post(f"{shop.url}/payments", json=PAYMENT, headers=headers(key, "sk_bad"))
    assert nobody.status_code == 401
    again = httpx.post(
        f"{shop.url}/payments", json=PAYMENT, headers=headers(key, "sk_test_umbrella")
    )
    assert again.content == umbrella.content
    assert len(runs(redis_client, namespace)) == 2


@pytest.mark.parametrize("framework", ["django", "flask"])
def test_a_killed_server_is_taken_over_under_a_new_generation_after_the_lease(
    framework: str, redis_url: str, redis_client: redis.Redis, namespace: str, tmp_path: Path
) -> None:
    # The server the retries reach is up before the kill (a restart's start-up counted in
    # the lease: Django's took 8.8 s beside four busy loops, and the 409 was never seen).
    shop = Gunicorn(framework, redis_url, namespace, CRASH_LEASE, tmp_path / "gunicorn.log")
    restarted = shop.twin()
    try:
        shop.start()
        restarted.start()
        _kill_and_take_over(shop, restarted, redis_client, namespace)
    finally:
        shop.stop()
        restarted.stop()


def _kill_and_take_over(
    shop: Gunicorn, restarted: Gunicorn, redis_client: redis.Redis, namespace: str
) -> None:
    """``shop`` is killed mid-request; the client's retries go to ``restarted`` (already up,
    as after a restart: a server's start-up is no part of what is tested)."""
    key = str(uuid.uuid4())
    redis_client.set(f"{namespace}:hold", 1)
    lost: list[BaseException] = []

    def first_request() -> None:
        try:
            httpx.post(f"{shop.url}/payments", json=PAYMENT, headers=headers(key), timeout=30)
        except httpx.TransportError as exc:
            lost.append(exc)

    client_thread = threading.Thread(target=first_request)
    client_thread.start()
    deadline = time.monotonic() + 10
    while not runs(redis_client, namespace) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(runs(redis_client, namespace)) == 1  # the view is running, held
    shop.kill()
    killed_at = time.monotonic()
    client_thread.join(10)
    assert lost, "the client of the killed server got no response"
    redis_client.delete(f"{namespace}:hold")

    busy = httpx.post(f"{restarted.url}/payments", json=PAYMENT, headers=headers(key))
    assert time.monotonic() - killed_at < CRASH_LEASE, "the retry came a whole lease late"
    assert busy.status_code == 409  # the dead attempt still holds its lease
    assert busy.headers["retry-after"] == "1"
    time.sleep(max(0.0, killed_at + CRASH_LEASE + 0.2 - time.monotonic()))
    taken_over = httpx.post(f"{restarted.url}/payments", json=PAYMENT, headers=headers(key))
    assert taken_over.status_code == 201
    first_run, second_run = runs(redis_client, namespace)
    assert second_run["generation"] > first_run["generation"]
    assert taken_over.json()["generation"] == second_run["generation"]
    replay = httpx.post(f"{restarted.url}/payments", json=PAYMENT, headers=headers(key))
    assert replay.content == taken_over.content
    assert len(runs(redis_client, namespace)) == 2


@pytest.mark.parametrize("shop", ["django"], indirect=True)
def test_django_view_decorator_and_rest_framework_validation(
    shop: Gunicorn, redis_client: redis.Redis, namespace: str
) -> None:
    """``@idempotent`` guards a view the middleware does not cover; a REST framework 400
    (a finished answer) is stored and replayed, not run again."""
    key = str(uuid.uuid4())
    refund = httpx.post(f"{shop.url}/refunds/ch_1", json={}, headers=headers(key))
    assert refund.status_code == 201
    assert refund.json()["payment"] == "ch_1"
    again = httpx.post(f"{shop.url}/refunds/ch_1", json={}, headers=headers(key))
    assert again.content == refund.content
    assert again.headers["idempotent-replayed"] == "true"
    no_key = httpx.post(
        f"{shop.url}/refunds/ch_1", json={}, headers=headers(key) | {"Idempotency-Key": ""}
    )
    assert no_key.status_code == 400

    bad = {**PAYMENT, "currency": "euro"}
    invalid = httpx.post(f"{shop.url}/payments", json=bad, headers=headers("bad-1"))
    assert invalid.status_code == 400
    assert "currency" in invalid.json()
    replayed = httpx.post(f"{shop.url}/payments", json=bad, headers=headers("bad-1"))
    assert replayed.content == invalid.content
    assert replayed.headers["idempotent-replayed"] == "true"
    # The probe middleware runs before a view decorator sets request.settle: it counts only
    # the middleware's runs. The refund's random id, replayed, shows that it ran once.
    assert [r["path"] for r in runs(redis_client, namespace)] == ["/payments"]


def test_a_view_that_crashes_is_run_again_under_a_new_generation(
    shop: Gunicorn, redis_client: redis.Redis, namespace: str
) -> None:
    """Django (an ``@idempotent`` view) and Flask turn the exception into a 500: the attempt
    is provisional and the retry runs the view again."""
    path = "/flaky" if shop.framework == "django" else "/payments/flaky"
    key = str(uuid.uuid4())
    crashed = httpx.post(f"{shop.url}{path}", json={}, headers=headers(key))
    assert crashed.status_code == 500
    retried = httpx.post(f"{shop.url}{path}", json={}, headers=headers(key))
    assert retried.status_code == 201
    assert retried.json() == {"run": 2}
    replay = httpx.post(f"{shop.url}{path}", json={}, headers=headers(key))
    assert replay.content == retried.content
    assert replay.headers["idempotent-replayed"] == "true"
    first, second = runs(redis_client, namespace)
    assert second["generation"] > first["generation"]


def test_a_client_that_stops_sending_mid_body_runs_nothing_and_is_no_error(
    shop: Gunicorn, redis_client: redis.Redis, namespace: str
) -> None:
    """The client sends 10 of its body's bytes and closes its sending side. Found in
    review: under Flask settle raised ClientDisconnected into gunicorn, which logged
    ``[ERROR] Error handling request`` with a traceback and answered its own 500; Django
    ran the view on the 10 bytes and stored its 400, so the whole request sent again got
    422. Now the client gets a 400 ``request-incomplete`` problem, gunicorn logs no error,
    nothing runs, and the whole request sent again with the key runs once."""
    key = str(uuid.uuid4())
    body = json.dumps(PAYMENT).encode()
    with connect(shop.url) as sock:
        sock.sendall(
            b"POST /payments HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b'Authorization: Bearer sk_test_acme\r\nIdempotency-Key: "%s"\r\n'
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (key.encode(), len(body), body[:10])
        )
        sock.shutdown(socket.SHUT_WR)
        status, problem = read_answer(sock)
    assert status.endswith(b" 400 Bad Request"), (status, problem)
    assert json.loads(problem)["type"] == "urn:settle:problem:request-incomplete"
    assert runs(redis_client, namespace) == []
    typed = {**headers(key), "Content-Type": "application/json"}
    whole = httpx.post(f"{shop.url}/payments", content=body, headers=typed)
    assert whole.status_code == 201, whole.text
    assert "idempotent-replayed" not in whole.headers
    assert len(runs(redis_client, namespace)) == 1
    assert "[ERROR]" not in shop.log.read_text()


@pytest.mark.parametrize("framework", ["django", "flask"])
def test_a_view_past_the_worker_timeout_is_neither_held_nor_stored(
    framework: str, redis_url: str, redis_client: redis.Redis, namespace: str, tmp_path: Path
) -> None:
    """A sync worker whose view runs past gunicorn's ``--timeout`` is aborted mid-request
    (SIGABRT: ``SystemExit`` raised in the view). The attempt is left provisional at once
    (neither held for a whole lease nor stored as a success), and the retry runs the view
    again under a newer generation."""
    sync = ("--worker-class", "sync", "--workers", "1", "--timeout", "2")
    log = tmp_path / "gunicorn.log"
    shop = Gunicorn(framework, redis_url, namespace, CRASH_LEASE, log, workers=sync).start()
    try:
        key = str(uuid.uuid4())
        redis_client.set(f"{namespace}:hold", 1)  # the view runs until the worker is killed
        try:
            killed = httpx.post(
                f"{shop.url}/payments", json=PAYMENT, headers=headers(key), timeout=30
            )
            assert killed.status_code == 500
        except httpx.TransportError:
            pass  # the worker died before it could answer: as good for the client
        redis_client.delete(f"{namespace}:hold")
        started = time.monotonic()
        retried = httpx.post(f"{shop.url}/payments", json=PAYMENT, headers=headers(key))
        assert retried.status_code == 201, retried.text  # not a 409: nothing holds the key
        assert time.monotonic() - started < CRASH_LEASE
        assert "idempotent-replayed" not in retried.headers
        first, second = runs(redis_client, namespace)
        assert second["generation"] > first["generation"]
        assert retried.json()["generation"] == second["generation"]
        assert "WORKER TIMEOUT" in log.read_text()
    finally:
        redis_client.delete(f"{namespace}:hold")
        shop.stop()
