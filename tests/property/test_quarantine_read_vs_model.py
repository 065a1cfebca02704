"""quarantine_read.lua held against the reference model reply for reply.

The same stream (the same ids, fields and resolutions) is written to a real redis-server and
to the model's keyspace, and every combination of the read's arguments is sent to both: the
replies must be equal but for the server time. The listings of the state machine
(test_scripts_vs_model.py) only compare what the engine makes of the replies; here the code
(``more`` or ``done``), the last id examined and every match as sent are compared, for whole
entries and headers, so a model that sent a header's whole entry, or a note where the flag
is, or said ``done`` where the script says ``more``, is caught.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from settle._core.engine import Core
from settle._core.keys import Keys
from settle._core.reference import MemoryKeyspace, run_script
from settle._core.scripts import SCRIPTS
from settle._runtime.calls import Call

T0 = 1_700_000_000_000
KINDS = ("unknown_operation", "misbound", "conflicting_settlement")


def _fields(n: int) -> list[bytes]:
    """An entry as settle writes one (a few with a current record), a payload of its own."""
    fields = [
        b"op",
        f"op-{n % 4}".encode(),
        b"kind",
        KINDS[n % 3].encode(),
        b"action",
        b"complete",
        b"aid",
        f"a-{n}".encode(),
        b"payload",
        b"\x00payload " * 20 + bytes([n]),
        b"psize",
        b"201",
        b"at",
        str(T0 + n).encode(),
        b"us",
        str((T0 + n) * 1000 + n).encode(),
    ]
    if n % 5 == 0:
        fields += [b"cstate", b"completed", b"cgen", b"7", b"cver", b"2"]
    if n == 3:  # written before entries carried ``us``
        del fields[14:16]
    return fields


@pytest.fixture
def streams(redis_url: str, namespace: str) -> Iterator[tuple[redis.Redis, MemoryKeyspace, Keys]]:
    """12 entries (two sharing a millisecond), every third resolved with a note, on both."""
    client = redis.Redis.from_url(redis_url)
    ks = MemoryKeyspace(lambda: T0 + 100)
    keys = Keys(namespace, 1)
    stream, resolutions = keys.quarantine(0), keys.resolutions(0)
    for n in range(12):
        entry_id = ks.xadd(stream, T0 + n - (n == 5), _fields(n))
        flat = _fields(n)
        client.xadd(stream, dict(zip(flat[::2], flat[1::2], strict=True)), id=entry_id)
        if n % 3 == 1:
            note = json.dumps({"note": f"checked {n} " + "x" * 300, "at": T0 + 50})
            ks.hset(resolutions, T0 + 50, entry_id, note.encode())
            client.hset(resolutions, entry_id, note)
    yield client, ks, keys
    client.close()


def _lua(client: redis.Redis, keys: tuple[str, ...], args: list[str]) -> Any:
    if int(client.info("server")["redis_version"].split(".")[0]) >= 7:
        client.function_load(SCRIPTS.library, replace=True)
        return client.fcall(SCRIPTS.function("quarantine_read"), len(keys), *keys, *args)
    return client.eval(SCRIPTS.source("quarantine_read"), len(keys), *keys, *args)


def _no_time(reply: list[Any]) -> list[Any]:
    return [reply[0], reply[1], *reply[3:]]


GRID = list(
    itertools.product(
        ["-", f"({T0 + 3}-0"],  # low
        ["1", "2", "3", "7", "12", "100"],  # max matches
        ["1", "3", "7", "11", "12", "4096"],  # scan budget
        ["", "misbound"],  # kind
        ["", "op-1"],  # operation
        ["0", "1"],  # unresolved only
        ["0", "1"],  # newest first
        [None, "0", "1"],  # headers flag (None: absent, as settle sent before)
    )
)


def test_every_read_answers_what_the_model_answers(
    streams: tuple[redis.Redis, MemoryKeyspace, Keys],
) -> None:
    client, ks, keys = streams
    call_keys = (keys.quarantine(0), keys.resolutions(0))
    differ = []
    for low, limit, budget, kind, op, unresolved, newest, headers in GRID:
        args = [low, "+", limit, budget, kind, op, unresolved, newest]
        if headers is not None:
            args.append(headers)
        real = _no_time(_lua(client, call_keys, args))
        model = _no_time(run_script(ks, "quarantine_read", list(call_keys), args))
        if real != model:
            differ.append((args, real[:2], model[:2]))
    assert not differ, differ[:5]


def test_a_read_of_the_stream_alone_joined_with_its_resolutions_answers_the_same(
    streams: tuple[redis.Redis, MemoryKeyspace, Keys],
) -> None:
    """The read of a shard whose Redis Cluster slot a migration split (the stream alone,
    then HMGET of the resolutions: settle/_async/settler.py, AsyncQuarantine._read): the
    script and the model agree on the one-key read, and joined with the resolutions it is
    the two-key read's reply; with the unresolved filter, that of the read without it, the
    resolved matches dropped (a shorter page, which the walk goes on after)."""
    client, ks, keys = streams
    both = (keys.quarantine(0), keys.resolutions(0))
    differ = []
    for low, limit, budget, kind, op, unresolved, newest, headers in GRID:
        args = [low, "+", limit, budget, kind, op, unresolved, newest, headers or "0"]
        call = Call("quarantine_read", both, tuple(args))
        alone = Core.stream_only(call)
        real = _lua(client, alone.keys, args)
        model = run_script(ks, "quarantine_read", list(alone.keys), args)
        if _no_time(real) != _no_time(model):
            differ.append(("one key", args, real[:2], model[:2]))
        found = client.hmget(keys.resolutions(0), Core.match_ids(real)) if real[4] else []
        span = Core.unresolved_span(real, found)
        present = [e[0] for e in client.xrange(both[0], *span)] if span else []
        joined = _no_time(Core.with_resolutions(call, real, found, present))
        if span is not None:  # an unresolved match gone from the stream is left out
            gone = _no_time(Core.with_resolutions(call, real, found, present[1:]))
            if [m[0] for m in gone[3]] != [m[0] for m in joined[3] if m[0] != present[0]]:
                differ.append(("gone", args, gone[:2], joined[:2]))
        # The two-key read without the filter, its resolved matches dropped if filtered.
        whole = _no_time(_lua(client, both, [*args[:6], "0", *args[7:]]))
        if unresolved == "1":
            whole[3] = [m for m in whole[3] if not m[2]]
        if joined != whole:
            differ.append(("joined", args, joined[:2], whole[:2]))
    assert not differ, differ[:5]


WINDOWS = list(
    itertools.product(
        ["", str(T0), str(T0 + 3), str(T0 + 5), "0x" + format(T0 + 4, "x")],  # since
        ["", str(T0 + 4), str(T0 + 5), str(T0 + 100), "-1"],  # until
        ["1", "3", "100"],  # max matches
        ["3", "4096"],  # scan budget
        ["0", "1"],  # newest first
        ["0", "1"],  # headers flag
    )
)


def test_every_read_of_a_window_answers_what_the_model_answers(
    streams: tuple[redis.Redis, MemoryKeyspace, Keys],
) -> None:
    """ARGV[10]/[11], the window by each entry's own time (its ``at``; entry 5's id is a
    millisecond before it): the same matches, code and last id examined on both, the
    entries of the range outside the window examined and not sent."""
    client, ks, keys = streams
    call_keys = (keys.quarantine(0), keys.resolutions(0))
    differ = []
    sent = 0
    for since, until, limit, budget, newest, headers in WINDOWS:
        args = ["-", "+", limit, budget, "", "", "0", newest, headers, since, until]
        real = _no_time(_lua(client, call_keys, args))
        model = _no_time(run_script(ks, "quarantine_read", list(call_keys), args))
        if real != model:
            differ.append((args, real[:2], model[:2]))
        sent += len(real[3])
    assert not differ, differ[:5]
    # Windowed reads that match nothing (until before since) still examine to the end.
    args = ["-", "+", "100", "4096", "", "", "0", "0", "0", str(T0 + 5), str(T0 + 4)]
    assert _no_time(_lua(client, call_keys, args))[:2] == [b"done", f"{T0 + 11}-0".encode()]
    assert sent > 0
