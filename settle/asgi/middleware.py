"""``IdempotencyMiddleware``: the ``Idempotency-Key`` header for any ASGI app (SPEC 7).

Per guarded request: parse the key, resolve the principal, read and fingerprint the body,
``reserve`` the operation, then replay the stored response, answer 409 while another attempt
runs, or run the handler under the new reservation (:mod:`settle.asgi.runner`). Every rule
is :class:`settle.http._rules.Guard`'s; this shell only carries its steps out over ASGI.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterable
from typing import Any, Never

from settle._async.settler import AsyncSettler
from settle._telemetry import telemetry
from settle.asgi._types import ASGIApp, Message, Receive, Scope, Send
from settle.asgi.request import ClientDisconnected, read_body, request_head
from settle.asgi.runner import AttemptRunner, send_response
from settle.errors import ConfigurationError, SettleError
from settle.http._rules import Answer, Forward, Guard, Identify, ReadBody, Release, Reserve, Run
from settle.http.attempt import held_attempts
from settle.http.keys import KeyScope
from settle.http.policy import IdempotencyPolicy, PrincipalFn
from settle.http.problems import DEFAULT_PROBLEM_TYPE_BASE
from settle.http.request import RequestTooLarge
from settle.http.stored import DEFAULT_REPLAY_HEADERS

__all__ = ["IdempotencyMiddleware"]


class IdempotencyMiddleware:
    """Makes retried unsafe requests safe: one execution per key, the same response after.

    ``principal`` maps the ASGI scope to the authenticated principal (return None for an
    unauthenticated request: 401). Keys are scoped per principal unless ``key_scope`` is
    ``"global"``; the principal is also stored as the record's binding and checked on every
    request, so no principal can receive another principal's response. ``www_authenticate``
    is the challenge that 401 sends (``'Bearer realm="api"'``; None: none). See
    :class:`~settle.http.policy.IdempotencyPolicy` for every option.
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
        www_authenticate: str | None = None,
        **unknown: Never,  # a misspelt option: a type error, and ConfigurationError when run
    ) -> None:
        if not isinstance(settler, AsyncSettler):  # a Settler's replies cannot be awaited
            raise ConfigurationError(
                f"settler must be a settle.AsyncSettler, got {type(settler).__name__} (a "
                "Settler guards WSGI apps: settle.wsgi.IdempotencyMiddleware)"
            )
        self.app = app
        self.settler = settler
        self.policy = IdempotencyPolicy.configure(
            principal=principal,
            methods=methods,
            paths=paths,
            require_key=require_key,
            header=header,
            key_scope=key_scope,
            max_key_length=max_key_length,
            lease=lease,
            timeout=timeout,
            max_request_bytes=max_request_bytes,
            max_response_bytes=max_response_bytes,
            replay_headers=replay_headers,
            retry_after=retry_after,
            operation_prefix=operation_prefix,
            problem_type_base=problem_type_base,
            www_authenticate=www_authenticate,
            **unknown,
        )
        self.policy.check_store(settler.config.max_result_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        config = self.settler.config
        head = request_head(scope, self.policy.header_bytes)
        guard = Guard(self.policy, config.namespace, config.lease, head, held_attempts(scope))
        request = telemetry().http_request(config.namespace)
        if request:
            send = _reporting(send, guard, request)
        try:
            step = guard.start()
            while True:
                match step:
                    case Forward():
                        await self.app(scope, receive, send)
                        return
                    case Answer():
                        await send_response(send, step.response)
                        return
                    case Identify():
                        try:
                            principal = self.policy.principal(scope)
                            # A plain str (what most principal callables return) is never
                            # awaitable: isawaitable's three checks end in the Awaitable ABC's
                            # (docs/benchmarks.md, the twenty-third round).
                            if type(principal) is not str and inspect.isawaitable(principal):
                                principal = await principal
                        except Exception as exc:  # noqa: BLE001  # the guard answers a 500 problem
                            step = guard.principal_failed(exc)
                        else:
                            step = guard.identified(principal)
                    case ReadBody():
                        try:
                            body = await read_body(scope, receive, step.limit, head)
                        except RequestTooLarge as exc:
                            step = guard.body_too_large(exc)
                        except ClientDisconnected:
                            guard.disconnected()  # its client is gone: nothing to send
                            return
                        else:
                            step = guard.body_read(body)
                    case Reserve():
                        try:
                            outcome = await step.call(self.settler)
                        except SettleError as exc:
                            step = guard.reserve_failed(exc)
                        else:
                            step = guard.reserved(outcome)
                    case Release():
                        step = await self._release(guard, step)
                    case Run():
                        runner = AttemptRunner(self.app, self.settler, guard, step)
                        await runner.run(scope, receive, send, body)
                        return
        finally:
            request.finished(guard.outcome)

    async def _release(self, guard: Guard, step: Release) -> Answer:
        """Mark provisional the reservation ``step`` finds this request holds, if any; the
        guard's 503 stands whatever that answers."""
        with contextlib.suppress(SettleError):
            own = step.reservation(await self.settler.get(step.operation_id))
            if own is not None:
                await self.settler.mark_provisional(own, step.reason)
        return guard.released()


def _reporting(send: Send, guard: Guard, request: Any) -> Send:
    """``send`` that reports the guard's outcome just before the response's last message:
    OpenTelemetry's ASGI instrumentation ends the server span with that message."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            request.answered(guard.outcome)
        await send(message)

    return sending
