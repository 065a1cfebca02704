"""The ``Idempotency-Key`` header for WSGI apps (PEP 3333): no framework import.

    from settle.wsgi import IdempotencyMiddleware
    app = IdempotencyMiddleware(app, settler=settler, principal=principal_of)

The same rules as :mod:`settle.asgi` (:mod:`settle.http`), on the sync :class:`settle.Settler`.
A guarded handler finds its :class:`settle.Attempt` in ``environ["settle"]``
(:func:`current_attempt`). See ``docs/http-endpoints.md``.
"""

from settle.wsgi.middleware import IdempotencyMiddleware, current_attempt

__all__ = ["IdempotencyMiddleware", "current_attempt"]
