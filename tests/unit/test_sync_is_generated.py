"""The sync shells (settle/_sync, settle/cursor/_sync.py, settle/progress/_sync) are generated
from the async ones by scripts/unasync.py; they must not drift, and the async shell must
really be async (every public method of AsyncSettler a coroutine function)."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

from settle import AsyncSettler, Settler
from settle._async.settler import AsyncQuarantine
from settle._sync.settler import Quarantine

ROOT = Path(__file__).resolve().parents[2]


def test_sync_shell_matches_its_generator() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "unasync.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _public(cls: type) -> dict[str, object]:
    return {n: m for n, m in vars(cls).items() if not n.startswith("_") and callable(m)}


def test_async_shell_is_really_async_and_surfaces_match() -> None:
    for async_cls, sync_cls in ((AsyncSettler, Settler), (AsyncQuarantine, Quarantine)):
        a, s = _public(async_cls), _public(sync_cls)
        assert {n.replace("aclose", "close") for n in a} == set(s)
        for name, fn in a.items():
            if isinstance(fn, classmethod | staticmethod):
                continue
            if name == "operation":  # a decorator factory: what it returns is awaited
                continue
            assert inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn), name
            assert not inspect.iscoroutinefunction(s[name.replace("aclose", "close")]), name
