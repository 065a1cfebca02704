"""``settle cursor show|witnesses`` run as a real process against a real Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from settle.cursor import CursorConsumer, CursorStore, Event, EventContext, ProviderContract
from settle.embedded import free_port
from tests.cli.helpers import in_terminal
from tests.cursor.helpers import Crash
from tests.cursor.provider import fetcher

ROOT = Path(__file__).resolve().parents[2]


def cli(redis_url: str, namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SETTLE_REDIS_URL": redis_url, "SETTLE_NAMESPACE": namespace}
    env["COLUMNS"] = "200"
    return subprocess.run(
        [sys.executable, "-m", "settle.cli.cursor", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


@pytest.fixture
def stream_with_history(serve, store: CursorStore, http, sink):
    server = serve(page_size=2, rotate=True)
    server.provider.append(3)
    fetch = fetcher(server.url, http)
    started = store.start("orders", b"secret-start-token-" + server.provider.token(0).encode())
    store.reset(
        "orders",
        cursor=server.provider.token(0).encode(),
        boundary=0,
        expected_generation=started.generation,
    )

    def crash_on_e2(event: Event, ctx: EventContext) -> None:
        if event.id == "e2":
            raise Crash
        sink(event, ctx)

    contract = ProviderContract(rotation_allowed=True)
    with pytest.raises(Crash):
        CursorConsumer(fetch, crash_on_e2, contract, store=store, stream="orders").step()
    CursorConsumer(fetch, sink, contract, store=store, stream="orders").step()
    return store


def test_show_json_gives_digest_never_the_cursor(stream_with_history, redis_url, namespace):
    ck = stream_with_history.checkpoint("orders")
    proc = cli(redis_url, namespace, "show", "orders", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["generation"] == ck.generation
    # One promotion after the response witnessed (and resumed) at the generation before.
    assert ck.generation == max(w.generation for w in stream_with_history.witnesses("orders")) + 1
    assert data["boundary"] == 2
    assert data["cursor_digest"] == ck.cursor_digest
    assert ck.cursor.decode() not in proc.stdout


def test_show_table(stream_with_history, redis_url, namespace):
    proc = cli(redis_url, namespace, "show", "orders")
    assert proc.returncode == 0, proc.stderr
    assert "generation" in proc.stdout
    assert "boundary" in proc.stdout
    assert "secret-start-token" not in proc.stdout


def test_witnesses_json_lists_dispositions(stream_with_history, redis_url, namespace):
    proc = cli(redis_url, namespace, "witnesses", "orders", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert sorted(r["disposition"] for r in rows) == ["abandoned", "promoted"]
    assert {r["classification"] for r in rows} == {"first", "token_rotation"}
    for r in rows:
        assert r["events"] == [["e1", 1, r["events"][0][2]], ["e2", 2, r["events"][1][2]]]
        assert "successor" not in r


def test_witnesses_table(stream_with_history, redis_url, namespace):
    proc = cli(redis_url, namespace, "witnesses", "orders")
    assert proc.returncode == 0, proc.stderr
    assert "promoted" in proc.stdout
    assert "abandoned" in proc.stdout
    assert "token_rotation" in proc.stdout


def test_unknown_stream_is_an_error(redis_url, namespace):
    proc = cli(redis_url, namespace, "show", "nope")
    assert proc.returncode == 1
    assert "no checkpoint" in proc.stderr
    bad = cli(redis_url, namespace, "witnesses", "a{b}")
    assert bad.returncode == 2  # a name settle refuses is bad input (usage), not a missing stream
    assert "braces" in bad.stderr


def test_unreachable_redis_exits_3(namespace):
    url = f"redis://127.0.0.1:{free_port()}/0"
    proc = cli(url, namespace, "show", "orders")
    assert proc.returncode == 3
    # What was asked for, not the script that ran ("Redis failed during witnesses").
    assert f"cannot reach Redis at {url} to read the checkpoint of stream 'orders'" in proc.stderr


def test_options_on_the_command_override_the_environment(stream_with_history, redis_url):
    proc = cli(redis_url, "other-namespace", "show", "orders", "--json")
    assert proc.returncode == 1
    ns = stream_with_history.core.namespace
    proc = cli(redis_url, "other-namespace", "show", "orders", "--namespace", ns, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["stream"] == "orders"


def test_an_80_column_terminal_shows_generations_and_digests_whole(
    stream_with_history, redis_url, namespace
):
    """At 80 columns rich cut the 16-digit generations to ``17964…`` (and the cursor digest
    to ``d0f6…``): nothing a user could copy into ``reset --expected-generation``."""
    env = {**os.environ, "SETTLE_REDIS_URL": redis_url, "SETTLE_NAMESPACE": namespace}
    ck = stream_with_history.checkpoint("orders")
    found = stream_with_history.witnesses("orders")
    assert len(str(ck.generation)) == 16
    cmd = [sys.executable, "-c", "from settle.cli import main; main()", "cursor"]
    listed = in_terminal([*cmd, "witnesses", "orders"], env)
    assert max(len(line) for line in listed.splitlines()) <= 80, listed
    for w in found:
        assert str(w.generation) in listed, listed
        assert w.attempt_id[:12] in listed, listed
        assert w.successor_digest[:16] in listed, listed
    shown = in_terminal([*cmd, "show", "orders"], env)
    assert max(len(line) for line in shown.splitlines()) <= 80, shown
    for whole in (str(ck.generation), ck.cursor_digest, str(ck.promoted_witness)):
        assert whole in shown, shown


def test_a_60_column_terminal_shows_generations_and_digests_whole(
    stream_with_history, redis_url, namespace
):
    """At 60 columns the witnesses' table needed more than the terminal even with every
    other column folded to nothing, and a 64-digit digest is wider than the terminal itself:
    each is printed whole, the digest on a line of its own for the terminal to wrap."""
    env = {**os.environ, "SETTLE_REDIS_URL": redis_url, "SETTLE_NAMESPACE": namespace}
    ck = stream_with_history.checkpoint("orders")
    found = stream_with_history.witnesses("orders")
    cmd = [sys.executable, "-c", "from settle.cli import main; main()", "cursor"]
    listed = in_terminal([*cmd, "witnesses", "orders"], env, columns=60)
    assert "…" not in listed, listed
    assert max(len(line) for line in listed.splitlines()) <= 60, listed
    for w in found:
        for whole in (str(w.generation), w.attempt_id[:12], w.successor_digest[:16]):
            assert whole in listed, listed
        assert w.disposition.value in listed, listed
    shown = in_terminal([*cmd, "show", "orders"], env, columns=60)
    lines = shown.splitlines()
    assert all(len(line) <= 60 or line == ck.cursor_digest for line in lines), shown
    for whole in (str(ck.generation), ck.cursor_digest, str(ck.promoted_witness)):
        assert any(whole in line for line in lines), shown


def test_a_long_stream_name_leaves_the_field_names_in_an_80_column_terminal(
    store: CursorStore, redis_url, namespace
):
    """The value column of ``cursor show`` was kept as wide as its widest cell: a stream name
    of 100 characters or more (up to 256 are allowed) took the whole terminal, the field
    column shrank to nothing (no ``generation``, no ``cursor_digest`` label) and the table's
    right edge was cut off. Every field name is there, whole, with its value; the digest and
    generation stay whole, and so does the name: on a line of its own, never broken (the
    terminal wraps it, and copies it back as one line), where it was folded at 64 columns
    between table borders."""
    stream = "orders-" + "x" * 113
    ck = store.start(stream, b"first-cursor")
    env = {**os.environ, "SETTLE_REDIS_URL": redis_url, "SETTLE_NAMESPACE": namespace}
    cmd = [sys.executable, "-c", "from settle.cli import main; main()", "cursor"]
    shown = in_terminal([*cmd, "show", stream], env)
    lines = shown.splitlines()
    assert all(len(line) <= 80 or line == stream for line in lines), shown
    assert lines.count(stream) == 2, shown  # the title's and the stream field's
    labels = [line.split(":", 1)[0] for line in lines if line[:1].isalpha() and ":" in line]
    assert labels == [
        "stream",
        "cursor_digest",
        "cursor_bytes",
        "generation",
        "boundary",
        "promoted_witness",
        "created_at",
        "updated_at",
    ], shown
    assert any(line.strip() == ck.cursor_digest for line in lines), shown
    assert f"generation:       {ck.generation}" in lines, shown


@pytest.mark.parametrize("columns", [80, 60])
def test_a_stream_name_with_spaces_is_whole_in_the_titles(
    store: CursorStore, redis_url, namespace, columns
):
    """Stream names may hold spaces: ``checkpoint of <stream>`` and ``witnesses of
    <stream>`` were wrapped at them, half the name on each line. The name is whole on a line
    of its own now, in the title as in the ``stream`` field."""
    stream = "orders of merchant m5 in eu-west-1: refunds, chargebacks and payouts"
    ck = store.start(stream, b"first-cursor")
    env = {**os.environ, "SETTLE_REDIS_URL": redis_url, "SETTLE_NAMESPACE": namespace}
    cmd = [sys.executable, "-c", "from settle.cli import main; main()", "cursor"]
    shown = in_terminal([*cmd, "show", stream], env, columns)
    lines = [line.strip() for line in shown.splitlines()]
    assert lines.count(stream) == 2, shown  # the title's and the stream field's
    listed = in_terminal([*cmd, "witnesses", stream], env, columns)
    assert stream in [line.strip() for line in listed.splitlines()], listed
    for out in (shown, listed):
        wider = (stream, ck.cursor_digest)  # a line of its own each, the terminal wraps it
        assert all(len(line) <= columns or line in wider for line in out.splitlines()), out
