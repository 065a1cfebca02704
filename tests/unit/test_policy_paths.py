"""Which requests a policy guards (``paths=``) and which must carry a key (``require_key=``):
a path or its route is matched as ``fnmatch.fnmatchcase`` matches it, pattern by pattern,
whatever the matchers the policy builds once to do it; and a policy is still a value a user
can copy and pickle (a worker pool's arguments, a cached settings object)."""

from __future__ import annotations

import copy
import fnmatch
import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from settle.http.policy import Coverage, IdempotencyPolicy


def principal(scope: Any) -> str:
    return "tenant:acme"


def expected(
    paths: list[str] | None, required: list[str] | bool, path: str, route: str | None
) -> Coverage:
    """The coverage the documented rules give, pattern by pattern with ``fnmatchcase``."""
    seen = [path] if route is None else [path, route]

    def any_match(patterns: list[str]) -> bool:
        return any(fnmatch.fnmatchcase(p, pattern) for pattern in patterns for p in seen)

    if paths is not None and not any_match(paths):
        return Coverage.UNGUARDED
    if required is True or (isinstance(required, list) and any_match(required)):
        return Coverage.KEY_REQUIRED
    return Coverage.KEY_OPTIONAL


#: Patterns a user writes, and the ones that look like regular expressions but are not.
EDGES = [
    "/pay",
    "/pay/*",
    "/pay*",
    "/p?y",
    "/v[12]/pay",
    "/v[!2]/pay",
    "/v[a-c]",
    "/v[]",
    "/v[",
    "/v]",
    "/a.b",
    "/a+b",
    "/(x)|y",
    "/$^",
    "/a\\b",
    "/café/*",
    "/*/refunds",
    "/**",
    "/",
]

PATHS = [
    "/pay",
    "/pay/",
    "/pay/1",
    "/payments",
    "/x/pay",
    "/x/pay1",
    "/Pay",
    "/pay\n",
    "/pay/1\n2",
    "/pby",
    "/v1/pay",
    "/v2/pay",
    "/v3/pay",
    "/vb",
    "/v[]",
    "/v[",
    "/v]",
    "/a.b",
    "/aXb",
    "/a+b",
    "/aab",
    "/(x)|y",
    "/y",
    "/$^",
    "/a\\b",
    "/café/1",
    "/cafe/1",
    "/v1/refunds",
    "/",
    "",
]


@pytest.mark.parametrize("pattern", EDGES)
@pytest.mark.parametrize("path", PATHS)
def test_a_single_pattern_guards_what_fnmatchcase_matches(pattern: str, path: str) -> None:
    policy = IdempotencyPolicy(principal=principal, paths=[pattern], require_key=[pattern])
    assert policy.coverage("POST", path) == expected([pattern], [pattern], path, None)


@pytest.mark.parametrize(
    ("paths", "required"),
    [
        (["/pay", "/refunds/*"], ["/pay"]),
        (["/refunds/*", "/pay"], ["/refunds/[0-9]*"]),
        (["/pay", "/payments"], True),
        (None, ["/v?/pay", "/pay"]),
        (None, False),
        (["/v[12]/pay", "/pay/*", "/a.b"], ["/zzz"]),
    ],
)
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("route", [None, "/pay", "/refunds/7", "/nothing"])
def test_several_patterns_and_a_route_guard_what_any_of_them_matches(
    paths: list[str] | None, required: list[str] | bool, path: str, route: str | None
) -> None:
    """A literal pattern beside a glob, literal ones alone, ``require_key=True``; the route
    (a mounted sub-application's own path) is matched as well as the whole path."""
    policy = IdempotencyPolicy(principal=principal, paths=paths, require_key=required)
    assert policy.coverage("POST", path, route) == expected(paths, required, path, route)


_ALPHABET = "/ab*?[]!-^\\.\n"


@given(
    patterns=st.lists(st.text(_ALPHABET, max_size=8).map(lambda s: "/" + s), max_size=3),
    required=st.lists(st.text(_ALPHABET, max_size=8).map(lambda s: "/" + s), max_size=3),
    path=st.text(_ALPHABET, max_size=10),
    route=st.none() | st.text(_ALPHABET, max_size=6),
)
def test_any_patterns_guard_what_fnmatchcase_matches(
    patterns: list[str], required: list[str], path: str, route: str | None
) -> None:
    paths = patterns or None
    require: list[str] | bool = required or False
    policy = IdempotencyPolicy(principal=principal, paths=paths, require_key=require)
    assert policy.coverage("POST", path, route) == expected(paths, require, path, route)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"paths": ["/pay"]},
        {"paths": ["/pay/*"], "require_key": ["/pay/1"]},
        {"require_key": True},
        {"paths": ["/pay", "/pay/[0-9]*"], "require_key": ["/pay/[0-9]*"]},
    ],
)
def test_a_policy_pickles_and_copies_to_one_that_guards_the_same(options: Any) -> None:
    policy = IdempotencyPolicy(principal=principal, **options)
    for again in (pickle.loads(pickle.dumps(policy)), copy.deepcopy(policy)):
        assert again == policy
        for path in ("/pay", "/pay/1", "/pay/x", "/other"):
            assert again.coverage("POST", path) == policy.coverage("POST", path)
