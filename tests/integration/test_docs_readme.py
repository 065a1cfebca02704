"""Every Python block of README.md runs as it is, in order: the first on the in-memory
model, the others against the test session's real redis-server (``SETTLE_REDIS_URL``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from settle import Settler, State
from settle.embedded import EmbeddedRedis

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_examples_run(
    redis_url: str,
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    blocks = re.findall(r"^```python\n(.*?)^```$", README.read_text("utf-8"), flags=re.S | re.M)
    assert len(blocks) == 3
    monkeypatch.setenv("SETTLE_REDIS_URL", redis_url)
    monkeypatch.setenv("SETTLE_NAMESPACE", namespace)
    scope: dict[str, object] = {"__name__": "readme"}
    exec(compile(blocks[0], str(README), "exec"), scope)
    assert scope["charges"] == ["order-42"]
    for block in blocks[1:]:
        exec(compile(block, str(README), "exec"), scope)
    assert "order-45 is in progress until" in capsys.readouterr().out
    # The README's own check takes [] too (an earlier run charged): the first run charges.
    assert scope["charges"] == ["order-43", "order-44"]
    with Settler.from_url(redis_url, namespace=namespace) as check:
        for op in ("charge:order-43", "order-44"):
            record = check.get(op)
            assert record is not None
            assert record.state is State.COMPLETED
        held = check.get("order-45")
        assert held is not None
        assert held.state is State.PENDING
    # Run again as it is, against the same Redis (a reader who runs the file twice): it
    # failed at its own assertion, as the record in Redis rightly answered the second run.
    # Nothing is charged again.
    again: dict[str, object] = {"__name__": "readme"}
    for block in blocks:
        exec(compile(block, str(README), "exec"), again)
    assert again["charges"] == []


def test_readme_blocks_run_in_one_session_on_their_own_namespace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The README as a reader runs it: its blocks in one session (a REPL, a notebook, one
    file), the Redis ones on the README's own default namespace. Its two ``charge``
    functions share one identity and key, one on the in-memory model and one on Redis: two
    stores, no record shared, so the second is not refused as a redefinition of the first
    (it was, once identity collisions were refused: InvalidInput at its decoration)."""
    blocks = re.findall(r"^```python\n(.*?)^```$", README.read_text("utf-8"), flags=re.S | re.M)
    monkeypatch.delenv("SETTLE_NAMESPACE", raising=False)
    with EmbeddedRedis() as server:  # the default namespace, on a server of its own
        monkeypatch.setenv("SETTLE_REDIS_URL", server.url)
        scope: dict[str, object] = {"__name__": "__main__"}
        for block in blocks:
            exec(compile(block, str(README), "exec"), scope)
        assert scope["charges"] == ["order-43", "order-44"]
