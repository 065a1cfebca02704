"""Generate the sync shells from the hand-written asyncio ones.

``settle/_async`` -> ``settle/_sync`` (the core), ``settle/cursor/_async.py`` ->
``settle/cursor/_sync.py`` and ``settle/progress/_async`` -> ``settle/progress/_sync``.
Line-level rewrites in order, as httpcore does it; a rule that no longer matches anything in
its package fails the run, so a rename in the async code cannot silently leave the sync code
stale. (The ``unasync`` package rewrites tokens without context and cannot tell
``redis.asyncio`` from ``asyncio.sleep``.)

    python scripts/unasync.py          # write the sync shells
    python scripts/unasync.py --check  # exit 1 if a sync shell differs from what it would write
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CORE_RULES: list[tuple[str, str]] = [
    (r"from redis\.asyncio import", "from redis import"),
    (r"^import asyncio$", "import time"),
    (r"\basyncio\.sleep\b", "time.sleep"),
    (r"\bAsyncIterator\b", "Iterator"),
    (r"\bAsyncSettler\b", "Settler"),
    (r"\bAsyncQuarantine\b", "Quarantine"),
    (r"\bAsyncRunner\b", "Runner"),
    (r"\bAsyncConnectable\b", "Connectable"),
    (r"settle\._runtime\._async\b", "settle._runtime._sync"),
    (r"\bAsyncBackend\b", "Backend"),
    (r"\bAsyncOperation\b", "Operation"),
    (r"settle\.decorator\._async\b", "settle.decorator._sync"),
    (r"\basync def\b", "def"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    (r"__aenter__", "__enter__"),
    (r"\baclose\b", "close"),
    (r"The asyncio shell\. Hand-written;.*", "The sync shell, GENERATED from ``settle/_async`` by"),
    (
        r"^``scripts/unasync\.py`` \(a test fails when the two drift apart\)\.\"\"\"$",
        '``scripts/unasync.py``: edit the async code and regenerate, never this."""',
    ),
    (r"the asyncio facade", "the synchronous facade"),
]

RUNTIME_RULES: list[tuple[str, str]] = [
    (r"from redis\.asyncio import", "from redis import"),
    (r"from redis\.asyncio\.cluster import", "from redis.cluster import"),
    (r"from redis\.asyncio\.sentinel import", "from redis.sentinel import"),
    (r"from redis\.asyncio\.retry import", "from redis.retry import"),
    (
        r"from collections\.abc import Awaitable, Callable,",
        "from collections.abc import Callable,",
    ),
    (r"Callable\[\[Any\], Awaitable\[Any\]\]", "Callable[[Any], Any]"),
    (r"Awaitable\[None\]", "None"),
    (r"Awaitable\[_T\]", "_T"),
    (r"\basyncio\.Event\b", "threading.Event"),
    (r"\bAsyncRetrying\b", "Retrying"),
    (r"^import asyncio$", "import time"),
    (r"\basyncio\.sleep\b", "time.sleep"),
    (r"\bAsyncConnectable\b", "Connectable"),
    (r"\bAsyncRunner\b", "Runner"),
    (r"\bAsyncSettler\b", "Settler"),
    (r"\bAsyncCursorStore\b", "CursorStore"),
    (r"\bAsyncProgressStore\b", "ProgressStore"),
    # The sync lane checks a kept connection, sends and reads without redis-py's frames
    # (packing.can_read, packing.exchange).
    (r"\bawait conn\.can_read\(\)", "can_read(conn)"),
    (
        r"^from settle\._runtime\.packing import pack_command, retries_as_redis_py, tried$",
        "from settle._runtime.packing import (\n"
        "    can_read,\n"
        "    exchange,\n"
        "    pack_command,\n"
        "    retries_as_redis_py,\n"
        "    tried,\n"
        ")",
    ),
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\bawait ", ""),
    (r"\baclose\b", "close"),
    (r"__aenter__", "__enter__"),
    (r"__aexit__", "__exit__"),
    (r'^"""The asyncio runner:', '"""The sync runner (GENERATED):'),
    (r"objects on a redis-py asyncio$", "objects on a redis-py"),
    (
        r"Cluster\. Hand-written; ``_sync\.py`` is generated from it by$",
        "Cluster. Generated from ``_async.py`` by",
    ),
    (
        r"^``scripts/unasync\.py`` \(a test fails when the two drift apart\)\.$",
        "``scripts/unasync.py``: edit the async code and regenerate, never this.",
    ),
]

CURSOR_RULES: list[tuple[str, str]] = [
    (r"from redis\.asyncio import", "from redis import"),
    (r"\bAsyncRunner\b", "Runner"),
    (r"\bAsyncConnectable\b", "Connectable"),
    (r"settle\._runtime\._async\b", "settle._runtime._sync"),
    (r"Awaitable\[object\] \| object", "object"),  # the async shell takes a plain handler too
    (r"^#: An ``async def`` handler, or a plain function .*", "#: A plain function."),
    (r"Awaitable\[Page\] \| Page", "Page"),  # and a plain fetch_page
    (r"^#: An ``async def`` fetch_page, or a plain function .*", "#: A plain function."),
    (r"from collections\.abc import Awaitable, Callable", "from collections.abc import Callable"),
    (r"\bAsyncCursorConsumer\b", "CursorConsumer"),
    (r"\bAsyncCursorStore\b", "CursorStore"),
    (r"\bAsyncFetchPageFn\b", "FetchPageFn"),
    (r"\bAsyncHandleEventFn\b", "HandleEventFn"),
    (r"\basync def\b", "def"),
    (r"\bawait ", ""),
    (r'^"""The asyncio shell of', '"""The sync shell of'),
    (r"Hand-written; ``_sync\.py`` is$", "GENERATED from ``_async.py``"),
    (r"^generated from it by (.*) \(a test fails on drift\)\.", r"by \1: edit the async code."),
]

PROGRESS_RULES: list[tuple[str, str]] = [
    (r"from redis\.asyncio import", "from redis import"),
    (
        r"from collections\.abc import Awaitable, Callable, Generator",
        "from collections.abc import Callable, Generator",
    ),
    (r"Callable\[\[Any\], Awaitable\[Any\]\]", "Callable[[Any], Any]"),
    (r"Awaitable\[object\] \| object", "object"),  # the async shell takes a plain effect too
    (r"^#: An ``async def`` effect, or a plain function .*", "#: A plain function."),
    (r"\bAsyncRunner\b", "Runner"),
    (r"\bAsyncConnectable\b", "Connectable"),
    (r"settle\._runtime\._async\b", "settle._runtime._sync"),
    (r"\bAsyncProgressStore\b", "ProgressStore"),
    (r"\bAsyncStreamConsumer\b", "StreamConsumer"),
    (r"\bAsyncEffect\b", "Effect"),
    (r"__aenter__", "__enter__"),
    (r"__aexit__", "__exit__"),
    (r"^import asyncio$", "import time"),
    (r"\basyncio\.sleep\b", "time.sleep"),
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\bawait ", ""),
    (r"\baclose\b", "close"),
    (r'^"""The asyncio shell of', '"""The sync shell of'),
    (
        r"worker\)\. Hand-written; ``_sync\.py`` is generated from it by ``scripts/unasync\.py`` "
        r"\(a test$",
        "worker). GENERATED from ``_async.py`` by ``scripts/unasync.py``: edit the async code.",
    ),
    (r"^fails on drift\)\. Every rule", "Every rule"),
]


@dataclass(frozen=True)
class Package:
    sources: tuple[str, ...]
    rules: list[tuple[str, str]]


PACKAGES = (
    Package(("settle/_runtime/_async.py",), RUNTIME_RULES),
    Package(("settle/_async/__init__.py", "settle/_async/settler.py"), CORE_RULES),
    Package(("settle/cursor/_async.py",), CURSOR_RULES),
    Package(("settle/progress/_async.py",), PROGRESS_RULES),
)
HEADER = "# GENERATED by scripts/unasync.py from {src}; do not edit.\n"


def _target(src: str) -> Path:
    head, _, tail = src.rpartition("_async")
    return ROOT / f"{head}_sync{tail}"


ASYNC_ONLY = "# unasync: async-only"
ASYNC_ONLY_END = "# unasync: end"


def convert(text: str, rules: list[tuple[str, str]], used: set[int]) -> str:
    """Rewrite ``text`` line by line; the lines from ``# unasync: async-only`` through
    ``# unasync: end`` are left out (e.g. an async ``close()`` alias of ``aclose()``, which
    would be a second ``close`` in the sync shell)."""
    out = []
    skipping = False
    for raw in text.splitlines(keepends=True):
        line = raw.rstrip("\n")
        if line.strip() == ASYNC_ONLY:
            skipping = True
        if skipping:
            skipping = line.strip() != ASYNC_ONLY_END
            continue
        for i, (pattern, repl) in enumerate(rules):
            new = re.sub(pattern, repl, line)
            if new != line:
                used.add(i)
                line = new
        out.append(line + ("\n" if raw.endswith("\n") else ""))
    return "".join(out)


def generate() -> dict[Path, str]:
    result = {}
    for package in PACKAGES:
        used: set[int] = set()
        for src in package.sources:
            text = (ROOT / src).read_text(encoding="utf-8")
            result[_target(src)] = HEADER.format(src=src) + convert(text, package.rules, used)
        unused = [package.rules[i][0] for i in range(len(package.rules)) if i not in used]
        if unused:
            raise SystemExit(
                f"unasync: rules matched nothing (update scripts/unasync.py): {unused}"
            )
    return result


def main(argv: list[str]) -> int:
    files = generate()
    if "--check" in argv:
        stale = [
            str(p.relative_to(ROOT))
            for p, text in files.items()
            if not p.exists() or p.read_text(encoding="utf-8") != text
        ]
        if stale:
            print("sync shells are stale; run python scripts/unasync.py:", *stale)
            return 1
        return 0
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
