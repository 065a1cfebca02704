"""What the decorator learns from the wrapped function's signature, once, and derives from
each call's arguments: operation id, request (for the fingerprint), principal, the
``Attempt`` parameter and the type a replayed result is validated into. No I/O."""

from __future__ import annotations

import functools
import inspect
import re
import string
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, is_dataclass
from typing import Any

from pydantic import PydanticUserError, TypeAdapter

from settle._core.keys import check_binding
from settle._slots import slot_init
from settle.attempt import Attempt
from settle.errors import InvalidInput, SettleError
from settle.fingerprint import call_fingerprint

__all__ = [
    "CallIdentity",
    "KeySpec",
    "PrincipalSpec",
    "RequestSpec",
    "Signature",
    "check_decorable",
]

KeySpec = str | Callable[..., str]
PrincipalSpec = str | Callable[..., str]
RequestSpec = Callable[..., Any]


@slot_init
@dataclass(frozen=True, slots=True)
class CallIdentity:
    """Who and what one call is: the reservation's operation id, fingerprint and principal."""

    operation_id: str
    fingerprint: str
    principal: str


def check_decorable(fn: object) -> None:
    """Refuse what ``@settler.operation`` cannot settle, with what to do instead, before
    anything is derived from it:

    - a generator function (sync or async): its call returns at once, before its body
      has run, so the settlement would be about an unstarted generator and its effects
      would happen later, unsettled, outside the lease;
    - a ``functools.partial``: the arguments it binds are not parameters of its
      signature, so they would be missing from the request fingerprint (two partials of
      one function would replay each other's results), and it has no name to tell it
      apart by;
    - a ``classmethod`` object (decorated below ``@classmethod``) or another object that
      is not a function or method."""
    if isinstance(fn, classmethod):
        raise InvalidInput(
            "@settler.operation is given a classmethod object: put @classmethod above "
            "@settler.operation, which decorates the function itself"
        )
    if isinstance(fn, functools.partial):
        raise InvalidInput(
            f"@settler.operation cannot decorate functools.partial({_named(fn.func)}, ...): "
            "the arguments a partial binds are not part of the request fingerprint; "
            "decorate a def that calls the function with them as parameters"
        )
    if not callable(fn) or not isinstance(getattr(fn, "__qualname__", None), str):
        raise InvalidInput(
            f"@settler.operation decorates a function or a method, not {type(fn).__name__} "
            "objects: decorate a def (or async def) that calls it"
        )
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        kind = "an async generator" if inspect.isasyncgenfunction(fn) else "a generator"
        raise InvalidInput(
            f"{_named(fn)} is {kind} function: its call returns before its body runs, "
            "so nothing it does could be settled; decorate a function that returns the "
            "result (a list of the items, say)"
        )


def _named(fn: object) -> str:
    return str(getattr(fn, "__qualname__", type(fn).__name__))


_ATTEMPT_NAME = re.compile(r"(?:[\w.]+\.)?Attempt(?:\s*\|\s*None)?")


def _is_attempt(param: inspect.Parameter, hint: Any) -> bool:
    """The parameter that receives the Attempt: annotated ``Attempt`` (or ``Attempt | None``,
    also as an unresolved string), or defaulting to ``Attempt.INJECTED``."""
    if param.default is Attempt.INJECTED or hint is Attempt:
        return True
    if isinstance(hint, str):
        return bool(_ATTEMPT_NAME.fullmatch(hint.strip().strip("'\"")))
    return any(arg is Attempt for arg in typing.get_args(hint))


@dataclass
class Signature:
    """The wrapped function's parameters and how to turn a call into a :class:`CallIdentity`.

    ``key`` is a callable taking the call's arguments exactly as the caller passed them, or
    a ``str.format`` template over the bound arguments by name (``"charge:{request.id}"``).
    The default request is the bound arguments with defaults applied, minus the ``Attempt``
    parameter and a leading ``self`` / ``cls``; ``fingerprint`` (a callable over the call's
    arguments) returns another request value instead.

    The fingerprint covers the request and the function's identity, ``name`` (default
    ``module.qualname``): two functions of different names whose keys collide get a
    ``FingerprintMismatch``, never each other's results. Functions given the same ``name``
    share their operations; so do the functions a factory makes from one ``def`` (give each
    its ``name``). A lambda without ``name`` is refused (every lambda of a module is
    ``module.<lambda>``), and so is a second definition under one identity
    (``settle.decorator._identity``).

    A function must declare what a replay returns: a return annotation or ``result_type``
    (``Any`` keeps the stored JSON as it is). Without either the first call would return
    the function's object and a replay its JSON, so the function is refused at decoration.
    """

    fn: Callable[..., Any]
    key: KeySpec
    principal: PrincipalSpec
    fingerprint: Callable[..., Any] | None = None
    result_type: Any = None
    localns: dict[str, Any] | None = None
    """The decorating scope's names, so annotations naming local classes resolve."""
    name: str | None = None
    """The function's identity in the fingerprint (default ``module.qualname``)."""
    signature: inspect.Signature = field(init=False)
    attempt_param: str | None = field(init=False, default=None)
    _skip: frozenset[str] = field(init=False, default=frozenset())
    _key_fields: tuple[str, ...] = field(init=False, default=())
    _key_formats: tuple[tuple[str, str | None, str | None], ...] = field(init=False, default=())
    """Each field of a key template: its name, conversion (``!r``) and format spec."""
    _required: tuple[str, ...] = field(init=False, default=())
    _binder: _Binder | None = field(init=False, default=None)
    _fingerprint_of: Callable[[Any], str] = field(init=False)

    def __post_init__(self) -> None:
        if not (isinstance(self.key, str) or callable(self.key)):
            raise InvalidInput("key must be a str.format template or a callable")
        if not (isinstance(self.principal, str) or callable(self.principal)):
            raise InvalidInput("principal must be a str or a callable")
        if isinstance(self.principal, str):
            check_binding(self.principal)  # "" or a control character: every call would fail
        if self.fingerprint is not None and not callable(self.fingerprint):
            raise InvalidInput("fingerprint must be a callable returning the request")
        if self.name is None:
            if getattr(self.fn, "__name__", None) == "<lambda>":
                raise InvalidInput(
                    f"@settler.operation cannot tell {self.fn.__module__}.<lambda> from the "
                    "module's other lambdas (they all share that identity, so two of them "
                    "under one key template would return each other's results): give it "
                    'its own name="..."'
                )
            self.name = f"{self.fn.__module__}.{self.fn.__qualname__}"
        elif not isinstance(self.name, str) or not self.name:
            raise InvalidInput(
                "name must be a non-empty str (functions sharing it share operations)"
            )
        self._fingerprint_of = call_fingerprint(self.name)
        if isinstance(self.key, str):
            try:
                parsed = list(_FORMATTER.parse(self.key))
            except ValueError as exc:
                raise InvalidInput(f"key template {self.key!r} is malformed: {exc}") from exc
            self._key_fields = tuple(name for _, name, _, _ in parsed if name is not None)
            self._key_formats = tuple(
                (name, conversion, spec) for _, name, spec, conversion in parsed if name is not None
            )
        self.signature = inspect.signature(self.fn)
        if self.result_type is None and self.signature.return_annotation is inspect.Signature.empty:
            raise InvalidInput(
                f"{self.fn.__qualname__} has no return annotation: declare what a replay "
                "returns, with a return annotation (-> Receipt) or result_type=Receipt "
                "(-> Any keeps the stored JSON as it is, a dict where the first call may "
                "have returned an object)"
            )
        hints = self._hints(strict=False)
        _check_replayable(self.fn, self.result_type or hints.get("return"))
        _check_storable(self.fn, self.result_type or hints.get("return"))
        skip = set()
        params = list(self.signature.parameters.values())
        if params and params[0].name in ("self", "cls"):
            skip.add(params[0].name)
        for param in params:
            if _is_attempt(param, hints.get(param.name, param.annotation)):
                self.attempt_param = param.name
                skip.add(param.name)
        self._skip = frozenset(skip)
        self._check_template(params)
        variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        self._required = tuple(
            p.name
            for p in params
            if p.default is inspect.Parameter.empty
            and p.kind not in variadic
            and p.name != self.attempt_param
        )
        self._binder = _Binder.of(self.signature, self.attempt_param)

    def _hints(self, *, strict: bool) -> dict[str, Any]:
        try:
            return typing.get_type_hints(self.fn, localns=self.localns)
        except (NameError, TypeError):
            if strict:
                raise
            return {}

    def returns(self) -> Any:
        """The type a replayed result is validated into: ``result_type``, else the return
        annotation, else ``Any`` (the stored JSON as is). Resolved on first use, so the
        annotation may name a class defined after the function."""
        if self.result_type is None:
            try:
                hint = self._hints(strict=True).get("return", Any)
            except (NameError, TypeError) as exc:
                raise InvalidInput(
                    f"cannot resolve the return annotation of {self.fn.__qualname__}: {exc}; "
                    "pass result_type= to the decorator"
                ) from exc
            _check_replayable(self.fn, hint)
            self.result_type = hint
        return self.result_type

    def identify(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> CallIdentity:
        """Derive the operation id, the request fingerprint and the principal of a call.
        Raises an :class:`InvalidInput` (nothing is written) when one cannot be derived."""
        bound = self._binder(args, kwargs) if self._binder is not None else None
        if bound is None:
            bound = self._bind(args, kwargs).arguments
        # Fresh dicts either way (the binder's, or inspect's), read and never changed
        # below: copied only to leave out what they must not hold.
        attempt_param = self.attempt_param
        arguments = (
            bound
            if attempt_param is None or attempt_param not in bound
            else {k: v for k, v in bound.items() if k != attempt_param}
        )
        operation_id = self._derive("key", self.key, args, kwargs, arguments)
        principal = self._derive("principal", self.principal, args, kwargs, None)
        if self.fingerprint is not None:
            try:
                request = self.fingerprint(*args, **kwargs)
            except Exception as exc:  # the caller's callable: any error
                raise InvalidInput(
                    f"{self.fn.__qualname__}: the fingerprint callable raised {exc!r}",
                    operation_id=operation_id,
                ) from exc
        elif not self._skip:
            request = arguments
        else:
            request = {k: v for k, v in arguments.items() if k not in self._skip}
        try:
            digest = self._fingerprint_of(request)  # of {"function": name, "request": request}
        except SettleError as exc:
            exc.operation_id = operation_id
            raise
        return CallIdentity(operation_id=operation_id, fingerprint=digest, principal=principal)

    def inject(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any], attempt: Attempt
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The call's arguments with ``attempt`` in the ``Attempt`` parameter."""
        if self.attempt_param is None:
            return args, dict(kwargs)
        bound = self.signature.bind_partial(*args, **kwargs)
        bound.arguments[self.attempt_param] = attempt
        return bound.args, bound.kwargs

    def _bind(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> inspect.BoundArguments:
        try:
            bound = self.signature.bind_partial(*args, **kwargs)
        except TypeError as exc:
            raise InvalidInput(f"{self.fn.__qualname__}() {exc}") from exc
        if self.attempt_param is not None:
            given = bound.arguments.get(self.attempt_param, Attempt.INJECTED)
            if given is not Attempt.INJECTED:
                raise InvalidInput(
                    f"{self.fn.__qualname__}(): do not pass {self.attempt_param!r}; the "
                    "decorator supplies the Attempt"
                )
        missing = [name for name in self._required if name not in bound.arguments]
        if missing:
            raise InvalidInput(f"{self.fn.__qualname__}() missing argument(s): {missing}")
        bound.apply_defaults()
        return bound

    def _derive(
        self,
        what: str,
        spec: KeySpec,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        arguments: dict[str, Any] | None,
    ) -> str:
        try:
            if isinstance(spec, str):
                if arguments is None:
                    value: object = spec
                else:
                    self._check_key_fields(arguments)
                    value = spec.format(**arguments)
                    if _AT_ADDRESS in value:  # a scan of the id: the hot path stays cheap
                        self._check_key_addresses(arguments)
            else:
                value = spec(*args, **kwargs)
        except InvalidInput:
            raise
        except Exception as exc:  # the caller's callable or template: any error
            raise InvalidInput(
                f"{self.fn.__qualname__}: cannot derive the {what} from the call's arguments: "
                f"{exc!r}"
            ) from exc
        if not isinstance(value, str):
            raise InvalidInput(
                f"{self.fn.__qualname__}: the {what} must be a str, got {type(value).__name__}"
            )
        return value

    def _check_template(self, params: list[inspect.Parameter]) -> None:
        """A key template is formatted over the arguments by name: an empty one, a
        positional field (``{0}``, ``{}``) or one naming no parameter fails every call, so
        it is refused here, when the function is decorated."""
        if not isinstance(self.key, str):
            return
        if not self.key:
            raise InvalidInput("key template must not be empty")
        # *args and **kwargs are bound by their names: "{args[0]}", "{kwargs[order_id]}"
        # (a name passed through **kwargs is no field of its own: "{order_id}" fails).
        # The Attempt parameter is no argument of the call (its placeholder's number is 0
        # in every call's id): a field naming it fails every call, refused here too.
        names = {p.name for p in params if p.name != self.attempt_param}
        for field_name in self._key_fields:
            root = re.split(r"[.\[]", field_name, maxsplit=1)[0]
            if root == self.attempt_param:
                raise InvalidInput(
                    f"key template {self.key!r}: {{{field_name}}} names the Attempt "
                    f"parameter of {self.fn.__qualname__}, which is no argument of the call "
                    "(an attempt's number is not part of its operation's id)"
                )
            if root not in names:
                raise InvalidInput(
                    f"key template {self.key!r}: {{{field_name}}} names no parameter of "
                    f"{self.fn.__qualname__} (fields are parameters by name, such as "
                    "{request.order_id})"
                )

    def _check_key_fields(self, arguments: dict[str, Any]) -> None:
        """A key template's field that is None or empty would give every such call one
        shared id (``charge:None``): almost always a missing value, refused before anything
        is written."""
        for name in self._key_fields:
            value, _ = _FORMATTER.get_field(name, (), arguments)
            if value is None or value == "":
                raise InvalidInput(
                    f"{self.fn.__qualname__}: the key template's field {{{name}}} is "
                    f"{value!r}; every such call would share one operation id"
                )

    def _check_key_addresses(self, arguments: dict[str, Any]) -> None:
        """A key template's field whose value is formatted as Python's default repr
        (``<Order object at 0x7f...>``, a function, a method: no ``__str__`` or
        ``__format__`` of its own), or holds one in its text (a list or a dataclass of such
        objects), gives each object its own id, so a retry with an equal
        object built again (another request, another process) is a new operation and runs
        the effect again: refused before anything is written."""
        for name, conversion, spec in self._key_formats:
            value, _ = _FORMATTER.get_field(name, (), arguments)
            if isinstance(value, str):
                continue
            nested = spec is not None and "{" in spec  # {x:{width}}: formatted without it
            converted = _FORMATTER.convert_field(value, conversion)
            text = _FORMATTER.format_field(converted, "" if nested else spec or "")
            if _ADDRESS_REPR.search(text):
                raise InvalidInput(  # never the text: a dataclass's holds its other fields
                    f"{self.fn.__qualname__}: the key template's field {{{name}}}, of type "
                    f"{type(value).__name__}, is written with a memory address (Python's "
                    "default repr, <... at 0x...>), so every retry with an equal value built "
                    "again would be a new operation and run again; give its class a __str__ "
                    "or __format__ (a __repr__ for what a list, tuple or dataclass holds) "
                    f"that says which operation it is, or use an attribute ({{{name}.id}})"
                )


_FORMATTER = string.Formatter()
_AT_ADDRESS = " at 0x"
#: Python's default repr of an object, a function or a method (``<... at 0x7f12ab>``),
#: alone or inside the text of a value holding one (a list, a tuple, a dataclass).
_ADDRESS_REPR = re.compile(r" at 0x[0-9a-fA-F]+>")
_EMPTY = inspect.Parameter.empty


@dataclass(frozen=True, slots=True)
class _Binder:
    """What ``bind_partial(*args, **kwargs)`` then ``apply_defaults()`` binds, for a function
    without ``*args`` or ``**kwargs``, in a few dict operations (inspect's binding was about
    a tenth of a decorated replay's instructions). ``None`` for a call it does not bind
    plainly (too many positional arguments, an unknown keyword, one given twice or a
    positional-only one by keyword, a parameter with no default left out other than the
    ``Attempt``'s, the ``Attempt``'s given a value), which :meth:`Signature._bind` then binds
    with inspect and refuses as it always did. A property test holds it to inspect's
    binding."""

    params: tuple[tuple[str, Any, bool], ...]
    """Each parameter in order: its name, its default, whether a keyword may give it."""
    positional: int
    """How many may be given by position (they come first)."""
    attempt: str | None
    """The ``Attempt``'s parameter: it may be left out with no default, and a caller must
    not give it (but ``Attempt.INJECTED``)."""

    @staticmethod
    def of(signature: inspect.Signature, attempt: str | None) -> _Binder | None:
        kinds = inspect.Parameter
        params = list(signature.parameters.values())
        if any(p.kind in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD) for p in params):
            return None
        return _Binder(
            tuple((p.name, p.default, p.kind is not kinds.POSITIONAL_ONLY) for p in params),
            sum(p.kind is not kinds.KEYWORD_ONLY for p in params),
            attempt,
        )

    def __call__(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
        given = len(args)
        if given > self.positional:
            return None
        bound: dict[str, Any] = {}
        taken = 0
        attempt = self.attempt
        for i, (name, default, by_keyword) in enumerate(self.params):
            if i < given:  # the positional parameters come first
                value = bound[name] = args[i]
            elif by_keyword and name in kwargs:
                value = bound[name] = kwargs[name]
                taken += 1
            elif default is not _EMPTY:
                bound[name] = default
                continue
            elif name == attempt:
                continue
            else:
                return None
            if name == attempt and value is not Attempt.INJECTED:
                return None
        return bound if taken == len(kwargs) else None


def _check_replayable(fn: Callable[..., Any], declared: Any) -> None:
    """A result type that holds ``str | bytes`` anywhere (``dict[str, str | bytes]``, a
    field of a dataclass, model, TypedDict or NamedTuple) cannot be replayed as it was
    returned: both are stored as a JSON string, and a replay could not tell which one the
    first call returned."""
    if _ambiguous(declared, {}):
        raise InvalidInput(
            f"{fn.__qualname__} declares {declared!r}, which holds str | bytes: a replay "
            "cannot tell str from bytes (both are stored as a JSON string); use one of them "
            "(-> bytes alone keeps any bytes as they are)"
        )


def _check_storable(fn: Callable[..., Any], declared: Any) -> None:
    """A result type pydantic has no schema for (an arbitrary class, a pandas frame, an
    iterator) can be neither stored nor replayed: every call would run the function (its
    effect happens), fail to store its result and leave the operation provisional, and the
    next call would run it again. Refused when decorated, as a missing annotation is. A
    function that never returns (``NoReturn``, ``Never``: it only raises, its definite
    failures stored and replayed) stores no result, so it needs no schema."""
    if declared is None or declared is typing.NoReturn or declared is typing.Never:
        return
    try:
        TypeAdapter(declared)
    except PydanticUserError as exc:  # no schema (PydanticSchemaGenerationError), Self
        raise InvalidInput(
            f"{fn.__qualname__} declares {declared!r}, which pydantic can neither store nor "
            "validate, so no result of it could be replayed; return a pydantic model, a "
            "dataclass or JSON values, or declare what is stored with result_type="
        ) from exc


def _ambiguous(declared: Any, seen: dict[int, Any]) -> bool:
    """Whether ``declared`` holds a union of str and bytes. ``seen`` keeps every type looked
    at alive (its id could be reused otherwise) and stops a recursive model."""
    if id(declared) in seen:
        return False
    seen[id(declared)] = declared
    origin = typing.get_origin(declared)
    args = typing.get_args(declared)
    if origin is typing.Annotated:  # the metadata is not part of the type
        return _ambiguous(args[0], seen)
    if origin is typing.ClassVar:  # never stored
        return False
    if origin in (typing.Union, types.UnionType) and str in args and bytes in args:
        return True
    if any(_ambiguous(arg, seen) for arg in args):
        return True
    if not isinstance(declared, type):
        return False
    fields: Any = getattr(declared, "model_fields", None)  # a pydantic model
    if isinstance(fields, dict):
        return any(_ambiguous(f.annotation, seen) for f in fields.values())
    stored = (
        is_dataclass(declared)
        or typing.is_typeddict(declared)
        or (issubclass(declared, tuple) and hasattr(declared, "_fields"))  # a NamedTuple
    )
    if not stored:
        return False
    try:
        hints = typing.get_type_hints(declared, include_extras=True)
    except Exception:  # noqa: BLE001  # not resolvable now: the replay's validation says so
        return False
    return any(_ambiguous(hint, seen) for hint in hints.values())
