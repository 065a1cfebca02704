"""The public surface stays small (SPEC 5) and type-checks as a user writes it."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from mypy import api

ROOT = Path(__file__).resolve().parents[2]
LIMITS = {"settle": 25, "settle.cursor": 20, "settle.progress": 20}
#: SPEC 5 names these; they must stay importable from the top-level package.
SPEC_NAMES = {
    "Settler", "AsyncSettler", "SettleConfig", "Reservation", "OperationRecord", "State",
    "Verdict", "Reserved", "Replay", "InProgress", "Settlement", "Attempt", "fingerprint",
    "SettleError", "FingerprintError", "FingerprintMismatch", "BindingMismatch",
    "OperationInProgress", "StaleAttempt", "OperationFailed", "DurabilityError",
}  # fmt: skip


@pytest.mark.parametrize(("package", "limit"), LIMITS.items())
def test_each_package_exports_few_names_and_every_one_exists(package: str, limit: int) -> None:
    module = importlib.import_module(package)
    names = module.__all__
    assert len(names) <= limit, f"{package} exports {len(names)} names, at most {limit}"
    assert len(set(names)) == len(names)
    missing = [n for n in names if not hasattr(module, n)]
    assert not missing, f"{package}.__all__ names what it does not have: {missing}"


def test_the_spec_names_are_exported_by_settle() -> None:
    assert set(importlib.import_module("settle").__all__) >= SPEC_NAMES


def test_the_public_api_type_checks_under_mypy_strict() -> None:
    target = ROOT / "tests" / "typecheck" / "public_api.py"
    out, err, status = api.run(["--strict", "--no-error-summary", str(target)])
    assert status == 0, out + err
