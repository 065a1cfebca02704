"""Flask integration: the ``Idempotency-Key`` middleware as an extension.

    from settle.flask import Idempotency

    app.config["SETTLE"] = {"url": "redis://localhost:6379/0", "namespace": "shop",
                            "principal": tenant_of, "paths": ["/payments"]}
    Idempotency(app)          # or Idempotency().init_app(app) in an app factory

``principal`` is called with the request (``app.request_class``; read headers only, the
body is read by the middleware). The guarded view finds its
:class:`~settle.Attempt` in ``flask.g.settle`` (``request.environ["settle"]``).
The rules are :mod:`settle.http`'s, carried out by :mod:`settle.wsgi`'s middleware around
``app.wsgi_app``. Only this module imports Flask. See ``docs/http-endpoints.md``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from flask import Flask, g, got_request_exception, request

from settle.errors import ConfigurationError
from settle.http._sync import configured_guard, resolve
from settle.wsgi.middleware import IdempotencyMiddleware

__all__ = ["Idempotency"]


class Idempotency:
    """The extension: ``Idempotency(app, **options)`` or ``init_app(app)`` later.

    The options are ``app.config["SETTLE"]``, overridden by those given here: ``settler``
    (a :class:`~settle.Settler` or its dotted path) or ``url`` and ``namespace``;
    ``principal`` (required); and any option of :class:`settle.asgi.IdempotencyMiddleware`.
    """

    def __init__(self, app: Flask | None = None, **options: Any) -> None:
        self.options = options
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        if "settle" in app.extensions:
            # A second guard would wrap the first. The inner one passes a request through
            # only when the outer runs its very operation (the same header, principal,
            # key_scope and operation_prefix: Guard.identified in settle.http._rules); any
            # other configuration reserves its own key too, and the request runs under two
            # records with two sets of limits. One configuration per app.
            raise ConfigurationError(
                "settle's Idempotency is already installed on this app: call init_app once "
                "(Idempotency(app) already calls it)"
            )
        config = {**app.config.get("SETTLE", {}), **self.options}
        principal = resolve(config.pop("principal", None))
        request_class = app.request_class

        def principal_of(environ: dict[str, Any]) -> object:
            return principal(request_class(environ))

        driver = configured_guard({**config, "principal": principal_of if principal else None})
        app.wsgi_app = IdempotencyMiddleware.from_guard(  # type: ignore[method-assign]
            app.wsgi_app, driver, reached=_view_reached, raised=_view_raised
        )
        got_request_exception.connect(_mark_raised, app)
        app.preprocess_request = _refusing(app.preprocess_request)  # type: ignore[method-assign]
        # First of the app's hooks, also of those registered before init_app (an app
        # factory sets up its hooks, then its extensions): each of them may read g.settle.
        app.before_request_funcs.setdefault(None, []).insert(0, _expose_attempt)
        app.extensions["settle"] = self


def _expose_attempt() -> None:
    g.settle = request.environ.get("settle")


#: Set in the environ when the app answers before its view runs.
_REFUSED = "settle.refused_before_view"


def _refusing(preprocess: Callable[..., Any]) -> Callable[..., Any]:
    """``app.preprocess_request`` (the ``before_request`` hooks of the app and its
    blueprints, which Flask runs before the view), marking the request when the view will
    not run: a hook answered or aborted (a CSRF check's 400, an authentication hook's 401
    or 403), routing found no view (404, 405), or Flask answers ``OPTIONS`` itself. Such a
    response is sent but never stored, as a Django middleware's refusal: the same request
    sent again runs the view once what refused it is put right outside the request (a
    token in a header). Marked where it is known, never inferred from a view that did not
    say it ran: an app that dispatches in its own way still has its views' answers stored.
    """

    @functools.wraps(preprocess)
    def preprocess_request(*args: Any, **kwargs: Any) -> Any:
        try:
            answer = preprocess(*args, **kwargs)
        except BaseException:
            request.environ[_REFUSED] = True
            raise
        rule = request.url_rule
        automatic = request.method == "OPTIONS" and getattr(
            rule, "provide_automatic_options", False
        )
        if answer is not None or request.routing_exception is not None or automatic:
            request.environ[_REFUSED] = True
        return answer

    return preprocess_request


def _view_reached(environ: dict[str, Any]) -> bool:
    return not environ.get(_REFUSED)


#: Set in the environ (``time.monotonic()`` and the exception) when Flask caught an exception
#: of the request, which it answers with its 500.
_RAISED = "settle.raised"


def _mark_raised(sender: Flask, **_: Any) -> None:  # noqa: ARG001  # blinker passes it
    """Flask's ``got_request_exception``: the 500 it answers is the view's exception (settled
    as ``exception``, as under ASGI and plain WSGI), not a status the view chose. Sent
    before Flask logs the exception and renders its 500: the deadline is asked of this."""
    exception = _.get("exception")
    error = exception if isinstance(exception, BaseException) else None
    request.environ.setdefault(_RAISED, (time.monotonic(), error))


def _view_raised(environ: dict[str, Any]) -> tuple[float, BaseException | None] | None:
    raised = environ.get(_RAISED)
    return raised if isinstance(raised, tuple) else None
