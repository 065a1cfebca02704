"""A reserve's and a settlement's script calls are marked ``plain``: the lane packs them with
hiredis without looking at each argument (the twenty-fifth round, docs/benchmarks.md).
What is sent must stay what the look would have sent, and a config number hiredis cannot
pack must still be looked at: hiredis crashes the process on an integer of over 4,300
digits, where the look makes its text and raises Python's ValueError."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest
from redis.asyncio.connection import Connection as AsyncConnection
from redis.connection import Connection

from settle._core.engine import Core
from settle._runtime.calls import Call, packs_plain
from settle._runtime.packing import pack_command
from settle.config import SettleConfig
from settle.models import Reservation

PRINCIPAL = "svc"


def _reservation(core: Core) -> Reservation:
    """A reservation as reserve() would hand it out, of the call ``core`` plans."""
    call = core.plan_reserve("op-1", {"a": 1}, principal=PRINCIPAL)
    return Reservation.model_construct(
        operation_id="op-1",
        fingerprint="ab" * 32,
        fingerprint_version=1,
        binding=call.args[3],
        generation=2**53 - 1,
        attempt_id=call.attempt_id,
    )


def _calls(core: Core) -> list[Call]:
    reservation = _reservation(core)
    return [
        core.plan_reserve("op-1", {"a": 1}, principal=PRINCIPAL),
        core.plan_reserve("op-1", {"a": 1}, principal=PRINCIPAL, lease=86_400, attempt_id="a:1"),
        core.plan_reserve("op-1", None, principal=PRINCIPAL, fingerprint="0" * 64),
        core.plan_complete(reservation, {"ok": [1, 2.5, "x"]}),
        core.plan_complete(reservation, memoryview(b"abcdef")[::2], expected_version=2**53 - 1),
        core.plan_fail(reservation, ValueError("no")),
        core.plan_mark_provisional(reservation, "waiting"),
    ]


def test_a_reserves_and_a_settlements_calls_are_plain_and_packed_alike() -> None:
    for config in (
        SettleConfig(),
        SettleConfig(quarantine_payload_bytes=2**63 - 1, quarantine_maxlen=2**53),
    ):
        for call in _calls(Core(config)):
            assert call.plain, call.script
            assert packs_plain((*call.keys, *call.args)), call.script  # what the mark says
            command = ("EVALSHA", "0" * 40, len(call.keys), *call.keys, *call.args)
            for conn in (Connection(), AsyncConnection()):
                assert pack_command(conn, command, plain=True) == pack_command(conn, command)
                assert b"".join(map(bytes, pack_command(conn, command, plain=True))) == (
                    b"".join(map(bytes, conn.pack_command(*command)))
                )


@pytest.mark.parametrize("number", [2**63, -(2**63) - 1, 10**50])
def test_a_config_number_beyond_64_bits_leaves_the_calls_looked_at(number: int) -> None:
    config = SettleConfig(quarantine_payload_bytes=abs(number))
    assert not any(call.plain for call in _calls(Core(config)))
    assert packs_plain((2**63 - 1, -(2**63), "x", b"y", memoryview(b"z")[:0])) is False
    assert packs_plain((2**63 - 1, -(2**63), "x", b"y")) is True
    assert packs_plain((number,)) is False


_HUGE = """
import asyncio, os, sys
from settle import AsyncSettler, Reserved

async def main() -> None:
    settler = AsyncSettler.from_url(
        sys.argv[1], namespace="huge-" + os.urandom(4).hex(), quarantine_payload_bytes=10**4400
    )
    try:
        got = await settler.reserve("op-" + os.urandom(4).hex(), {"a": 1}, principal="svc")
        assert isinstance(got, Reserved)
        try:
            await settler.complete(got.reservation, {"ok": 1})
        except ValueError as exc:
            print("refused:", str(exc)[:40])
    finally:
        await settler.aclose()

asyncio.run(main())
"""


def test_a_config_number_hiredis_cannot_pack_is_refused_not_a_crash(redis_url: str) -> None:
    """An integer of over 4,300 digits in the config: each settlement refuses it with
    Python's ValueError (the look makes its text), as before the mark; marked plain, hiredis
    packed it and the process died of a segmentation fault."""
    done: Any = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_HUGE), redis_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused: Exceeds the limit (4300 digits)" in done.stdout
