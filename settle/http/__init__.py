"""The ``Idempotency-Key`` rules shared by every HTTP integration (SPEC 7), with no I/O.

The ASGI middleware (:mod:`settle.asgi`), the WSGI middleware (:mod:`settle.wsgi`) and the
Django and Flask integrations (:mod:`settle.django`, :mod:`settle.flask`) are thin shells that
carry out what :class:`settle.http._rules.Guard` decides. See ``docs/http-endpoints.md``.
"""

from settle.http.policy import IdempotencyPolicy, PrincipalFn
from settle.http.problems import ProblemKind

__all__ = ["IdempotencyPolicy", "PrincipalFn", "ProblemKind"]
