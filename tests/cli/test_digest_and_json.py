"""``settle digest`` gives the digests settle's log lines carry in place of operation ids
and principals (SPEC 12), and every read command takes ``--json`` (SPEC 8). Through the
installed console script, against the session's real redis-server."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import subprocess
import sys
from pathlib import Path

from settle import Reserved, Settler
from tests.cli.conftest import cli_env, settle
from tests.cli.helpers import stale_settlement

SECRET = "a-deployment-secret"


def _logged_digests(
    redis_url: str, namespace: str, operation_id: str, key: str | bytes = SECRET
) -> list[str]:
    """The operation_digest of every line a fresh process logs for one operation, under
    SETTLE_DIGEST_KEY (a fresh process: the key is read once per process)."""
    code = f"""
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
from settle import Settler
s = Settler.from_url({redis_url!r}, namespace={namespace!r})
r = s.reserve({operation_id!r}, {{"amount": 1}}, principal="tenant:acme")
s.complete(r.reservation, {{"ok": True}})
s.close()
"""
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=cli_env(SETTLE_DIGEST_KEY=key),  # type: ignore[arg-type]
        timeout=60,
        check=True,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("settle.")]
    assert lines, done.stderr
    assert all(operation_id not in line for line in lines), lines
    return [
        part.split("=", 1)[1].strip("'")
        for line in lines
        for part in line.split()
        if part.startswith("operation_digest=")
    ]


def test_digest_names_the_log_lines_of_an_operation(redis_url: str, namespace: str) -> None:
    op = "order-8812-of-customer-77"
    logged = _logged_digests(redis_url, namespace, op)
    assert len(logged) == 2  # reserved, accepted
    done = settle("digest", op, env=cli_env(SETTLE_DIGEST_KEY=SECRET))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"operation_digest={logged[0]}"
    assert set(logged) == {logged[0]}
    as_json = settle(
        "digest", op, "--principal", "tenant:acme", "--json", env=cli_env(SETTLE_DIGEST_KEY=SECRET)
    )
    rows = json.loads(as_json.stdout)
    assert [r["field"] for r in rows] == ["operation_digest", "binding_digest"]
    assert rows[0]["digest"] == logged[0]


def test_a_digest_key_that_is_not_utf8_digests_as_its_bytes(redis_url: str, namespace: str) -> None:
    # A secret of random bytes in the environment: every digest (settle digest, and the
    # first log line of an application) ended in a UnicodeEncodeError traceback.
    key = b"\xff\xfe-random-secret-\x80"
    op = "order-8813"
    logged = _logged_digests(redis_url, namespace, op, key=key)
    done = settle("digest", op, env=cli_env(SETTLE_DIGEST_KEY=key))  # type: ignore[arg-type]
    assert done.returncode == 0, done.stderr
    expected = hmac.new(key, b"op\0" + op.encode(), hashlib.sha256).hexdigest()[:16]
    assert done.stdout == f"operation_digest={expected}\n"
    assert set(logged) == {expected}


def test_digest_of_a_value_that_is_not_utf8_is_a_usage_error() -> None:
    # The shell passes bytes of another encoding as they are: the digest could not be
    # computed, a UnicodeEncodeError traceback. No id settle stores holds them.
    env = cli_env(SETTLE_DIGEST_KEY=SECRET)
    for args, name in [
        ((b"order-\xe9",), "OPERATION_ID"),
        (("order-1", "--principal", b"caf\xe9"), "--principal"),
        (("--emission", b"\xff"), "--emission"),
        (("--event", b"e\xff"), "--event"),
    ]:
        done = settle("digest", *args, env=env)  # type: ignore[arg-type]
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(f"settle: bad {name} '"), done.stderr
        assert done.stderr.endswith("': it holds bytes that are not UTF-8 text\n"), done.stderr
        assert done.stdout == ""


def test_digest_without_the_deployment_secret_is_refused() -> None:
    done = settle("digest", "order-1")
    assert done.returncode == 2
    assert "SETTLE_DIGEST_KEY" in done.stderr
    assert done.stdout == ""


def test_every_read_command_takes_json(redis_url: str, cli_settler: Settler) -> None:
    qid = stale_settlement(cli_settler, "charge:json-1")
    conn = ("--redis-url", redis_url, "--namespace", cli_settler.config.namespace)
    for args in (
        ("stats",),
        ("inspect", "charge:json-1"),
        ("quarantine", "ls"),
        ("quarantine", "show", qid),
        ("quarantine", "export"),
    ):
        done = settle(*args, *conn, "--json")
        assert done.returncode == 0, (args, done.stderr)
        text = done.stdout.strip()
        values = (
            [json.loads(line) for line in text.splitlines()]
            if args[-1] == "export"
            else [json.loads(text)]
        )
        assert values, args


def test_the_docs_example_is_what_the_command_prints() -> None:
    done = settle(
        "digest",
        "charge:26e120-0032",
        "--principal",
        "merchant:m2",
        env=cli_env(SETTLE_DIGEST_KEY="example-secret"),
    )
    assert done.returncode == 0, done.stderr
    docs = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text(encoding="utf-8")
    assert done.stdout in docs
    assert done.stdout.splitlines() == [
        "operation_digest=2b0d78f78a61828c",
        "binding_digest=56f259612ca6",
    ]


def test_digest_names_the_log_lines_of_an_emission_and_an_event(
    redis_url: str, namespace: str
) -> None:
    """Delivery progress logs an emission id only as ``emission_digest`` and cursor
    checkpoints an event id only as ``event_digest``: ``settle digest --emission / --event``
    prints what to search for, under the deployment's SETTLE_DIGEST_KEY."""
    code = f"""
import logging, sys
import redis
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
from settle.cursor import CursorConsumer, CursorStore, Event, Page, ProviderContract
from settle.progress import ProgressStore, StreamConsumer
url, ns = {redis_url!r}, {namespace!r}
store = ProgressStore.from_url(url, consumer="billing", namespace=ns)
consumer = StreamConsumer(redis.Redis.from_url(url), store, stream=ns + "-orders", group="g")
consumer.start()
redis.Redis.from_url(url).xadd(ns + "-orders", {{"emission_id": "EMISSION-77"}})
consumer.poll(lambda ctx: None)
cursors = CursorStore.from_url(url, namespace=ns)
cursors.start("ledger", b"c0")
fetch = lambda cursor: Page([Event("EVENT-88", 1)], b"c1")
handle = lambda e, ctx: None
CursorConsumer(fetch, handle, ProviderContract(), store=cursors, stream="ledger").step()
"""
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=cli_env(SETTLE_DIGEST_KEY=SECRET),
        timeout=60,
        check=True,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("settle.")]
    assert lines, done.stderr
    assert not any("EMISSION-77" in line or "EVENT-88" in line for line in lines), lines
    fields = {
        part.split("=", 1)[0]: part.split("=", 1)[1].strip("'")
        for line in lines
        for part in line.split()
        if part.startswith(("emission_digest=", "event_digest="))
    }
    printed = settle(
        "digest",
        "--emission",
        "EMISSION-77",
        "--event",
        "EVENT-88",
        env=cli_env(SETTLE_DIGEST_KEY=SECRET),
    )
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.splitlines() == [
        f"emission_digest={fields['emission_digest']}",
        f"event_digest={fields['event_digest']}",
    ]


def test_a_truncated_payload_is_not_shown_as_json(redis_url: str, namespace: str) -> None:
    """Found in review: ``payload.json`` decoded the kept bytes of a truncated payload, so a
    payload whose first 256 bytes parse (``{"a": 1}`` and spaces, then more) was exported as
    the JSON ``{"a": 1}``: a value the response never was (the whole payload is no JSON at
    all). A truncated payload's ``json`` is null; its kept bytes are in ``data``."""
    writer = Settler.from_url(redis_url, namespace=namespace, quarantine_payload_bytes=256)
    try:
        r = writer.reserve("charge:cut-1", {"amount": 1}, principal="tenant:acme", lease=5)
        assert isinstance(r, Reserved)
        writer.complete(r.reservation, {"charge_id": "ch_1"})
        late = writer.complete(r.reservation, b'{"a": 1}' + b" " * 300 + b"and more")
        assert late.quarantine_id is not None
    finally:
        writer.close()
    conn = ("--redis-url", redis_url, "--namespace", namespace, "--json")
    shown = json.loads(settle("quarantine", "show", late.quarantine_id, *conn).stdout)
    exported = [
        json.loads(line) for line in settle("quarantine", "export", *conn).stdout.splitlines()
    ]
    for entry in (shown, exported[0]):
        assert entry["payload"]["truncated"] is True
        assert entry["payload"]["json"] is None
        assert base64.b64decode(entry["payload"]["data"]) == b'{"a": 1}' + b" " * 248
