"""Every settle call is a span (``settle.reserve``, ``settle.complete``, ...) with its
outcome, verdict, quarantine kind, generation and takeover; inside it the Redis calls as
client spans with the Redis semantic conventions; and the counters and the duration
histogram say the same. Sync and async, on a real Redis, with the real SDK."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import redis
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from settle import AsyncSettler, BackendError, BindingMismatch, FingerprintMismatch, Settler
from settle._telemetry import telemetry
from settle.cursor import CursorStore
from tests.telemetry.conftest import Telemetry, script_operation

SECRET = "4242424242424242"
PRINCIPAL = "tenant:acme/user:42"
#: The first attempt's lease: the next reserve must come within it (``in_progress``), the
#: takeover after it. At 0.2 s a loaded CI worker could hold the test past it before the
#: second reserve, which then took the key over (3 reserved, 0 in progress). The takeover
#: waits for the end of the lease, not a fixed sleep.
SHORT_LEASE = 1.5


def _no_secrets(otel: Telemetry) -> None:
    for span in otel.spans():
        text = repr(dict(span.attributes or {})) + span.name
        assert SECRET not in text
        assert PRINCIPAL not in text
        assert "op-1" not in text  # operation ids are never attributes


def _check(otel: Telemetry, ns: str, port: int) -> None:
    script = script_operation(port)
    reserves = otel.spans("settle.reserve")
    outcomes = [s.attributes["settle.outcome"] for s in reserves]
    assert outcomes == [
        "reserved",
        "in_progress",
        "reserved",  # the takeover after the lease expired
        "replayed",
        "fingerprint_mismatch",
        "binding_mismatch",
    ]
    takeover = reserves[2]
    assert takeover.attributes["settle.takeover"] == "lease_expired"
    assert takeover.attributes["settle.generation"] > reserves[0].attributes["settle.generation"]
    refused = reserves[4]
    assert refused.attributes["error.type"] == "FingerprintMismatch"
    assert not refused.status.is_ok

    # Each call's Redis work is a client span inside it.
    for span in otel.spans():
        if not span.name.startswith("settle."):
            continue
        assert span.attributes["settle.namespace"] == ns
        redis_calls = otel.children(span)
        assert redis_calls, f"{span.name} has no Redis span"
        for call in redis_calls:
            a = call.attributes
            assert a["db.system.name"] == "redis"
            if a["db.operation.name"] == script:
                assert call.name == f"{script} {a['db.stored_procedure.name']}"
            elif span is reserves[0] and a["db.operation.name"] == "EXISTS":
                # The new namespace's first call: the shard states beyond its count.
                assert call.name == "EXISTS"
            else:
                assert call.name == a["db.operation.name"] == "PIPELINE"
            assert a["server.address"] == "127.0.0.1"
            assert a["server.port"] == port
            assert a["db.namespace"] == "0"
            assert call.kind.name == "CLIENT"

    settlements = {
        (s.name, s.attributes["settle.verdict"], s.attributes.get("settle.quarantine.kind"))
        for s in otel.spans()
        if "settle.verdict" in (s.attributes or {})
    }
    assert settlements == {
        ("settle.complete", "quarantined", "stale_generation"),  # the fenced-off worker
        ("settle.complete", "accepted", None),
        ("settle.complete", "absorbed", None),
        ("settle.complete", "quarantined", "conflicting_settlement"),
        ("settle.fail", "quarantined", "conflicting_settlement"),
        ("settle.mark_provisional", "absorbed", None),  # completed stays completed
    }
    renew = otel.spans("settle.renew")
    assert [s.attributes["settle.outcome"] for s in renew] == ["lost"]
    assert renew[0].attributes["settle.renew.reason"]
    listed = otel.span("settle.quarantine.list")
    assert [c.attributes["db.operation.name"] for c in otel.children(listed)] == ["PIPELINE"]
    assert otel.children(listed)[0].attributes["db.operation.batch.size"] == 4  # 4 shards
    assert otel.span("settle.get").attributes["settle.namespace"] == ns
    _no_secrets(otel)

    # The same in numbers.
    n = {"settle.namespace": ns}
    for outcome, count in [
        ("reserved", 2),
        ("in_progress", 1),
        ("replayed", 1),
        ("fingerprint_mismatch", 1),
        ("binding_mismatch", 1),
    ]:
        assert otel.count("settle.reservations", **n, **{"settle.outcome": outcome}) == count
    assert otel.count("settle.takeovers", **n, **{"settle.takeover.reason": "lease_expired"}) == 1
    for action, verdict, count in [
        ("complete", "accepted", 1),
        ("complete", "absorbed", 1),
        ("complete", "quarantined", 2),
        ("fail", "quarantined", 1),
        ("mark_provisional", "absorbed", 1),
    ]:
        attrs = {"settle.action": action, "settle.verdict": verdict}
        assert otel.count("settle.settlements", **n, **attrs) == count
    kinds = {"stale_generation": 1, "conflicting_settlement": 2}
    for kind, count in kinds.items():
        assert (
            otel.count("settle.quarantine.entries", **n, **{"settle.quarantine.kind": kind})
            == count
        )
    assert otel.count("settle.leases.lost", **n) == 1
    durations = otel.points("settle.call.duration", **n, **{"settle.call.name": "reserve"})
    assert sum(p.count for p in durations) == 6
    assert all(p.sum >= 0 for p in durations)
    assert otel.count("settle.call.duration", **n, **{"settle.call.name": "complete"}) == 4


def test_sync_calls_are_spans_and_measurements(
    settler: Settler, namespace: str, otel: Telemetry
) -> None:
    request = {"card": SECRET}
    first = settler.reserve("op-1", request, principal=PRINCIPAL, lease=SHORT_LEASE)
    lapsed = time.monotonic() + SHORT_LEASE + 0.1  # the lease began before this, ends before
    settler.reserve("op-1", request, principal=PRINCIPAL)  # in progress: within the lease
    time.sleep(max(0.0, lapsed - time.monotonic()))
    second = settler.reserve("op-1", request, principal=PRINCIPAL, lease=30)
    settler.renew(first.reservation)  # the lease passed to another generation
    settler.complete(first.reservation, {"receipt": SECRET})  # fenced off: quarantined
    settler.complete(second.reservation, {"receipt": SECRET})
    settler.complete(second.reservation, {"receipt": SECRET})
    settler.complete(second.reservation, {"receipt": "other"})
    settler.fail(second.reservation, ValueError("declined"))
    settler.mark_provisional(second.reservation, "timeout")
    settler.reserve("op-1", request, principal=PRINCIPAL)
    with pytest.raises(FingerprintMismatch):
        settler.reserve("op-1", {"card": "other"}, principal=PRINCIPAL)
    with pytest.raises(BindingMismatch):
        settler.reserve("op-1", request, principal="tenant:other")
    settler.quarantine.list()
    settler.get("op-1")
    _check(otel, namespace, int(settler.client.connection_pool.connection_kwargs["port"]))


@pytest.mark.asyncio
async def test_async_calls_are_spans_and_measurements(
    async_settler: AsyncSettler, namespace: str, otel: Telemetry
) -> None:
    s = async_settler
    request = {"card": SECRET}
    first = await s.reserve("op-1", request, principal=PRINCIPAL, lease=SHORT_LEASE)
    lapsed = time.monotonic() + SHORT_LEASE + 0.1  # the lease began before this, ends before
    await s.reserve("op-1", request, principal=PRINCIPAL)  # in progress: within the lease
    await asyncio.sleep(max(0.0, lapsed - time.monotonic()))
    second = await s.reserve("op-1", request, principal=PRINCIPAL, lease=30)
    await s.renew(first.reservation)
    await s.complete(first.reservation, {"receipt": SECRET})
    await s.complete(second.reservation, {"receipt": SECRET})
    await s.complete(second.reservation, {"receipt": SECRET})
    await s.complete(second.reservation, {"receipt": "other"})
    await s.fail(second.reservation, ValueError("declined"))
    await s.mark_provisional(second.reservation, "timeout")
    await s.reserve("op-1", request, principal=PRINCIPAL)
    with pytest.raises(FingerprintMismatch):
        await s.reserve("op-1", {"card": "other"}, principal=PRINCIPAL)
    with pytest.raises(BindingMismatch):
        await s.reserve("op-1", request, principal="tenant:other")
    await s.quarantine.list()
    await s.get("op-1")
    _check(otel, namespace, int(s.client.connection_pool.connection_kwargs["port"]))


def test_a_renewal_that_raises_is_counted(redis_url: str, namespace: str, otel: Telemetry) -> None:
    with Settler.from_url(redis_url, namespace=namespace, shards=4) as s:
        r = s.reserve("op-1", {}, principal=PRINCIPAL, lease=30)
    # The same reservation presented through a store nobody listens on.
    gone = Settler.from_url("redis://127.0.0.1:1/0", namespace=namespace, shards=4)
    with pytest.raises(BackendError):
        gone.renew(r.reservation)
    gone.close()
    n = {"settle.namespace": namespace}
    assert otel.count("settle.renewals.failed", **n, **{"error.type": "BackendError"}) == 1
    failed = otel.span("settle.renew")
    assert failed.attributes["error.type"] == "BackendError"
    assert not failed.status.is_ok
    assert otel.count("settle.call.duration", **n, **{"error.type": "BackendError"}) == 1


def test_the_cursor_store_gets_redis_spans_from_the_same_runner(
    redis_url: str, namespace: str, otel: Telemetry
) -> None:
    store = CursorStore.from_url(redis_url, namespace=namespace)
    store.start("orders", b"cursor-secret")
    store.close()
    scripts = [
        s.attributes["db.stored_procedure.name"]
        for s in otel.spans()
        if (s.attributes or {}).get("db.system.name") == "redis"
    ]
    assert "init" in scripts
    for span in otel.spans():
        assert "cursor-secret" not in repr(dict(span.attributes or {}))


def test_a_trace_sampled_out_makes_no_redis_spans_and_keeps_every_count(
    redis_url: str, namespace: str, otel: Telemetry
) -> None:
    """Inside a span that is not recorded (the application's sampler dropped its trace), a
    settle call's span is not recorded either (the SDK's ParentBased sampler) and settle
    makes no Redis span under it; the counters and the histogram count every call."""
    dropped = NonRecordingSpan(
        SpanContext(trace_id=0xABC, span_id=0xDEF, is_remote=False, trace_flags=TraceFlags(0))
    )
    s = Settler.from_url(redis_url, namespace=namespace)
    try:
        with trace.use_span(dropped):
            for n in range(3):
                r = s.reserve(f"op-{n}", {"amount": n}, principal=PRINCIPAL)
                s.complete(r.reservation, {"ok": n})
            s.reserve("op-0", {"amount": 0}, principal=PRINCIPAL)  # a replay
    finally:
        s.close()
    assert otel.spans() == []
    assert otel.count("settle.reservations", **{"settle.namespace": namespace}) == 4
    assert (
        otel.count(
            "settle.reservations", **{"settle.namespace": namespace, "settle.outcome": "replayed"}
        )
        == 1
    )
    assert (
        otel.count(
            "settle.settlements", **{"settle.namespace": namespace, "settle.verdict": "accepted"}
        )
        == 3
    )
    assert otel.count("settle.call.duration", **{"settle.namespace": namespace}) == 7


def test_counts_stay_exact_under_threads(redis_url: str, namespace: str, otel: Telemetry) -> None:
    """Eight threads reserving and completing at once: every reservation and settlement is
    counted once (settle counts in-process and the reader collects the counts)."""
    s = Settler.from_url(redis_url, namespace=namespace)

    def work(worker: int) -> None:
        for n in range(25):
            r = s.reserve(f"op-{worker}-{n}", {"n": n}, principal=PRINCIPAL)
            s.complete(r.reservation, {"ok": n})

    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(work, range(8)))
    finally:
        s.close()
    ns = {"settle.namespace": namespace}
    assert otel.count("settle.reservations", **ns, **{"settle.outcome": "reserved"}) == 200
    assert otel.count("settle.settlements", **ns, **{"settle.action": "complete"}) == 200


def test_a_call_duration_lands_in_a_bucket_near_its_value(
    settler: Settler, namespace: str, otel: Telemetry
) -> None:
    # A percentile read from the buckets (Prometheus' histogram_quantile, docs/observability
    # .md) is only as fine as the bucket the durations fall in: with the SDK's default
    # boundaries (made for milliseconds) every call of a few hundred microseconds fell in
    # (0, 5 s], and the p99 of a call read as about 5 s.
    for n in range(20):
        r = settler.reserve(f"op-{n}", {"n": n}, principal=PRINCIPAL)
        settler.complete(r.reservation, {"n": n})
    points = otel.points("settle.call.duration", **{"settle.namespace": namespace})
    assert sum(p.count for p in points) == 40
    for point in points:
        bounds = list(point.explicit_bounds)
        # The bucket of the slowest call: no wider than 2.5 times its duration.
        upper = next(b for b in [*bounds, float("inf")] if point.max <= b)
        assert upper <= max(2.5 * point.max, bounds[0]), (point.max, bounds)


def _one_call_pipeline_is_that_call(otel: Telemetry, port: int) -> None:
    """A pipeline of one call is reported as that call: the semantic conventions say a
    batch size SHOULD never be 1. Two or more keep ``PIPELINE`` and their size."""
    script = script_operation(port)
    one, four = otel.spans("settle.quarantine.list")
    # The last Redis call of each listing reads the quarantine (the async settler's
    # namespace is set up by its first call, inside it).
    alone = otel.children(one)[-1]
    assert alone.name == f"{script} quarantine_read"
    assert alone.attributes["db.operation.name"] == script
    assert alone.attributes["db.stored_procedure.name"] == "quarantine_read"
    assert "db.operation.batch.size" not in alone.attributes
    batch = otel.children(four)[-1]
    assert batch.name == batch.attributes["db.operation.name"] == "PIPELINE"
    assert batch.attributes["db.operation.batch.size"] == 4
    # Nor any other pipeline of one call (the claim of a one-shard namespace's setup).
    sizes = {s.attributes.get("db.operation.batch.size") for s in otel.spans()}
    assert 1 not in sizes
    assert "PIPELINE" not in {
        s.name for s in otel.spans() if s.attributes.get("db.operation.batch.size") is None
    }


def test_a_pipeline_of_one_call_is_that_call(
    redis_url: str, namespace: str, otel: Telemetry
) -> None:
    with (
        Settler.from_url(redis_url, namespace=namespace, shards=1) as one,
        Settler.from_url(redis_url, namespace=f"{namespace}-4", shards=4) as four,
    ):
        one.quarantine.list()
        four.quarantine.list()
        port = int(one.client.connection_pool.connection_kwargs["port"])
    _one_call_pipeline_is_that_call(otel, port)


@pytest.mark.asyncio
async def test_an_async_pipeline_of_one_call_is_that_call(
    redis_url: str, namespace: str, otel: Telemetry
) -> None:
    one = AsyncSettler.from_url(redis_url, namespace=namespace, shards=1)
    four = AsyncSettler.from_url(redis_url, namespace=f"{namespace}-4", shards=4)
    try:
        await one.quarantine.list()
        await four.quarantine.list()
        port = int(one.client.connection_pool.connection_kwargs["port"])
    finally:
        await one.aclose()
        await four.aclose()
    _one_call_pipeline_is_that_call(otel, port)


def test_a_settler_checked_at_start_reports_its_set_up_in_one_trace(
    redis_url: str, namespace: str, otel: Telemetry
) -> None:
    """``with Settler.from_url(...)`` (or ``check()``) sets the namespace up before any
    call: its Redis spans are in the caller's trace, under its current span, and without
    one in a trace of their own (``settle.check``), not each a root trace of its own."""
    tracer = trace.get_tracer("tests")
    with (
        tracer.start_as_current_span("caller") as caller,
        Settler.from_url(redis_url, namespace=namespace, shards=4),
    ):
        pass
    with Settler.from_url(redis_url, namespace=namespace, shards=4) as s:
        s.reserve("op-1", {}, principal=PRINCIPAL)  # checked: its own spans only
    redis_spans = [s for s in otel.spans() if (s.attributes or {}).get("db.system.name")]
    first = [s for s in redis_spans if s.context.trace_id == caller.get_span_context().trace_id]
    assert first  # the set-up, under the caller
    assert {s.attributes["db.operation.name"] for s in first} >= {"EXISTS"}
    roots = [s for s in otel.spans() if s.parent is None and s.name != "caller"]
    assert [s.name for s in roots] == ["settle.check", "settle.reserve"], [s.name for s in roots]
    check = roots[0]
    assert check.attributes["settle.namespace"] == namespace
    for span in redis_spans:
        assert span.parent is not None, span.name  # no lone Redis root


def test_a_pipeline_of_one_script_names_it_and_stays_a_pipeline(
    settler: Settler, otel: Telemetry
) -> None:
    """A batch whose calls all run one script names it in ``db.stored_procedure.name``, as
    the database conventions ask of a batch of one stored procedure; ``db.operation.name``
    and the span's name stay ``PIPELINE`` (what dashboards filter on, the same whether the
    server runs FCALL or EVALSHA), not the Redis conventions' ``PIPELINE FCALL``."""
    settler.reserve("op-1", {}, principal=PRINCIPAL)
    otel.exporter.clear()
    settler.quarantine.list()
    batch = otel.children(otel.span("settle.quarantine.list"))[-1]
    assert batch.name == batch.attributes["db.operation.name"] == "PIPELINE"
    assert batch.attributes["db.operation.batch.size"] == 4
    assert batch.attributes["db.stored_procedure.name"] == "quarantine_read"


@pytest.mark.asyncio
async def test_an_async_settler_checked_at_start_reports_its_set_up_under_the_caller(
    redis_url: str, namespace: str, otel: Telemetry
) -> None:
    """``async with AsyncSettler.from_url(...)``: the set-up is one ``settle.check`` span
    under the caller's current span, its Redis calls inside, as the sync settler's."""
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("caller") as caller:
        async with AsyncSettler.from_url(redis_url, namespace=namespace, shards=4):
            pass
    check = otel.span("settle.check")
    assert check.parent is not None
    assert check.parent.span_id == caller.get_span_context().span_id
    redis_spans = [s for s in otel.spans() if (s.attributes or {}).get("db.system.name")]
    assert redis_spans
    assert {s.parent.span_id for s in redis_spans if s.parent} == {check.context.span_id}
    assert all(s.parent is not None for s in redis_spans)


@pytest.mark.parametrize("first", ["get_many", "quarantine.list"])
def test_a_first_call_keeps_the_set_up_in_its_own_span(
    redis_url: str, namespace: str, otel: Telemetry, first: str
) -> None:
    """A settler not checked at start sets the namespace up in its first call, whichever
    path that call checks through (``get_many`` and the quarantine listing ask first
    whether the server is a cluster): the set-up's Redis calls are in that call's span, no
    ``settle.check`` span is made; and ``check()`` on a settler already checked reports
    nothing (a readiness probe calling it makes no span)."""
    settler = Settler.from_url(redis_url, namespace=namespace, shards=4)
    try:
        if first == "get_many":
            settler.get_many(["op-1", "op-2"])
        else:
            settler.quarantine.list()
        settler.check()
        with settler:
            pass
    finally:
        settler.close()
    roots = [s.name for s in otel.spans() if s.parent is None]
    assert roots == [f"settle.{first}"], roots
    assert otel.spans("settle.check") == []


def test_a_pipeline_of_several_scripts_names_none(redis_url: str, otel: Telemetry) -> None:
    """``db.stored_procedure.name`` on a ``PIPELINE`` span only when every call of the
    batch runs the same script: a batch of two scripts names neither."""
    hooks = telemetry()
    client = redis.Redis.from_url(redis_url)
    mixed = [SimpleNamespace(script="get", keys=["a"]), SimpleNamespace(script="claim", keys=[])]
    same = [SimpleNamespace(script="get", keys=["a"]), SimpleNamespace(script="get", keys=[])]
    try:
        with hooks.pipeline(client, "EVALSHA", mixed):
            pass
        with hooks.pipeline(client, "EVALSHA", same):
            pass
    finally:
        client.close()
    first, second = otel.spans("PIPELINE")
    assert first.attributes["db.operation.batch.size"] == 2
    assert "db.stored_procedure.name" not in first.attributes
    assert second.attributes["db.stored_procedure.name"] == "get"


def test_the_set_up_is_no_call_in_the_call_duration(
    redis_url: str, namespace: str, otel: Telemetry
) -> None:
    """``settle.call.duration`` is the duration of the calls an application makes
    (``reserve``, ``complete``...), what a latency dashboard and its alerts read: the
    set-up ``with Settler.from_url(...)`` does at start (``settle.check``, with the server's
    checks and a script load, far slower than a call) adds no series of its own there."""
    with Settler.from_url(redis_url, namespace=namespace, shards=4) as settler:
        settler.reserve("op-1", {}, principal=PRINCIPAL)
    assert otel.span("settle.check").attributes["settle.namespace"] == namespace
    ns = {"settle.namespace": namespace}
    assert otel.count("settle.call.duration", **ns, **{"settle.call.name": "reserve"}) == 1
    assert otel.count("settle.call.duration", **ns, **{"settle.call.name": "check"}) == 0
