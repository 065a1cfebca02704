"""A Redis call that fails is named on its client span by what Redis or redis-py said, as
the Redis semantic conventions ask: ``db.response.status_code``, the error prefix of a
Redis error reply (``OOM``, ``ERR``...), with ``error.type`` matching it; else the class of
redis-py's exception (``ConnectionError``). The span said ``BackendError``, settle's own
wrapper the caller gets, and no status code: an operator could not tell a full Redis from
an unreachable one on the Redis span ("if the original exception is wrapped into a generic
one, the original exception SHOULD be preferred"). The settle call's own span still names
what the caller got. A real redis-server of the test's own, the real SDK."""

from __future__ import annotations

import asyncio

import pytest
import redis
from opentelemetry.sdk.trace import ReadableSpan

from settle import AsyncSettler, BackendError, ConfigurationError, Settler
from settle.embedded import EmbeddedRedis
from tests.telemetry.conftest import Telemetry


def _client_spans(otel: Telemetry, script: str) -> list[ReadableSpan]:
    return [
        s
        for s in otel.spans()
        if s.kind.name == "CLIENT" and s.attributes.get("db.stored_procedure.name") == script
    ]


def test_a_redis_error_reply_is_its_status_code_on_the_client_span(otel: Telemetry) -> None:
    with EmbeddedRedis() as server:
        settler = Settler.from_url(server.url, namespace="full")
        try:
            settler.reserve("op-1", {"n": 1}, principal="tenant:a")  # the namespace set up
            with redis.Redis.from_url(server.url) as admin:
                admin.config_set("maxmemory", 1)  # every write refused: OOM
                otel.exporter.clear()
                with pytest.raises(BackendError) as raised:
                    settler.reserve("op-2", {"n": 1}, principal="tenant:a")
                admin.config_set("maxmemory", 0)
        finally:
            settler.close()
    cause = raised.value.__cause__
    assert isinstance(cause, redis.ResponseError)
    code = cause.status_code  # what redis-py read: OOM, or ERR around a 6.2 script's error
    assert code in ("OOM", "ERR")
    [span] = _client_spans(otel, "reserve")
    assert not span.status.is_ok
    assert span.attributes["db.response.status_code"] == code
    assert span.attributes["error.type"] == code
    assert otel.span("settle.reserve").attributes["error.type"] == "BackendError"


def test_an_unreachable_redis_is_redis_pys_error_on_the_client_span(otel: Telemetry) -> None:
    server = EmbeddedRedis().start()
    settler = Settler.from_url(server.url, namespace="gone")
    try:
        settler.reserve("op-1", {"n": 1}, principal="tenant:a")
        server.stop()
        otel.exporter.clear()
        with pytest.raises(BackendError) as raised:
            settler.reserve("op-2", {"n": 1}, principal="tenant:a")
    finally:
        settler.close()
        server.stop()
    assert isinstance(raised.value.__cause__, redis.ConnectionError)
    [span] = _client_spans(otel, "reserve")
    assert span.attributes["error.type"] == "ConnectionError"
    assert "db.response.status_code" not in span.attributes


@pytest.mark.asyncio
async def test_async_redis_errors_are_named_alike(otel: Telemetry) -> None:
    """The asyncio runner, two calls at once: the second goes in a pipelined batch."""
    with EmbeddedRedis() as server:
        settler = AsyncSettler.from_url(server.url, namespace="full")
        try:
            await settler.reserve("op-1", {"n": 1}, principal="tenant:a")
            with redis.Redis.from_url(server.url) as admin:
                admin.config_set("maxmemory", 1)
                otel.exporter.clear()
                raised = await asyncio.gather(
                    settler.reserve("op-2", {"n": 1}, principal="tenant:a"),
                    settler.reserve("op-3", {"n": 1}, principal="tenant:a"),
                    return_exceptions=True,
                )
                admin.config_set("maxmemory", 0)
        finally:
            await settler.aclose()
    codes = set()
    for error in raised:
        assert isinstance(error, BackendError)
        assert isinstance(error.__cause__, redis.ResponseError)
        codes.add(error.__cause__.status_code)
    spans = _client_spans(otel, "reserve")
    assert len(spans) == 2
    for span in spans:
        assert span.attributes["db.response.status_code"] in codes
        assert span.attributes["error.type"] == span.attributes["db.response.status_code"]


def test_a_refused_password_is_its_status_code_too(otel: Telemetry) -> None:
    """redis-py makes some error replies errors of a connection, not ``ResponseError``
    (``NOAUTH`` and ``WRONGPASS``: ``AuthenticationError``; ``LOADING``:
    ``BusyLoadingError``), though Redis answered them: their prefix is the status code all
    the same (it said ``AuthenticationError`` alone)."""
    with EmbeddedRedis() as server:
        settler = Settler.from_url(server.url, namespace="locked")
        try:
            settler.reserve("op-1", {"n": 1}, principal="tenant:a")
            with redis.Redis.from_url(server.url) as admin:
                admin.config_set("requirepass", "s3cret")
            settler.client.connection_pool.disconnect()  # the next call connects again
            otel.exporter.clear()
            with pytest.raises(ConfigurationError) as raised:
                settler.reserve("op-2", {"n": 1}, principal="tenant:a")
        finally:
            settler.close()
    cause = raised.value.__cause__
    assert isinstance(cause, redis.AuthenticationError)
    spans = [s for s in otel.spans() if s.kind.name == "CLIENT" and not s.status.is_ok]
    assert spans
    for span in spans:
        assert span.attributes["db.response.status_code"] == "NOAUTH"
        assert span.attributes["error.type"] == "NOAUTH"


def test_a_batch_copy_of_an_error_reply_keeps_its_status_code() -> None:
    """The asyncio runner gives each call of a failed batch a copy of the batch's error
    (``_own``), which redis-py's ``status_code`` does not survive: the code is read of the
    error it copies. redis-py's own parser makes the errors, as on the wire."""
    from redis._parsers.base import BaseParser  # noqa: PLC0415  # redis-py's reply parser

    from settle._runtime._async import _own  # noqa: PLC0415
    from settle._telemetry import _status_code  # noqa: PLC0415

    for reply, code in [
        ("OOM command not allowed when used memory > 'maxmemory'.", "OOM"),  # prefix cut
        ("WRONGTYPE Operation against a key holding the wrong kind of value", "WRONGTYPE"),
        ("NOAUTH Authentication required.", "NOAUTH"),  # an AuthenticationError
    ]:
        error = BaseParser.parse_error(reply)
        copy = _own(error)
        assert copy is not error
        assert _status_code(copy) == code
