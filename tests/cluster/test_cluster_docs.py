"""The "Redis Cluster / Connecting" example of docs/operations.md runs as written against a
real 3-primary cluster (its addresses and password put to the test cluster's), and each
settler it makes reserves and reads an operation on it."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

import pytest

from settle import AsyncSettler, Reserved, Settler
from tests.cluster.cluster_support import LocalCluster

pytestmark = [pytest.mark.cluster]

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def connecting_block() -> str:
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("### Connecting") :]
    start = section.index("```python\n") + len("```python\n")
    return section[start : section.index("\n```", start)]


def test_the_connecting_example_of_operations_md_runs(
    cluster: LocalCluster, namespace: str
) -> None:
    block = connecting_block()
    a, b = (f"127.0.0.1:{port}" for _, port in cluster.startup_nodes[:2])
    given = {
        '"redis://10.0.0.5:6379/0"': repr(cluster.url),
        '"10.0.0.5:6379"': repr(a),
        '"10.0.0.6:6379"': repr(b),
        '"password": "..."': '"password": None',  # the test cluster has none
        '"payments"': repr(namespace),
    }
    for written, here in given.items():
        assert written in block, f"docs/operations.md's example lost {written}"
        block = block.replace(written, here)

    scope: dict[str, Any] = {}
    made: list[Settler | AsyncSettler] = []
    for statement in ast.parse(block).body:  # each statement in turn, as a reader runs it
        exec(compile(ast.Module([statement], []), str(DOC), "exec"), scope)
        settler = scope.get("settler")
        if isinstance(settler, Settler | AsyncSettler) and all(settler is not s for s in made):
            made.append(settler)
    assert [type(s) for s in made] == [Settler, Settler, AsyncSettler]

    for i, settler in enumerate(made):
        op = f"doc-cluster-{i}"
        if isinstance(settler, Settler):
            with settler:
                assert isinstance(settler.reserve(op, {"n": i}, principal="t"), Reserved)
                assert settler.get(op) is not None
        else:

            async def use(s: AsyncSettler = settler, op: str = op, i: int = i) -> None:
                async with s:
                    assert isinstance(await s.reserve(op, {"n": i}, principal="t"), Reserved)
                    assert await s.get(op) is not None

            asyncio.run(use())
