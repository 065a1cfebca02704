"""Requests given as pydantic models, ported from aws-lambda-powertools' idempotency tests
(``_pydantic/test_idempotency_uuid_serialization.py``, ``test_idempotency_hash_serialization.py``):
a model's request fingerprint is the same in every process, and a model with no canonical
form is refused with settle's typed error before anything runs or is written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from settle import FingerprintError, Settler, fingerprint

ROOT = Path(__file__).resolve().parents[2]


class Tagged(BaseModel):
    order_id: str
    tags: set[str]


class Attachment(BaseModel):
    order_id: str
    data: bytes


class Opaque(BaseModel):
    order_id: str
    extra: object


def test_a_model_holding_a_set_fingerprints_alike_in_every_process() -> None:
    """Pydantic's JSON mode writes a set as a list in iteration order, which follows the
    per-process string hash: the same request must not get another fingerprint in another
    worker (its retry would be refused as a different request)."""
    code = (
        "from pydantic import BaseModel\n"
        "from settle import fingerprint\n"
        "class Tagged(BaseModel):\n"
        "    order_id: str\n"
        "    tags: set[str]\n"
        "try:\n"
        "    tagged = Tagged(order_id='o-1', tags={'gift', 'express', 'fragile', 'eu'})\n"
        "    print(fingerprint(tagged))\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__)\n"
    )
    outputs = set()
    for seed in ("1", "2", "3", "4", "5"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outputs.add(done.stdout.strip())
    assert len(outputs) == 1, outputs
    # SPEC 1: a set has no canonical JSON form, inside a model as anywhere else.
    with pytest.raises(FingerprintError):
        fingerprint(Tagged(order_id="o-1", tags={"gift"}))


@pytest.mark.parametrize(
    "request_",
    [Attachment(order_id="o-1", data=b"\xff\xfe"), Opaque(order_id="o-1", extra=object())],
    ids=["bytes-not-utf8", "unknown-object"],
)
def test_a_model_pydantic_cannot_dump_is_a_fingerprint_error_and_nothing_runs(
    settler: Settler, request_: BaseModel
) -> None:
    runs: list[str] = []

    @settler.operation(key="ship:{request.order_id}", principal="tenant:acme")
    def ship(request: BaseModel) -> str:
        runs.append("ran")
        return "shipped"

    with pytest.raises(FingerprintError):
        ship(request_)
    with pytest.raises(FingerprintError):
        settler.reserve("ship:o-1", request_, principal="tenant:acme")
    assert runs == []
    assert settler.get("ship:o-1") is None
