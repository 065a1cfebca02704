"""``IdempotencyPolicy``: which requests are guarded and how, validated once at start-up."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, get_args

from settle._core.keys import MAX_BINDING_CHARS, has_control
from settle.errors import ConfigurationError
from settle.http.keys import KeyScope, operation_id_overhead
from settle.http.problems import DEFAULT_PROBLEM_TYPE_BASE
from settle.http.stored import DEFAULT_REPLAY_HEADERS, FORBIDDEN_REPLAY_HEADERS

__all__ = [
    "Coverage",
    "IdempotencyPolicy",
    "PrincipalFn",
    "checked_principal",
    "unusable_principal",
]

PrincipalFn = Callable[[Any], str | Awaitable[str | None] | None]
"""Maps the request (the ASGI scope, the WSGI environ, Django's or Flask's request) to the
authenticated principal (None: not authenticated -> 401). Only ASGI may return an awaitable."""

_MAX_OPERATION_ID = 256
_BASE64_HEADROOM = 16 << 10  # stored headers and the JSON envelope around the body

#: A challenge (RFC 9110 11.6.1): an auth-scheme (a token), then, after a space or a comma,
#: its parameters or further challenges; visible ASCII and spaces only, no line break.
# RFC 9110 11.6.1: challenge = auth-scheme [ 1*SP ( token68 / #auth-param ) ], the header a
# comma-separated list of them; auth-param = token BWS "=" BWS ( token / quoted-string ).
# Spaces only as whitespace (a tab, like every control character, is refused).
_TCHARS = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_QUOTED = r'"(?:[ !#-\[\]-~]|\\[ -~])*"'
_PARAM = rf"{_TCHARS} *= *(?:{_TCHARS}|{_QUOTED})"
_PARAMS = rf"{_PARAM}(?: *, *{_PARAM})*"
_ONE_CHALLENGE = rf"{_TCHARS}(?: +(?:[A-Za-z0-9\-._~+/]+=*|{_PARAMS}))?"
#: An HTTP header (field) name: a token (RFC 9110, 5.1).
_TOKEN = re.compile(_TCHARS)
_CHALLENGE = re.compile(rf"{_ONE_CHALLENGE}(?: *, *{_ONE_CHALLENGE})*")


class Coverage(Enum):
    """How the policy treats one request."""

    UNGUARDED = "unguarded"
    KEY_OPTIONAL = "key_optional"
    KEY_REQUIRED = "key_required"


def _globs(value: Iterable[str], what: str) -> tuple[str, ...]:
    if isinstance(value, str):
        raise ConfigurationError(f"{what} must be a list of path patterns, not one string")
    if not isinstance(value, Iterable):
        raise ConfigurationError(f"{what} must be a list of path patterns")
    patterns = tuple(value)
    if not all(isinstance(p, str) and p.startswith("/") for p in patterns):
        raise ConfigurationError(f"{what} must hold path patterns starting with '/'")
    return patterns


def _one_or_many(value: Iterable[str]) -> tuple[str, ...]:
    """One name or pattern given as a plain str is that one (``methods="POST"``), never its
    characters."""
    return (value,) if isinstance(value, str) else tuple(value)


def _loose(value: Any) -> Any:
    """:func:`_one_or_many` of what is a str or iterable; anything else as it is, for the
    policy's own check to name."""
    return _one_or_many(value) if isinstance(value, str | Iterable) else value


def _names(value: object, what: str) -> tuple[str, ...]:
    """:func:`_one_or_many` of an option that must hold names (methods, headers)."""
    if not isinstance(value, str | Iterable):
        raise ConfigurationError(f"{what} must be a name or a list of names")
    names = _one_or_many(value)
    if not all(isinstance(n, str) for n in names):
        raise ConfigurationError(f"{what} must hold names (str)")
    return names


def _check_types(policy: IdempotencyPolicy) -> None:
    """The options' types, before their values are compared: a str where a number belongs
    was a TypeError, and a float one (NaN, 1.5) compared False with every size, so that a
    NaN ``max_request_bytes`` read any body and a NaN ``max_response_bytes`` stored none."""
    for name in ("header", "operation_prefix", "problem_type_base"):
        if not isinstance(getattr(policy, name), str):
            raise ConfigurationError(f"{name} must be a str")
    for name in ("max_key_length", "max_request_bytes", "max_response_bytes", "retry_after"):
        value = getattr(policy, name)
        # A whole float (1e6, 2.0) worked before and is kept, as the int it is (a
        # Retry-After of 2.0 was sent as "2.0"); NaN, inf and 1.5 are not whole numbers.
        if isinstance(value, float) and value.is_integer():
            value = int(value)
            object.__setattr__(policy, name, value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigurationError(f"{name} must be a whole number, got {value!r}")
    for name in ("lease", "timeout"):
        value = getattr(policy, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ConfigurationError(f"{name} must be a number of seconds, got {value!r}")


def _check_challenge(value: object) -> None:
    """``www_authenticate``: None, or the challenge a 401 sends as it is, a header value."""
    if value is None:
        return
    if not isinstance(value, str):
        raise ConfigurationError(
            f"www_authenticate must be a str such as 'Bearer realm=\"api\"', or None; got "
            f"{type(value).__name__}"
        )
    if not _CHALLENGE.fullmatch(value):
        raise ConfigurationError(
            "www_authenticate must be one or more challenges as RFC 9110 11.6.1 writes them: "
            "an auth-scheme, then a token68 or name=value parameters (a value a token or a "
            "closed quoted-string), challenges separated by commas (such as 'Bearer "
            'realm="api"\' or \'Negotiate, Basic realm="api"\'), in visible ASCII and '
            "spaces, with no line breaks or other control characters"
        )


def _no_path(_path: str) -> bool:
    """The matcher of no patterns (``paths=None``, ``require_key`` True or False)."""
    return False


def _matcher(patterns: tuple[str, ...] | None) -> Callable[[str], object]:
    """Whether a path matches any of ``patterns`` (as ``fnmatch.fnmatchcase`` does), built
    once: a set of literal paths, or one regular expression of every pattern (each
    ``fnmatch.translate`` ends the match at the end of the path)."""
    if not patterns:
        return _no_path  # a module function, not a lambda: a policy still pickles
    if not any(c in p for p in patterns for c in "*?["):
        return frozenset(patterns).__contains__
    return re.compile("|".join(fnmatch.translate(p) for p in patterns)).match


@dataclass(frozen=True)
class IdempotencyPolicy:
    """What the middleware guards and with which limits.

    ``paths`` are glob patterns (``/payments``, ``/payments/*``); None guards every path.
    ``require_key``: True (every guarded path needs a key, 400 without one), False (a key is
    used when sent, requests without one pass unguarded), or the glob patterns of the paths
    that need one. ``lease`` defaults to the settler's; the record's retention is the
    settler's ``SettleConfig.retention``. ``key_scope="global"`` puts every principal's
    keys in one space: they must be unguessable (random, a UUIDv4), since another
    principal's 422 tells whether it guessed the request made with a key
    (docs/http-endpoints.md, "What the middleware does"). ``www_authenticate``: the
    challenge the 401 ``principal-required`` sends in its ``WWW-Authenticate`` header
    (``'Bearer realm="api"'``); None sends none, for settle cannot know the application's
    scheme (docs/http-endpoints.md, "The 401 and its challenge").
    """

    principal: PrincipalFn
    methods: frozenset[str] = frozenset({"POST", "PATCH"})
    paths: tuple[str, ...] | None = None
    require_key: bool | tuple[str, ...] = True
    header: str = "Idempotency-Key"
    key_scope: KeyScope = "principal"
    max_key_length: int = 200
    lease: float | None = None
    timeout: float | None = None
    max_request_bytes: int = 1 << 20
    max_response_bytes: int = 256 << 10
    replay_headers: frozenset[str] = DEFAULT_REPLAY_HEADERS
    retry_after: int = 1
    operation_prefix: str = "http"
    problem_type_base: str = DEFAULT_PROBLEM_TYPE_BASE
    www_authenticate: str | None = None
    header_bytes: bytes = field(init=False, repr=False)
    _guards_path: Callable[[str], object] = field(init=False, repr=False, compare=False)
    _requires_key: Callable[[str], object] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not callable(self.principal):
            raise ConfigurationError("principal must be a callable: request -> str | None")
        _check_types(self)
        set_ = object.__setattr__
        set_(self, "methods", frozenset(m.upper() for m in _names(self.methods, "methods")))
        if self.paths is not None:
            set_(self, "paths", _globs(self.paths, "paths"))
        if not isinstance(self.require_key, bool):
            set_(self, "require_key", _globs(self.require_key, "require_key"))
        set_(self, "_guards_path", _matcher(self.paths))
        required = self.require_key
        set_(self, "_requires_key", _matcher(required if isinstance(required, tuple) else None))
        if not isinstance(self.header, str) or not _TOKEN.fullmatch(self.header):
            # A space or a CR/LF was taken, and no request could carry such a header: every
            # guarded request was refused as one without a key.
            raise ConfigurationError(
                f"header must be an HTTP header name (letters, digits and !#$%&'*+-.^_`|~), "
                f"got {self.header!r}"
            )
        set_(self, "header_bytes", self.header.lower().encode("ascii"))
        if self.key_scope not in get_args(KeyScope):
            raise ConfigurationError("key_scope must be 'principal' or 'global'")
        if not self.operation_prefix.isidentifier():
            raise ConfigurationError("operation_prefix must be a short identifier such as 'http'")
        room = _MAX_OPERATION_ID - operation_id_overhead(self.operation_prefix)
        if not 1 <= self.max_key_length <= room:
            raise ConfigurationError(f"max_key_length must be 1 to {room} with this prefix")
        for name in ("lease", "timeout"):
            value = getattr(self, name)
            if value is not None and not 0 < value <= 86_400:
                raise ConfigurationError(f"{name} must be more than 0 and at most 86400 seconds")
        if self.max_request_bytes < 0 or self.max_response_bytes < 0:
            raise ConfigurationError("max_request_bytes and max_response_bytes must be >= 0")
        if self.retry_after < 0:
            raise ConfigurationError("retry_after must be >= 0 seconds")
        allowed = frozenset(h.lower() for h in _names(self.replay_headers, "replay_headers"))
        if refused := sorted(allowed & FORBIDDEN_REPLAY_HEADERS):
            raise ConfigurationError(
                f"replay_headers must not contain {', '.join(refused)}: cookies belong to one "
                "client and framing headers are recomputed on replay"
            )
        set_(self, "replay_headers", allowed)
        _check_challenge(self.www_authenticate)

    @classmethod
    def configure(
        cls,
        *,
        principal: PrincipalFn,
        methods: Iterable[str] = ("POST", "PATCH"),
        paths: Iterable[str] | None = None,
        require_key: bool | Iterable[str] = True,
        replay_headers: Iterable[str] = DEFAULT_REPLAY_HEADERS,
        **options: Any,
    ) -> IdempotencyPolicy:
        """The policy from a middleware's keyword options (one glob may be a plain str).

        ``options`` are the other fields (``header``, ``key_scope``, ``lease``, ...); an
        unknown one is a :class:`ConfigurationError`.
        """
        unknown = sorted(set(options) - {n for n, f in cls.__dataclass_fields__.items() if f.init})
        if unknown:
            raise ConfigurationError(
                f"unknown option {', '.join(unknown)}; the options are listed in "
                "docs/http-endpoints.md (Options)"
            )
        return cls(
            principal=principal,
            methods=_loose(methods),
            paths=None if paths is None else _loose(paths),
            require_key=require_key if isinstance(require_key, bool) else _loose(require_key),
            replay_headers=_loose(replay_headers),
            **options,
        )

    def check_store(self, max_result_bytes: int) -> None:
        """The largest stored response must fit the settler's ``max_result_bytes``."""
        needed = 4 * -(-self.max_response_bytes // 3) + _BASE64_HEADROOM
        if needed > max_result_bytes:
            raise ConfigurationError(
                f"max_response_bytes={self.max_response_bytes} needs max_result_bytes >= "
                f"{needed} on the settler (base64 plus headers); raise it or store less"
            )

    def coverage(self, method: str, path: str, route: str | None = None) -> Coverage:
        """Whether a request is guarded. ``path`` is the whole path, ``route`` the path inside
        a mounted application: a pattern matches either (``/payments`` guards a
        sub-application's route wherever it is mounted; ``/v1/payments`` the whole path)."""
        if method.upper() not in self.methods:
            return Coverage.UNGUARDED
        # Matched by the matchers built once (__post_init__), not pattern by pattern.
        inside = route if route is not None and route != path else None
        matches = self._guards_path
        if self.paths is not None and not (
            matches(path) or (inside is not None and matches(inside))
        ):
            return Coverage.UNGUARDED
        required, matches = self.require_key, self._requires_key
        if required is True or matches(path) or (inside is not None and matches(inside)):
            return Coverage.KEY_REQUIRED
        return Coverage.KEY_OPTIONAL


def checked_principal(value: object) -> str | None:
    """What the principal callable returned, once checked to be ``str | None``.

    Raises :class:`ConfigurationError` for anything else: the callable misbehaves."""
    if value is not None and not isinstance(value, str):
        raise ConfigurationError(
            f"the principal callable returned {type(value).__name__}, not str | None; "
            "return the principal's name, or None for an unauthenticated request"
        )
    return value


def unusable_principal(value: str | None) -> str | None:
    """Why a principal cannot bind a record (``"none"``, ``"empty"``, ``"too_long"``,
    ``"control_characters"``), or None when it can. Never the value itself: it is logged."""
    if value is None:
        return "none"
    if not value:
        return "empty"
    if len(value) > MAX_BINDING_CHARS:
        return "too_long"
    if has_control(value):
        return "control_characters"
    return None
