"""The Lua scripts, held against the reference model (``settle.testing``).

A hypothesis state machine gives several workers random reserve / complete / fail /
mark_provisional / renew calls — stale generations, changed fingerprints and principals,
duplicate and conflicting settlements, expired leases, version preconditions — and sends
every call to a real redis-server and to ``MemorySettler``. Every outcome, every record,
every attempt log and the whole quarantine must be equal after every step.

Leases are either long (never pass during a run) or 1 ms followed by a pause, so both
sides agree on which leases have passed; the model's clock is the Redis server's clock.

Generations come from a hybrid logical clock (max(last + 1, server time in microseconds)),
which the two sides read at different instants and resolutions: the model reads the server's
milliseconds. So each generation one side issues is paired with the other side's, in the
order they are issued, and the Redis side's answers are compared in the model's numbers
(:class:`Generations`). Presented generations that were never issued are an issued one
minus 1 ("older") or plus ``NEWER`` ("newer"), and are translated the same way.

Loss steps drop each side's state in the same way: one shard's generation state (a DEL or an
eviction), or every key of the namespace (a FLUSHALL or a restart without persistence).
Reservations held from before stay in the workers' hands and must be rejected on both sides.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import redis
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from settle import InProgress, Replay, Reservation, Reserved, SettleError, Settler
from settle.testing import MemorySettler

OPS = ["op-a", "op-b"]
REQUESTS = [{"amount": 100}, {"amount": 200}]
PRINCIPALS = ["tenant:a", "tenant:b"]
RESULTS = [{"receipt": 1}, {"receipt": 2}, b"\x00raw\xff"]
# Mostly the matching request and principal, so that operations get far; sometimes not.
REQUEST_INDEX = st.sampled_from([0, 0, 0, 1])
PRINCIPAL_INDEX = st.sampled_from([0, 0, 0, 1])
SHORT, LONG = 0.001, 600.0
NEWER = 10**9  # a generation not issued yet: 1000 s of the clock ahead


#: Attempt ids in each form the scripts store differently (settle's own are hex; a caller's
#: may be any text): hex as the bytes it spells, the rest as text.
AID_FORMS = ("hex", "text", "upper hex", "odd hex", "one byte", "64 hex digits")


def _attempt_id(form: str) -> str:
    hexed = uuid.uuid4().hex
    return {
        "hex": hexed,
        "text": f"worker-{hexed[:12]}",
        "upper hex": hexed.upper(),
        "odd hex": hexed[:31],
        "one byte": hexed[:2],
        "64 hex digits": hexed * 2,
    }[form]


class Generations:
    """Redis generation -> model generation, paired as the two sides issue them."""

    def __init__(self) -> None:
        self.pairs: dict[int, int] = {}

    def pair(self, real: int, model: int) -> None:
        assert self.pairs.setdefault(real, model) == model, (real, model)
        # Both sides issue their generations in the same order on a shard: strictly increasing.

    def model_of(self, g: int) -> int:
        if g in self.pairs:
            return self.pairs[g]
        if g + 1 in self.pairs:  # "older"
            return self.pairs[g + 1] - 1
        if g - NEWER in self.pairs:  # "newer"
            return self.pairs[g - NEWER] + NEWER
        return g  # never issued by either side (a ghost's generation 1)

    def translate(self, value: Any) -> Any:
        """Every ``generation`` in a dumped outcome, in the model's numbers."""
        if isinstance(value, dict):
            return {
                k: self.model_of(v)
                if k == "generation" and isinstance(v, int)
                else self.translate(v)
                for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return type(value)(self.translate(v) for v in value)
        return value


def _record(rec: Any) -> Any:
    if rec is None:
        return None
    data = rec.model_dump(exclude={"created_at", "updated_at", "lease_expires_at"})
    data["has_lease"] = rec.lease_expires_at is not None
    return data


def _outcome(call: Any) -> Any:
    try:
        r = call()
    except SettleError as exc:
        return ("raised", type(exc).__name__, exc.operation_id), None
    if isinstance(r, Reserved):
        return (
            ("reserved", r.reservation.model_dump(), r.takeover, _record(r.record)),
            r.reservation,
        )
    if isinstance(r, Replay):
        return ("replay", _record(r.record)), None
    if isinstance(r, InProgress):
        return ("in_progress", {"generation": r.generation}, _record(r.record)), None
    # Settlement, Renewal, Resolution: compare all but server times and stream ids.
    data = r.model_dump(exclude={"record", "quarantine_id", "lease_expires_at", "at"})
    if hasattr(r, "record"):
        data["record"] = _record(r.record)
    if hasattr(r, "quarantine_id"):
        data["quarantined"] = r.quarantine_id is not None
    return data, None


class ScriptsMatchModel(RuleBasedStateMachine):
    # Each reservation is a (redis, model) pair: one worker's attempt, seen by both sides.
    reservations = Bundle("reservations")
    settlements = Bundle("settlements")

    #: ``quarantine_maxlen`` of both sides (None: uncapped); see the capped subclass below.
    maxlen: int | None = None

    def __init__(self, url: str) -> None:
        super().__init__()
        namespace = f"p{uuid.uuid4().hex[:12]}"
        self.client = redis.Redis.from_url(url)
        opts = {"namespace": namespace, "shards": 2, "attempt_log_size": 500, "retention": 3600}
        opts["quarantine_maxlen"] = self.maxlen
        self.real = Settler.from_url(url, **opts)
        self.model = MemorySettler(clock=self._server_ms, **opts)
        self.namespace = namespace
        self.gens = Generations()
        self.issued: tuple[list[int], list[int]] = ([], [])  # every new generation, per side

    def _server_ms(self) -> int:
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def teardown(self) -> None:
        self.real.close()
        self.client.close()

    def _both(self, fn: Any) -> tuple[Any, Any, Any]:
        real, real_res = _outcome(lambda: fn(self.real, 0))
        model, model_res = _outcome(lambda: fn(self.model, 1))
        if isinstance(real_res, Reservation) and isinstance(model_res, Reservation):
            for side, g in enumerate((real_res.generation, model_res.generation)):
                if g not in self.issued[side]:
                    # A new generation: above every one this side issued before, losses or not.
                    assert all(g > old for old in self.issued[side]), (side, g)
                    self.issued[side].append(g)
            self.gens.pair(real_res.generation, model_res.generation)
        assert self.gens.translate(real) == model
        return real, real_res, model_res

    def _real_keys(self) -> list[bytes]:
        return list(self.client.scan_iter(match=f"settle:{{{self.namespace}*", count=1000))

    @staticmethod
    def _pause_past(lease: float) -> None:
        if lease == SHORT:
            time.sleep(0.004)

    # -- reservations ------------------------------------------------------------------

    @rule(
        target=reservations,
        op=st.sampled_from(OPS),
        req=REQUEST_INDEX,
        who=PRINCIPAL_INDEX,
        lease=st.sampled_from([SHORT, LONG]),
        form=st.sampled_from(AID_FORMS),
    )
    def reserve(self, op: str, req: int, who: int, lease: float, form: str) -> Any:
        aid = _attempt_id(form)
        real, real_res, model_res = self._both(
            lambda s, _i: s.reserve(
                op, REQUESTS[req], principal=PRINCIPALS[who], lease=lease, attempt_id=aid
            )
        )
        if real[0] == "reserved":
            # The record holds the attempt id as the caller gave it, whatever form it was
            # sent in (the model reads the arguments back the same way, so only Redis's
            # own record can show a wrong form).
            assert real[3]["attempt_id"] == aid
        self._pause_past(lease)
        return multiple() if real_res is None else multiple((real_res, model_res))

    # -- losses: what Redis can forget (SPEC §1) -------------------------------------------

    @rule(shard=st.integers(0, 1))
    def lose_a_shards_generation_state(self, shard: int) -> None:
        """A DEL or an eviction of one shard's state (its generation and shard count)."""
        key = self.real._core.keys.generation(shard)
        self.client.delete(key)
        self.model._runner.keyspace.delete(key)  # type: ignore[attr-defined]
        time.sleep(0.002)  # the model reads milliseconds: let the clock pass the loss

    @rule()
    def lose_everything(self) -> None:
        """A FLUSHALL (or a restart without persistence) under the live clients."""
        keys = self._real_keys()
        if keys:
            self.client.delete(*keys)
        self.model._runner.keyspace.flush()  # type: ignore[attr-defined]
        time.sleep(0.002)

    @rule(pair=reservations)
    def reserve_again_as_the_same_attempt(self, pair: tuple[Reservation, Reservation]) -> None:
        self._both(
            lambda s, i: s.reserve(
                pair[i].operation_id,
                None,
                principal=pair[i].binding,
                fingerprint=pair[i].fingerprint,
                attempt_id=pair[i].attempt_id,
                lease=LONG,
            )
        )

    @rule(pair=reservations, lease=st.sampled_from([SHORT, LONG]))
    def renew(self, pair: tuple[Reservation, Reservation], lease: float) -> None:
        self._both(lambda s, i: s.renew(pair[i], lease=lease))
        self._pause_past(lease)

    # -- settlements -------------------------------------------------------------------

    @rule(
        target=settlements,
        pair=reservations,
        action=st.sampled_from(["complete", "fail", "mark_provisional"]),
        result=st.integers(0, len(RESULTS) - 1),
        tamper=st.sampled_from([None, None, None, "fingerprint", "binding", "older", "newer"]),
        version=st.sampled_from([None, None, "current", "previous"]),
    )
    def settle(
        self,
        pair: tuple[Reservation, Reservation],
        action: str,
        result: int,
        tamper: str | None,
        version: str | None,
    ) -> Any:
        presented = tuple(self._tampered(r, tamper) for r in pair)
        expected = None
        if version is not None:
            rec = self.real.get(presented[0].operation_id)
            if rec is not None:
                expected = rec.version if version == "current" else max(1, rec.version - 1)
        args = (action, RESULTS[result], expected)
        self._settle(presented, args)
        return (presented, args)

    @rule(delivery=settlements)
    def deliver_the_same_settlement_again(self, delivery: Any) -> None:
        self._settle(*delivery)

    @rule(action=st.sampled_from(["complete", "fail", "mark_provisional"]))
    def settle_an_operation_that_never_existed(self, action: str) -> None:
        ghost = Reservation(
            operation_id="op-ghost",
            fingerprint="a" * 64,
            fingerprint_version=1,
            binding="tenant:a",
            generation=1,
            attempt_id="ghost",
        )
        self._settle((ghost, ghost), (action, {"late": True}, None))

    @precondition(lambda self: self.real.quarantine.list(limit=1))
    @rule(pick=st.integers(0, 1000), note=st.sampled_from(["refunded", "ignored"]))
    def resolve(self, pick: int, note: str) -> None:
        real = self.real.quarantine.list(limit=500, newest_first=False)
        model = self.model.quarantine.list(limit=500, newest_first=False)
        i = pick % len(real)
        self._both(lambda s, side: s.quarantine.resolve((real, model)[side][i].ref, note=note))

    @precondition(lambda self: self.real.quarantine.list(limit=1))
    @rule(everything=st.booleans(), repeated=st.booleans())
    def trim(self, everything: bool, repeated: bool) -> None:
        """quarantine_trim: resolved entries, or every entry older than 1 ms; ``repeated``
        sends each call twice with its token, as settle does after a lost reply."""
        time.sleep(0.003)  # every entry is older than the horizon on both sides

        def trim(s: Settler, _i: int) -> Any:
            older = 0.001 if everything else None
            t = s._core.quarantine_trim(older_than=older, include_unresolved=everything)
            while call := t.next_call():
                raw = s._run(call)
                if repeated:
                    raw = s._run(call)
                t.feed(call, raw)
            return t.result()

        self._both(trim)

    def _settle(self, pair: tuple[Reservation, ...], args: tuple[str, Any, Any]) -> None:
        action, payload, expected = args

        def call(s: Settler, i: int) -> Any:
            if action == "mark_provisional":
                return s.mark_provisional(pair[i], reason="timeout", expected_version=expected)
            return getattr(s, action)(pair[i], payload, expected_version=expected)

        self._both(call)

    @staticmethod
    def _tampered(r: Reservation, tamper: str | None) -> Reservation:
        if tamper == "fingerprint":
            return r.model_copy(update={"fingerprint": "f" * 64})
        if tamper == "binding":
            return r.model_copy(update={"binding": "tenant:mallory"})
        if tamper == "older":
            return r.model_copy(update={"generation": max(1, r.generation - 1)})
        if tamper == "newer":
            return r.model_copy(update={"generation": r.generation + NEWER})
        return r

    # -- everything observable must be equal ------------------------------------------

    @invariant()
    def records_logs_and_quarantine_are_equal(self) -> None:
        for op in [*OPS, "op-ghost"]:
            assert self.gens.translate(_record(self.real.get(op))) == _record(self.model.get(op))
            real_log = [o.model_dump(exclude={"id", "at"}) for o in self.real.attempts(op)]
            model_log = [o.model_dump(exclude={"id", "at"}) for o in self.model.attempts(op)]
            assert self.gens.translate(real_log) == model_log
        real_q = self.real.quarantine.list(limit=500, newest_first=False)
        model_q = self.model.quarantine.list(limit=500, newest_first=False)

        def norm(entries: list[Any]) -> list[Any]:
            out = []
            for e in entries:
                data = e.model_dump(exclude={"id", "at"})
                if data["resolution"]:
                    data["resolution"] = data["resolution"]["note"]
                out.append(data)
            return out

        assert self.gens.translate(norm(real_q)) == norm(model_q)
        # Headers (quarantine_read's ARGV[9]): the same entries, their kind, time and status
        # only, read by the script and by the model alike.
        real_h = self.real.quarantine.headers(limit=500, newest_first=False)
        model_h = self.model.quarantine.headers(limit=500, newest_first=False)
        assert [h.model_dump(exclude={"id", "at"}) for h in real_h] == [
            h.model_dump(exclude={"id", "at"}) for h in model_h
        ]
        for listed, headers in ((real_q, real_h), (model_q, model_h)):
            assert [(h.ref, h.kind, h.at, h.resolved) for h in headers] == [
                (e.ref, e.kind, e.at, e.resolution is not None) for e in listed
            ]


class CappedScriptsMatchModel(ScriptsMatchModel):
    """The same, with each shard's stream capped at 2 entries (``quarantine_maxlen``): the
    cap makes room before the entry is written, and the entry keeps the count of unresolved
    ones it pushed out (field ``dropped``), stored alike on both sides."""

    maxlen = 2

    @invariant()
    def streams_hold_the_same_drop_counts(self) -> None:
        keyspace = self.model._runner.keyspace  # type: ignore[attr-defined]
        keys = self.real._core.keys
        for shard in range(2):
            real = [f.get(b"dropped") for _, f in self.client.xrange(keys.quarantine(shard))]
            model = [
                dict(zip(f[::2], f[1::2], strict=True)).get(b"dropped")
                for _, f in keyspace.xrange(keys.quarantine(shard), self._server_ms())
            ]
            assert real == model
            assert len(real) <= 2


def test_lua_scripts_match_the_reference_model_with_a_capped_quarantine(redis_url: str) -> None:
    run_state_machine_as_test(
        lambda: CappedScriptsMatchModel(redis_url),
        settings=settings(settings.default, stateful_step_count=30),
    )


def test_lua_scripts_match_the_reference_model(redis_url: str) -> None:
    run_state_machine_as_test(
        lambda: ScriptsMatchModel(redis_url),
        settings=settings(settings.default, stateful_step_count=30),
    )
