"""The Redis key layout of SPEC 4: one hash tag per (namespace, shard)."""

from __future__ import annotations

import hashlib
import re

from hypothesis import given
from hypothesis import strategies as st

from settle._core.codec import RECORD_FIELDS
from settle._core.keys import Keys, shard_of
from settle._runtime.scripts import _read

op_ids = st.text(
    alphabet=st.characters(blacklist_categories=("Cc", "Cf", "Cs")), min_size=1, max_size=256
)


def _tag(key: str) -> str:
    # Redis Cluster hashes the part between the first '{' and the next '}'.
    start = key.index("{")
    return key[start + 1 : key.index("}", start)]


@given(op_ids)
def test_every_key_of_an_operation_shares_its_shards_hash_tag(op: str) -> None:
    keys = Keys("payments", 16)
    shard = shard_of(op, 16)
    tags = {
        _tag(keys.record(op)),
        _tag(keys.attempt_log(op)),
        _tag(keys.generation(shard)),
        _tag(keys.quarantine(shard)),
        _tag(keys.resolutions(shard)),
    }
    assert tags == {f"payments:{shard}"}


def test_shard_is_a_fixed_function_of_the_id() -> None:
    # A shard must never change between versions or processes: records would be lost.
    digest = hashlib.sha256(b"order-42").digest()
    assert shard_of("order-42", 16) == int.from_bytes(digest[:8], "big") % 16


def test_shards_are_spread() -> None:
    counts = [0] * 8
    for i in range(8000):
        counts[shard_of(f"op-{i}", 8)] += 1
    assert min(counts) > 800


def test_key_names_follow_the_spec_layout() -> None:
    keys = Keys("payments", 4)
    assert re.fullmatch(r"settle:\{payments:\d\}:op:order-42", keys.record("order-42"))
    assert keys.generation(3) == "settle:{payments:3}:gen"


def test_the_scripts_return_the_record_fields_in_the_order_the_decoder_reads() -> None:
    lua = _read("settle", "_lib")
    block = lua[lua.index("local FIELDS = {") : lua.index("}", lua.index("local FIELDS = {"))]
    assert tuple(re.findall(r"'(\w+)'", block)) == RECORD_FIELDS


@given(op_ids, st.sampled_from([1, 4, 16]))
def test_stats_recognizes_exactly_the_record_keys_of_a_namespace(op: str, shards: int) -> None:
    """``settle stats`` counts a key only if it is the record key of the id it names: an
    attempt log whose id contains ``}:op:`` matches the SCAN pattern and is no record."""
    from settle.cli.stats import operation_id_of  # noqa: PLC0415 - needs the cli extra

    keys = Keys("payments", shards)
    assert operation_id_of(keys.record(op), keys) == op
    assert operation_id_of(keys.record(op).encode(), keys) == op
    assert operation_id_of(keys.attempt_log(op), keys) is None
    assert operation_id_of(Keys("payments.x", shards).record(op), keys) is None
    assert operation_id_of(keys.attempt_log(f"x}}:op:{op}"), keys) is None
