"""inspect, quarantine ls/show/export and stats on the data a demo run left, in table and
JSON form, through the console script."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from settle import Settler
from settle.demo.plan import draw
from tests.cli.conftest import DEMO_OPS, DEMO_SEED, Demo, settle, settle_json

EXPECTED = draw(DEMO_OPS, DEMO_SEED, "x").injected()


@pytest.fixture(scope="module")
def entries(demo_data: Demo) -> list[dict[str, Any]]:
    assert demo_data.returncode == 0, demo_data.stderr
    found: list[dict[str, Any]] = settle_json("quarantine", "ls", *demo_data.args())
    return found


def test_stats_counts_records_by_state_and_quarantine_by_kind(demo_data: Demo) -> None:
    stats = settle_json("stats", *demo_data.args())
    assert stats["namespace"] == demo_data.namespace
    assert stats["shards"] == 4
    by_state = stats["records"]["by_state"]
    assert stats["records"]["total"] == DEMO_OPS
    assert by_state["failed"] == EXPECTED["declined"]
    assert by_state["completed"] == DEMO_OPS - EXPECTED["declined"]
    assert by_state["pending"] == by_state["provisional"] == 0
    kinds = stats["quarantine"]["by_kind"]
    assert kinds["stale_generation"] == {
        "unresolved": EXPECTED["late_stale_response"],
        "resolved": 0,
    }
    assert stats["quarantine"]["total"] == EXPECTED["late_stale_response"]
    assert all(
        v == {"unresolved": 0, "resolved": 0} for k, v in kinds.items() if k != "stale_generation"
    )

    table = settle("stats", *demo_data.args())
    assert table.returncode == 0, table.stderr
    assert "records in " + demo_data.namespace in table.stdout
    assert f"│ completed   │ {DEMO_OPS - EXPECTED['declined']:>7} │" in table.stdout
    assert "stale_generation" in table.stdout


def test_quarantine_ls_lists_the_late_stale_responses(
    demo_data: Demo, entries: list[dict[str, Any]]
) -> None:
    assert len(entries) == EXPECTED["late_stale_response"]
    for e in entries:
        assert e["kind"] == "stale_generation"
        assert e["action"] == "complete"
        assert e["ref"] == f"{e['shard']}/{e['id']}"
        assert e["presented"]["generation"] < e["current"]["generation"]
        assert e["current"]["state"] == "completed"
        assert e["resolution"] is None
        # the late response is the frozen worker's receipt: the provider deduplicated the
        # takeover's call, so it names the same charge the record committed
        record = settle_json("inspect", e["operation_id"], *demo_data.args())["record"]
        assert e["payload"]["json"]["charge_id"] == record["result_json"]["charge_id"]
        assert e["payload"]["size"] == len(json.dumps(e["payload"]["json"], separators=(",", ":")))
    ats = [e["at"] for e in entries]
    assert ats == sorted(ats, reverse=True)  # newest first

    table = settle("quarantine", "ls", *demo_data.args())
    assert table.returncode == 0, table.stderr
    for e in entries:
        assert e["ref"] in table.stdout
    assert table.stdout.count("stale_generation") == len(entries)


def test_quarantine_ls_filters(demo_data: Demo, entries: list[dict[str, Any]]) -> None:
    args = demo_data.args()
    assert settle_json("quarantine", "ls", "--kind", "misbound", *args) == []
    assert len(settle_json("quarantine", "ls", "--kind", "stale_generation", *args)) == len(entries)
    one = entries[-1]
    mine = settle_json("quarantine", "ls", "--operation", one["operation_id"], *args)
    assert [e["ref"] for e in mine] == [one["ref"]]
    assert len(settle_json("quarantine", "ls", "--limit", "1", *args)) == 1
    assert settle_json("quarantine", "ls", "--since", "2999-01-01T00:00:00Z", *args) == []
    assert len(settle_json("quarantine", "ls", "--since", "1d", *args)) == len(entries)
    # Before 1970 is "from the start" (Redis refuses a stream id before it).
    assert len(settle_json("quarantine", "ls", "--since", "1960-01-01", *args)) == len(entries)
    assert len(settle_json("quarantine", "ls", "--since", "100000000d", *args)) == len(entries)
    assert len(settle_json("quarantine", "ls", "--unresolved", *args)) == len(entries)
    empty = settle("quarantine", "ls", "--kind", "misbound", *args)
    assert empty.returncode == 0
    assert "no matching quarantine entries" in empty.stdout


def test_quarantine_show_by_ref_and_by_bare_id(
    demo_data: Demo, entries: list[dict[str, Any]]
) -> None:
    e = entries[0]
    assert settle_json("quarantine", "show", e["ref"], *demo_data.args()) == e
    assert settle_json("quarantine", "show", e["id"], *demo_data.args()) == e
    table = settle("quarantine", "show", e["ref"], *demo_data.args())
    assert table.returncode == 0, table.stderr
    for text in (e["ref"], e["operation_id"], "stale_generation", e["payload"]["sha256"]):
        assert text in table.stdout


def test_inspect_shows_tuple_attempt_log_and_quarantine(
    demo_data: Demo, entries: list[dict[str, Any]]
) -> None:
    e = entries[0]
    op = e["operation_id"]
    got = settle_json("inspect", op, *demo_data.args())
    record = got["record"]
    assert record["operation_id"] == op
    assert record["state"] == "completed"
    assert record["generation"] == e["current"]["generation"]
    assert record["version"] == e["current"]["version"]
    assert record["binding"] == e["presented"]["binding"]
    assert record["fingerprint"] == e["presented"]["fingerprint"]
    assert record["reservations"] == 2
    steps = [(a["action"], a["verdict"], a["detail"], a["generation"]) for a in got["attempts"]]
    old, new = e["presented"]["generation"], record["generation"]
    assert steps == [
        ("reserve", "reserved", "new", old),
        ("reserve", "reserved", "lease_expired", new),
        ("complete", "accepted", None, new),
        ("complete", "quarantined", "stale_generation", old),
    ]
    assert [q["ref"] for q in got["quarantine"]] == [e["ref"]]

    table = settle("inspect", op, *demo_data.args())
    assert table.returncode == 0, table.stderr
    for text in (f"operation {op}", "lease_expired", "stale_generation", e["ref"], "completed"):
        assert text in table.stdout


def test_inspect_an_operation_without_faults(demo_data: Demo) -> None:
    # the run tag differs per run: find the operations through the namespace's records
    stats_ops = _operation_ids(demo_data)
    plain = [o for o in draw(DEMO_OPS, DEMO_SEED, "x").orders if not o.faults]
    ops = [next(i for i in stats_ops if i.endswith(o.order_id.split("-", 1)[1])) for o in plain]
    # An operation with no injected fault still runs twice when the machine is so loaded that
    # its provider call outlives the demo's 0.5 s timeout or its worker misses a heartbeat for
    # the 1 s lease: settle working as it should. Inspect one the library reads as run once.
    with Settler.from_url(demo_data.url, namespace=demo_data.namespace, shards=4) as reader:
        once = [
            (order, op)
            for order, op in zip(plain, ops, strict=True)
            if [a.action for a in reader.attempts(op)] == ["reserve", "complete"]
        ]
    assert len(once) >= len(plain) // 2, (
        f"only {len(once)} of {len(plain)} plain operations ran once"
    )
    plain_order, op = once[0]
    got = settle_json("inspect", op, *demo_data.args())
    assert got["record"]["state"] == "completed"
    assert got["record"]["reservations"] == 1
    assert got["record"]["result_json"]["amount"] == plain_order.request.amount
    assert got["quarantine"] == []
    assert [a["action"] for a in got["attempts"]] == ["reserve", "complete"]


def _operation_ids(demo: Demo) -> list[str]:
    refs = settle_json("quarantine", "ls", *demo.args())
    run = refs[0]["operation_id"].split(":", 1)[1].rsplit("-", 1)[0]
    return [f"charge:{run}-{i + 1:04d}" for i in range(DEMO_OPS)]


def test_export_writes_json_lines_oldest_first(
    demo_data: Demo, entries: list[dict[str, Any]], tmp_path: Path
) -> None:
    done = settle("quarantine", "export", *demo_data.args())
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert lines == list(reversed(entries))
    target = tmp_path / "quarantine.jsonl"
    to_file = settle("quarantine", "export", "--output", str(target), *demo_data.args())
    assert to_file.returncode == 0, to_file.stderr
    assert to_file.stdout == ""
    assert target.read_text() == done.stdout
    assert f"exported {len(entries)} entries" in to_file.stderr
    only = settle("quarantine", "export", "--kind", "misbound", *demo_data.args())
    assert only.stdout == ""


def test_inspect_unknown_operation_exits_1(demo_data: Demo) -> None:
    done = settle("inspect", "charge:nope", *demo_data.args())
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"settle: no operation 'charge:nope' in namespace {demo_data.namespace!r}"
    )
    assert done.stdout == ""


def test_counts_agree_across_commands(demo_data: Demo, entries: list[dict[str, Any]]) -> None:
    stats = settle_json("stats", *demo_data.args())
    kinds = Counter(e["kind"] for e in entries)
    assert {
        k: v["unresolved"] for k, v in stats["quarantine"]["by_kind"].items() if v["unresolved"]
    } == dict(kinds)


def test_quarantine_ls_and_export_take_until_as_the_api_and_console_do(
    demo_data: Demo, entries: list[dict[str, Any]]
) -> None:
    """``quarantine.list(until=...)`` and the console's window have an end; the CLI had
    only ``--since``, so an operator reconciling one past day exported everything after
    it. ``--until`` takes what ``--since`` takes (a time, or a duration ago on the server's
    clock) and keeps the entries up to it, that instant included."""
    args = demo_data.args()
    oldest = entries[-1]
    upto = settle_json("quarantine", "ls", "--until", oldest["at"], *args)
    assert oldest["ref"] in [e["ref"] for e in upto]
    assert all(e["at"] <= oldest["at"] for e in upto)
    assert settle_json("quarantine", "ls", "--until", "1960-01-01", *args) == []
    assert len(settle_json("quarantine", "ls", "--until", "2999-01-01", *args)) == len(entries)
    assert settle_json("quarantine", "ls", "--since", "1d", "--until", "1d", *args) == []
    assert len(settle_json("quarantine", "ls", "--until", "0s", *args)) == len(entries)
    done = settle("quarantine", "export", "--until", oldest["at"], *args)
    assert done.returncode == 0, done.stderr
    exported = [json.loads(line) for line in done.stdout.splitlines()]
    assert [e["ref"] for e in exported] == [e["ref"] for e in reversed(upto)]
    none = settle("quarantine", "export", "--until", "1960-01-01", *args)
    assert none.returncode == 0, none.stderr
    assert none.stdout == ""
