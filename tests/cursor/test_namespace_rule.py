"""One namespace rule: settings, the cursor store and the progress store take and refuse
the same names, with the same typed error and the same words (``NAMESPACE_RULE``).

The progress store once kept its own copy, worded ``1-64 characters of [A-Za-z0-9_.-]``.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Iterator

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from settle.config import NAMESPACE_RULE, SettleConfig, check_namespace
from settle.cursor import CursorStore
from settle.errors import InvalidInput
from settle.progress import ProgressStore
from settle.progress._keys import ProgressKeys
from settle.progress.errors import InvalidDelivery

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


#: The pattern each part held before they shared one (settings, cursor, progress: 755b6b9).
OLD_PATTERN = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
NAMESPACE_TEXT = st.one_of(
    st.text(alphabet=string.ascii_letters + string.digits + "_.-", min_size=0, max_size=70),
    st.text(max_size=70),
    st.text(alphabet=string.ascii_letters + "_.-\n\r\t :{}/\u00e9\u0661\uff41", max_size=70),
)


@given(NAMESPACE_TEXT)
def test_every_part_takes_what_its_old_pattern_took_and_nothing_else(namespace: str) -> None:
    """Sharing the rule changed no part's accepted set: settings, the cursor store's check
    and the progress store's keys take a name exactly when the pattern each had took it."""
    taken = OLD_PATTERN.fullmatch(namespace) is not None
    parts: dict[str, Callable[[], object]] = {
        "settings": lambda: SettleConfig(namespace=namespace),
        "cursor": lambda: check_namespace(namespace),
        "progress": lambda: ProgressKeys(namespace=namespace, consumer="w1"),
    }
    for part, build in parts.items():
        if taken:
            build()
        else:
            error = InvalidDelivery if part == "progress" else InvalidInput
            with pytest.raises(error):
                build()
