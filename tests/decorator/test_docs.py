"""docs/outbound-calls.md is executed as written, against the test Redis and a real provider
that charges and then answers 503 (so the example's retry really happens)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from settle import Settler, State
from tests.decorator.provider import Provider

DOC = Path(__file__).resolve().parents[2] / "docs" / "outbound-calls.md"


def test_the_charge_example_runs_and_charges_once(
    redis_url: str,
    namespace: str,
    provider: Provider,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    blocks = re.findall(r"^```python\n(.*?)^```$", DOC.read_text(), flags=re.S | re.M)
    assert len(blocks) >= 2
    monkeypatch.setenv("SETTLE_REDIS_URL", redis_url)
    monkeypatch.setenv("SETTLE_NAMESPACE", namespace)
    monkeypatch.setenv("PAYMENTS_API", provider.url)
    provider.script("A-1001", "fail_after")
    provider.script("A-1002", "decline")

    scope: dict[str, object] = {"__name__": "outbound_calls_doc"}
    try:
        exec(compile("\n".join(blocks), str(DOC), "exec"), scope)
    finally:
        settler = scope.get("settler")
        if isinstance(settler, Settler):
            settler.close()

    assert provider.effects("A-1001") == 1
    assert provider.requests_for("A-1001") == 2  # the 503 after charging, then the retry
    assert provider.requests_for("A-1002") == 1
    out = capsys.readouterr().out
    assert "declined: " in out
    assert out.count("replayed charge:A-1001") == 1  # the caller's own retry, told so
    with Settler.from_url(redis_url, namespace=namespace) as check:
        record = check.get("charge:A-1001")
        declined = check.get("charge:A-1002")
    assert record is not None
    assert record.state is State.COMPLETED
    assert declined is not None
    assert declined.state is State.FAILED
