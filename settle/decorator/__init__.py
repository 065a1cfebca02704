"""``@settler.operation(...)``: retryable outbound calls, settled once (SPEC 6).

- :mod:`settle.decorator._signature` turns a call into its operation id, request
  fingerprint and principal;
- :mod:`settle.decorator._plan` decides every step (reserve, replay, wait, run, settle,
  retry) without I/O;
- :mod:`settle.decorator._sync` and :mod:`settle.decorator._async` carry the steps out;
- :class:`settle.Attempt` (``settle/attempt.py``) is what the decorated function may
  receive; the middleware and the FastAPI helper hand the same one to a handler.
"""

from settle.decorator._async import AsyncOperation
from settle.decorator._plan import DEFAULT_RETRY
from settle.decorator._sync import Operation

__all__ = ["DEFAULT_RETRY", "AsyncOperation", "Operation"]
