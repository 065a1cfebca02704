"""One namespace rule: settings, the cursor store and the progress store take and refuse
the same names, with the same typed error and the same words (``NAMESPACE_RULE``).

The progress store once kept its own copy, worded ``1-64 characters of [A-Za-z0-9_.-]``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis

from settle.config import NAMESPACE_RULE, SettleConfig
from settle.cursor import CursorStore
from settle.errors import InvalidInput
from settle.progress import ProgressStore

GOOD = ["a", "A-z_0.9", "-", ".", "_", "x" * 64, "default"]
BAD = [
    "",
    "x" * 65,
    "n s",
    "ns\n",
    "ns\r\n",
    "\nns",
    "a:b",
    "a{b}",
    "a/b",
    "é",
    "\uff41",  # fullwidth a
    "\u0661",  # Arabic-Indic digit one
    "a\u200bb",  # zero-width space
    "a\x00",
]


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def _parts(client: redis.Redis) -> dict[str, Callable[[str], object]]:
    return {
        "settings": lambda ns: SettleConfig(namespace=ns),
        "cursor": lambda ns: CursorStore(client, namespace=ns),
        "progress": lambda ns: ProgressStore(client, consumer="w1", namespace=ns),
    }


@pytest.mark.parametrize("good", GOOD)
def test_every_part_takes_the_same_namespaces(client: redis.Redis, good: str) -> None:
    for build in _parts(client).values():
        build(good)


@pytest.mark.parametrize("bad", BAD)
def test_every_part_refuses_the_same_namespaces_in_the_same_words(
    client: redis.Redis, bad: str
) -> None:
    for part, build in _parts(client).items():
        with pytest.raises(InvalidInput) as caught:
            build(bad)
        message = str(caught.value)
        assert message.endswith(f"namespace must be {NAMESPACE_RULE}") or message.endswith(
            f"namespace: must be {NAMESPACE_RULE}"
        ), (part, message)


@pytest.mark.parametrize("bad", [None, 5, b"ns", ["ns"]])
def test_the_stores_refuse_a_namespace_that_is_no_str_in_the_same_words(
    client: redis.Redis, bad: object
) -> None:
    for part in ("cursor", "progress"):
        with pytest.raises(InvalidInput) as caught:
            _parts(client)[part](bad)  # type: ignore[arg-type]
        assert str(caught.value) == f"namespace must be {NAMESPACE_RULE}", part
