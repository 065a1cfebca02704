"""``settle stats`` counts the quarantine from headers (kind, time, status), never from whole
entries: the same counts by kind and resolution, and Redis sends no payload for them.

It read every entry with its payload (up to ``quarantine_payload_bytes``, 64 KiB, each) only
to count it: on 100,000 entries of 64 KiB, gigabytes over the wire and through the CLI's
memory for a table of ten numbers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from settle import Settler
from settle._core.keys import shard_of
from settle.embedded import EmbeddedRedis
from settle.models import QuarantineKind
from tests.cli.conftest import settle, settle_json
from tests.cli.helpers import bytes_sent, stale_settlement
from tests.web.evidence import conflicting, ghost_of, misbound, unknown

#: The payload of each entry of the cost test, and how many entries it writes.
PAYLOAD = 60 << 10
ENTRIES = 200
SHARDS = 16


def _args(url: str, namespace: str) -> tuple[str, ...]:
    return ("--redis-url", url, "--namespace", namespace)


def _counted(settler: Settler) -> dict[str, dict[str, int]]:
    """The quarantine by kind and resolution, counted from whole entries (what ``settle
    stats`` printed before it read headers)."""
    kinds = {k.value: {"unresolved": 0, "resolved": 0} for k in QuarantineKind}
    for e in settler.quarantine.scan():
        kinds[e.kind.value]["resolved" if e.resolution else "unresolved"] += 1
    return kinds


def _one_a_shard(prefix: str, shards: int) -> list[str]:
    """An operation id on each of ``shards`` shards."""
    ops: dict[int, str] = {}
    n = 0
    while len(ops) < shards:
        ops.setdefault(shard_of(f"{prefix}-{n}", shards), f"{prefix}-{n}")
        n += 1
    return [ops[s] for s in range(shards)]


def test_stats_counts_every_kind_and_resolution_on_every_shard(
    redis_url: str, namespace: str, cli_settler: Settler
) -> None:
    s = cli_settler
    refs: dict[QuarantineKind, list[str]] = {
        QuarantineKind.MISBOUND: [
            misbound(s, f"order-mb-{n}", "tenant:other", {"n": n}) for n in range(3)
        ],
        QuarantineKind.CONFLICTING_SETTLEMENT: [conflicting(s, f"order-cf-{n}") for n in range(4)],
        QuarantineKind.UNKNOWN_OPERATION: [unknown(s, op) for op in _one_a_shard("order-un", 4)]
        + [unknown(s, "order-un-extra")],
        QuarantineKind.STALE_GENERATION: [stale_settlement(s, f"order-st-{n}") for n in range(2)],
    }
    resolved = {
        QuarantineKind.MISBOUND: 1,
        QuarantineKind.CONFLICTING_SETTLEMENT: 4,
        QuarantineKind.UNKNOWN_OPERATION: 2,
        QuarantineKind.STALE_GENERATION: 0,
    }
    for kind, n in resolved.items():
        for ref in refs[kind][:n]:
            s.quarantine.resolve(ref, note="looked at")
    every = [ref for kind_refs in refs.values() for ref in kind_refs]
    assert len({ref.split("/")[0] for ref in every}) == s.config.shards  # every shard holds some

    report = settle_json("stats", *_args(redis_url, namespace))

    want = {k.value: {"unresolved": 0, "resolved": 0} for k in QuarantineKind}
    for kind, kind_refs in refs.items():
        want[kind.value] = {
            "unresolved": len(kind_refs) - resolved[kind],
            "resolved": resolved[kind],
        }
    assert report["quarantine"]["by_kind"] == want == _counted(s)
    assert report["quarantine"]["total"] == len(every) == 14
    assert report["quarantine"]["unresolved"] == 14 - 7
    table = settle("stats", *_args(redis_url, namespace))
    assert table.returncode == 0, table.stderr
    assert "│ misbound               │          2 │        1 │" in table.stdout
    assert "│ conflicting_settlement │          0 │        4 │" in table.stdout
    assert "│ unknown_operation      │          3 │        2 │" in table.stdout
    assert "│ stale_generation       │          2 │        0 │" in table.stdout
    assert "│ version_conflict       │          0 │        0 │" in table.stdout
    assert "│ total                  │          7 │        7 │" in table.stdout


@pytest.fixture
def own_server() -> Iterator[str]:
    """A redis-server of this test's own: nobody else's traffic in its byte counts."""
    with EmbeddedRedis() as server:
        yield server.url


def test_stats_reads_no_quarantine_payload(own_server: str) -> None:
    # 200 entries of 60 KiB on 16 shards: stats read all 12 MB of payloads to count them.
    namespace = "costly"
    with Settler.from_url(own_server, namespace=namespace, shards=SHARDS) as s:
        s.check()
        refs = []
        for n in range(ENTRIES):
            settled = s.complete(ghost_of(str(n)), b"x" * PAYLOAD)
            assert settled.quarantine_id is not None
            refs.append(settled.quarantine_id)
        assert len({shard_of(f"ghost-{n}", SHARDS) for n in range(ENTRIES)}) == SHARDS
        for ref in refs[::4]:
            s.quarantine.resolve(ref, note="known ghost")
        assert s.quarantine.get(refs[1]).payload.size == PAYLOAD  # kept whole

    with bytes_sent(own_server) as sent:
        report = settle_json("stats", *_args(own_server, namespace))

    assert report["quarantine"]["by_kind"]["unknown_operation"] == {
        "unresolved": ENTRIES - ENTRIES // 4,
        "resolved": ENTRIES // 4,
    }
    assert report["quarantine"]["total"] == ENTRIES
    payloads = ENTRIES * PAYLOAD
    assert sent[0] < payloads // 50, f"Redis sent {sent[0]} bytes for {payloads} of payloads"


def test_stats_counts_a_shard_that_holds_more_than_a_page(own_server: str) -> None:
    """The walk reads a shard a page at a time (512 entries shared by the shards: 32 each on
    16): a shard with more entries than a page is counted to its end, not to its first
    page."""
    namespace = "deep"
    names = [str(n) for n in range(2000) if shard_of(f"ghost-{n}", SHARDS) == 3][:45]
    with Settler.from_url(own_server, namespace=namespace, shards=SHARDS) as s:
        s.check()
        refs = [s.complete(ghost_of(name), b"x").quarantine_id for name in names]
        s.quarantine.resolve(refs[-1], note="the newest, on the second page")
        s.complete(ghost_of("elsewhere"), b"x")  # another shard still read meanwhile
        assert shard_of("ghost-elsewhere", SHARDS) != 3

    report = settle_json("stats", *_args(own_server, namespace))

    assert report["quarantine"]["by_kind"]["unknown_operation"] == {
        "unresolved": len(names),
        "resolved": 1,
    }
    assert report["quarantine"]["total"] == len(names) + 1
