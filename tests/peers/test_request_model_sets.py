"""Sets in a pydantic request model (SPEC 1: the same request, the same fingerprint in
every worker): wherever a set sits in the model, its fingerprint must not depend on the
process's string-hash seed, and a set that cannot be put in one order is refused with
FingerprintError, never fingerprinted in hash order nor raised as a bare TypeError."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from settle import FingerprintError, fingerprint

ROOT = Path(__file__).resolve().parents[2]

_MODELS = """
import enum, uuid
from pydantic import BaseModel
from settle import fingerprint, FingerprintError

class Region(enum.Enum):
    EU = "eu"
    US = "us"

class ByRegion(BaseModel):
    tags: dict[Region, set[str]]

class ById(BaseModel):
    tags: dict[uuid.UUID, set[str]]

class ByFlag(BaseModel):
    tags: dict[bool, set[str]]

class Groups(BaseModel):
    groups: frozenset[frozenset[str]]

WORDS = [f"tag-{i}" for i in range(16)]
CASES = {
    "enum keys": lambda: ByRegion(tags={Region.EU: set(WORDS)}),
    "uuid keys": lambda: ById(tags={uuid.UUID(int=7): set(WORDS)}),
    "bool keys": lambda: ByFlag(tags={True: set(WORDS)}),
    "set of sets": lambda: Groups(groups=frozenset({frozenset(WORDS[:8]), frozenset(WORDS[8:])})),
}
for name, make in CASES.items():
    try:
        print(name, fingerprint(make()))
    except FingerprintError:
        print(name, "refused")
"""


def _outputs(seed: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _MODELS], env=env, capture_output=True, text=True, check=True
    )
    return dict(line.rsplit(" ", 1) for line in done.stdout.strip().splitlines())


def test_sets_under_any_dict_key_or_in_a_set_fingerprint_alike_in_every_process() -> None:
    """A set under a dict key that is not a string or an int (an Enum, a UUID, a bool), and
    a set of frozensets: every worker gets the same answer (one fingerprint, or a refusal
    in each), else a retry from another worker is refused as a different request."""
    runs = [_outputs(seed) for seed in ("1", "2", "3", "4", "5", "6")]
    for name in runs[0]:
        answers = {run[name] for run in runs}
        assert len(answers) == 1, (name, answers)
    # Keys the JSON form writes as strings still get their sets ordered.
    assert runs[0]["enum keys"] != "refused"
    assert runs[0]["uuid keys"] != "refused"


class Sku(BaseModel):
    model_config = ConfigDict(frozen=True)
    sku: str


class Basket(BaseModel):
    items: frozenset[Sku]


def test_a_set_of_frozen_models_is_refused_not_a_type_error() -> None:
    """pydantic's Python-mode dump cannot hold a set of models (their dumps are dicts):
    the caller gets FingerprintError, the error settle documents for a request without a
    canonical form, not a bare TypeError from inside pydantic."""
    with pytest.raises(FingerprintError):
        fingerprint(Basket(items=frozenset({Sku(sku="a"), Sku(sku="b")})))
