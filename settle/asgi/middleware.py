"""``IdempotencyMiddleware``: the ``Idempotency-Key`` header for any ASGI app (SPEC 7).

Per guarded request: parse the key, resolve the principal, read and fingerprint the body,
``reserve`` the operation, then replay the stored response, answer 409 while another attempt
runs, or run the handler under the new reservation (:mod:`settle.asgi.runner`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from settle._async.settler import AsyncSettler
from settle._log import logger
from settle.asgi._types import ASGIApp, Receive, Scope, Send
from settle.asgi.attempt import attempt_for
from settle.asgi.keys import KeyScope, MalformedKey, operation_id, parse_key
from settle.asgi.policy import Coverage, IdempotencyPolicy, PrincipalFn
from settle.asgi.problems import DEFAULT_PROBLEM_TYPE_BASE, Problem, ProblemKind
from settle.asgi.replay import send_replay
from settle.asgi.request import (
    ClientDisconnected,
    RequestTooLarge,
    header_values,
    read_body,
    request_fingerprint,
)
from settle.asgi.runner import AttemptRunner
from settle.asgi.stored import DEFAULT_REPLAY_HEADERS
from settle.errors import BackendError, BindingMismatch, DurabilityError, FingerprintMismatch
from settle.models import InProgress, Replay

__all__ = ["IdempotencyMiddleware"]


class IdempotencyMiddleware:
    """Makes retried unsafe requests safe: one execution per key, the same response after.

    ``principal`` maps the ASGI scope to the authenticated principal (return None for an
    unauthenticated request: 401). Keys are scoped per principal unless ``key_scope`` is
    ``"global"``; the principal is also stored as the record's binding and checked on every
    request, so no principal can receive another principal's response. See
    :class:`~settle.asgi.policy.IdempotencyPolicy` for every option.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        settler: AsyncSettler,
        principal: PrincipalFn,
        methods: Iterable[str] = ("POST", "PATCH"),
        paths: Iterable[str] | None = None,
        require_key: bool | Iterable[str] = True,
        header: str = "Idempotency-Key",
        key_scope: KeyScope = "principal",
        max_key_length: int = 200,
        lease: float | None = None,
        timeout: float | None = None,
        max_request_bytes: int = 1 << 20,
        max_response_bytes: int = 256 << 10,
        replay_headers: Iterable[str] = DEFAULT_REPLAY_HEADERS,
        retry_after: int = 1,
        operation_prefix: str = "http",
        problem_type_base: str = DEFAULT_PROBLEM_TYPE_BASE,
    ) -> None:
        self.app = app
        self.settler = settler
        self.policy = IdempotencyPolicy(
            principal=principal,
            methods=frozenset(methods),
            paths=None if paths is None else _patterns(paths),
            require_key=require_key if isinstance(require_key, bool) else _patterns(require_key),
            header=header,
            key_scope=key_scope,
            max_key_length=max_key_length,
            lease=lease,
            timeout=timeout,
            max_request_bytes=max_request_bytes,
            max_response_bytes=max_response_bytes,
            replay_headers=frozenset(replay_headers),
            retry_after=retry_after,
            operation_prefix=operation_prefix,
            problem_type_base=problem_type_base,
        )
        self.policy.check_store(settler.config.max_result_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        policy = self.policy
        coverage = policy.coverage(scope["method"], scope["path"])
        if coverage is Coverage.UNGUARDED:
            await self.app(scope, receive, send)
            return
        log = logger.bind(
            namespace=self.settler.config.namespace, method=scope["method"], path=scope["path"]
        )
        values = header_values(scope, policy.header_bytes)
        if not values:
            if coverage is Coverage.KEY_OPTIONAL:
                await self.app(scope, receive, send)
                return
            log.info("settle.http.rejected", problem=ProblemKind.KEY_MISSING.value)
            detail = f"this endpoint needs an {policy.header} header: a unique value per request"
            await self._problem(send, ProblemKind.KEY_MISSING, detail)
            return
        try:
            key = parse_key(values, policy.max_key_length)
        except MalformedKey as exc:
            log.info("settle.http.rejected", problem=ProblemKind.KEY_MALFORMED.value)
            await self._problem(send, ProblemKind.KEY_MALFORMED, str(exc))
            return
        principal = await policy.principal_of(scope)
        if principal is None:
            log.info("settle.http.rejected", problem=ProblemKind.PRINCIPAL_REQUIRED.value)
            detail = "authenticate: a guarded request is bound to the principal that sent it"
            await self._problem(send, ProblemKind.PRINCIPAL_REQUIRED, detail)
            return
        try:
            body = await read_body(scope, receive, policy.max_request_bytes)
        except RequestTooLarge as exc:
            log.info("settle.http.rejected", problem=ProblemKind.REQUEST_TOO_LARGE.value)
            await self._problem(send, ProblemKind.REQUEST_TOO_LARGE, str(exc))
            return
        except ClientDisconnected:
            log.info("settle.http.disconnected", stage="reading_request")
            return
        op = operation_id(policy.operation_prefix, key, principal, policy.key_scope)
        await self._guard(scope, receive, send, body, principal, op, log.bind(operation_id=op))

    async def _guard(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        body: bytes,
        principal: str,
        op: str,
        log: Any,
    ) -> None:
        policy = self.policy
        try:
            outcome = await self.settler.reserve(
                op,
                principal=principal,
                fingerprint=request_fingerprint(scope, body),
                lease=policy.lease,
            )
        except FingerprintMismatch:
            log.info("settle.http.rejected", problem=ProblemKind.KEY_REUSED.value)
            detail = (
                f"this {policy.header} was already used for a different request (method, path, "
                "query, content type or body); use a new key for a new request"
            )
            await self._problem(send, ProblemKind.KEY_REUSED, detail)
            return
        except BindingMismatch:
            log.warning("settle.http.rejected", problem=ProblemKind.KEY_BOUND.value)
            detail = f"this {policy.header} is in use by another principal; use a new key"
            await self._problem(send, ProblemKind.KEY_BOUND, detail)
            return
        except (BackendError, DurabilityError) as exc:
            log.error("settle.http.unavailable", error=type(exc).__name__)  # noqa: TRY400 - the cause is named; no traceback needed
            detail = "the idempotency store cannot be reached; nothing was run. Retry later."
            await self._problem(send, ProblemKind.UNAVAILABLE, detail, policy.retry_after)
            return
        if isinstance(outcome, Replay):
            await send_replay(send, outcome.record, policy.problem_type_base, log)
            return
        if isinstance(outcome, InProgress):
            log.info("settle.http.in_progress", generation=outcome.generation)
            detail = (
                f"a request with this {policy.header} is still being processed; retry after "
                f"{policy.retry_after} s to get its response"
            )
            await self._problem(send, ProblemKind.IN_PROGRESS, detail, policy.retry_after)
            return
        attempt = attempt_for(outcome, self.settler.config.namespace, policy.timeout)
        runner = AttemptRunner(self.app, self.settler, policy, outcome.reservation, attempt, log)
        await runner.run(scope, receive, send, body)

    async def _problem(
        self, send: Send, kind: ProblemKind, detail: str, retry_after: int | None = None
    ) -> None:
        await Problem(kind, detail, retry_after).send(send, self.policy.problem_type_base)


def _patterns(value: Iterable[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)
