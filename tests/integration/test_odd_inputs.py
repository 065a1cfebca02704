"""Typed errors for odd inputs (issue 16): every bad SettleConfig field is an InvalidInput
(a SettleError), NaN and the infinities are refused in results as in requests, reasons and
notes refuse control characters, operation ids refuse line and paragraph separators, and
nothing is written for any of them. Log digests of principals are keyed."""

from __future__ import annotations

import hashlib
import hmac
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError

from settle import (
    AsyncSettler,
    FingerprintError,
    Reserved,
    SettleConfig,
    SettleError,
    Settler,
)
from settle.errors import InvalidInput
from settle.testing import MemorySettler


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("namespace", "bad ns"),
        ("namespace", ""),
        ("namespace", 7),
        ("shards", 0),
        ("shards", 4097),
        ("shards", "many"),
        ("lease", 0),
        ("lease", 86_401),
        ("retention", -1),
        ("retention", 1e12),  # past 1000 years
        ("quarantine_maxlen", 2**53 + 1),
        ("max_result_bytes", 0),
        ("quarantine_payload_bytes", -1),
        ("quarantine_maxlen", 0),
        ("attempt_log_size", 0),
        ("attempt_log_size", 1),  # S13 needs the entry before a takeover's
        ("attempt_log_size", 10_001),
        ("min_replicas", -1),
        ("replica_timeout", 0),
        ("no_such_field", 1),
        # A bool is no number: read as 1 it made one shard, a one-second lease, a cap of 1.
        ("shards", True),
        ("lease", True),
        ("retention", True),
        ("quarantine_maxlen", True),
        ("min_replicas", False),
    ],
)
def test_every_bad_config_field_is_a_settle_error(field: str, value: Any) -> None:
    with pytest.raises(InvalidInput) as info:
        SettleConfig(**{field: value})
    error = info.value
    assert isinstance(error, SettleError)
    assert isinstance(error, ValueError)  # as pydantic's ValidationError was
    assert not isinstance(error, ValidationError)
    assert field in str(error)
    assert isinstance(error.__cause__, ValidationError)
    with pytest.raises(InvalidInput):
        SettleConfig.model_validate({field: value})


@pytest.mark.parametrize("namespace", ["bad ns", "", "n" * 65, "ns\n", "né", "a:b", "{tag}"])
def test_a_bad_namespace_is_refused_with_what_a_namespace_may_hold(
    redis_url: str, namespace: str
) -> None:
    """The refusal said pydantic's regex (String should match pattern '^[A-Za-z0-9_.\\-]
    {1,64}$'); it says, in words, what a namespace may hold."""
    said = "invalid SettleConfig: namespace: must be 1 to 64 characters of A-Z a-z 0-9 _ . -"
    makers: list[Callable[[], object]] = [
        lambda: SettleConfig(namespace=namespace),
        lambda: SettleConfig.model_validate({"namespace": namespace}),
        lambda: Settler.from_url(redis_url, namespace=namespace),
        lambda: AsyncSettler.from_url(redis_url, namespace=namespace),
        lambda: MemorySettler(namespace=namespace),
    ]
    for make in makers:
        with pytest.raises(InvalidInput) as info:
            make()
        assert str(info.value) == said
    for good in ("n", "n" * 64, "Tenant_1.prod-eu"):
        assert SettleConfig(namespace=good).namespace == good


def test_config_across_fields_and_through_the_settlers(redis_url: str) -> None:
    with pytest.raises(InvalidInput, match="retention must be at least the lease"):
        SettleConfig(lease=60, retention=30)
    with pytest.raises(InvalidInput, match="namespace"):
        Settler.from_url(redis_url, namespace="bad ns")
    with pytest.raises(InvalidInput, match="shards"):
        MemorySettler(shards=0)
    assert SettleConfig(namespace="ok.ns-1", shards=4).shards == 4
    # Settings read from the environment are text: a number written out still counts.
    assert SettleConfig(shards="4", lease="2.5").model_dump(include={"shards", "lease"}) == {
        "shards": 4,
        "lease": 2.5,
    }


NON_FINITE = [float("nan"), float("inf"), float("-inf")]


@pytest.mark.parametrize("value", NON_FINITE)
def test_nan_and_infinity_in_results_are_refused_and_nothing_is_written(
    settler: Settler, value: float
) -> None:
    r = settler.reserve("order-nan", {"a": 1}, principal="p")
    assert isinstance(r, Reserved)
    before = settler.get("order-nan")
    for result in ({"amount": value}, [1, value], value):
        with pytest.raises(FingerprintError, match="no JSON form") as info:
            settler.complete(r.reservation, result)
        assert info.value.operation_id == "order-nan"
    assert settler.get("order-nan") == before  # still pending, same version
    # the word in a string is no number: stored as it is
    done = settler.complete(r.reservation, {"note": "NaN Infinity"})
    assert done.record is not None
    assert done.record.value(dict) == {"note": "NaN Infinity"}


def test_nan_in_a_result_is_refused_by_the_reference_model_too() -> None:
    memory = MemorySettler(namespace="nan")
    r = memory.reserve("x", {"a": 1}, principal="p")
    assert isinstance(r, Reserved)
    with pytest.raises(FingerprintError):
        memory.complete(r.reservation, {"v": float("nan")})
    with pytest.raises(FingerprintError):  # as in a request
        memory.reserve("y", {"v": float("nan")}, principal="p")


CONTROLS = ["a\x1bb", "line\nbreak", "tab\there", "bell\x07", "nel\x85", "rlo\u202e", "zw\u200d"]


@pytest.mark.parametrize("reason", CONTROLS)
def test_a_reason_with_control_characters_is_refused(settler: Settler, reason: str) -> None:
    r = settler.reserve("order-reason", {"a": 1}, principal="p")
    assert isinstance(r, Reserved)
    before = settler.get("order-reason")
    with pytest.raises(InvalidInput, match="reason must not contain control characters"):
        settler.mark_provisional(r.reservation, reason)
    assert settler.get("order-reason") == before


def _stale_entry(settler: Settler) -> str:
    first = settler.reserve("order-note", {"a": 1}, principal="p", lease=0.05)
    assert isinstance(first, Reserved)
    time.sleep(0.1)
    second = settler.reserve("order-note", {"a": 1}, principal="p", lease=5)
    assert isinstance(second, Reserved)
    settler.complete(second.reservation, {"ok": 2})
    late = settler.complete(first.reservation, {"ok": 1})
    assert late.quarantine_id is not None
    return late.quarantine_id


def test_a_note_with_a_lone_surrogate_is_refused_for_what_it_is(settler: Settler) -> None:
    """A note typed where a terminal sent bytes that were not UTF-8 (``settle quarantine
    resolve --note`` reads argv with surrogateescape) was refused as holding "control
    characters or line breaks", which it does not; the message now names what it holds,
    as the operation id's and the principal's do. Nothing is resolved."""
    qid = _stale_entry(settler)
    for note in ["refunded \udcff", "\ud800 checked"]:
        with pytest.raises(InvalidInput, match="lone surrogate") as refused:
            settler.quarantine.resolve(qid, note=note)
        assert "control characters" not in str(refused.value)
    assert settler.quarantine.get(qid).resolution is None


def test_a_note_with_control_characters_is_refused(settler: Settler) -> None:
    qid = _stale_entry(settler)
    for note in [*CONTROLS, "para\u2029graph", "\r\n"]:
        with pytest.raises(InvalidInput, match="note must not contain control characters"):
            settler.quarantine.resolve(qid, note=note)
    assert settler.quarantine.get(qid).resolution is None
    settler.quarantine.resolve(qid, note="checked with the provider: refunded")
    assert settler.quarantine.get(qid).resolution is not None


@pytest.mark.parametrize(
    "operation_id",
    [
        "a\u2028b",  # line separator
        "a\u2029b",  # paragraph separator
        "a\x85b",  # next line (NEL)
        "a\x0bb",  # vertical tab
        "a\x0cb",  # form feed
        "a\rb",
        "a\nb",
        "a\u202eb",  # right-to-left override
    ],
)
def test_operation_ids_refuse_line_breaks_and_separators(
    settler: Settler, redis_client: Any, operation_id: str
) -> None:
    with pytest.raises(InvalidInput, match="operation id must not contain control characters"):
        settler.reserve(operation_id, {"a": 1}, principal="p")
    with pytest.raises(InvalidInput):
        MemorySettler().reserve(operation_id, {"a": 1}, principal="p")
    assert not redis_client.keys(f"*{settler.config.namespace}*:op:*")


def test_an_id_or_principal_from_bytes_that_were_not_utf8_is_refused_in_those_words(
    settler: Settler,
) -> None:
    """A lone surrogate (argv or the environment decoded with surrogateescape) is refused as
    text that was not UTF-8, not only as a "control character" the caller cannot see."""
    with pytest.raises(InvalidInput, match="not UTF-8 text"):
        settler.reserve("order-\udcff", {"a": 1}, principal="p")
    with pytest.raises(InvalidInput, match="not UTF-8 text"):
        settler.reserve("order-1", {"a": 1}, principal="tenant-\udcff")


def test_confusable_ids_are_distinct_operations(settler: Settler) -> None:
    """Ids are compared code point by code point, never normalized (docs/concepts.md)."""
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    first = settler.reserve(nfc, {"a": 1}, principal="p")
    second = settler.reserve(nfd, {"a": 1}, principal="p")
    assert isinstance(first, Reserved)
    assert isinstance(second, Reserved)


def _digest_in_a_process(principal: str, key: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "SETTLE_DIGEST_KEY"}
    if key is not None:
        env["SETTLE_DIGEST_KEY"] = key
    code = "import sys; from settle._log import binding_digest; print(binding_digest(sys.argv[1]))"
    done = subprocess.run(
        [sys.executable, "-c", code, principal],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return done.stdout.strip()


def test_log_digests_of_principals_are_keyed_per_deployment() -> None:
    principal = "user:1042"
    unkeyed = hashlib.sha256(principal.encode()).hexdigest()[:12]
    keyed = _digest_in_a_process(principal, "deployment-secret")
    assert keyed == hmac.new(b"deployment-secret", principal.encode(), "sha256").hexdigest()[:12]
    assert keyed != unkeyed  # a dictionary of user ids does not reverse it
    assert _digest_in_a_process(principal, "deployment-secret") == keyed  # across processes
    assert _digest_in_a_process(principal, "another-secret") != keyed
    # without a configured secret each process draws its own
    assert _digest_in_a_process(principal, None) != _digest_in_a_process(principal, None)
    assert _digest_in_a_process(principal, None) != unkeyed
