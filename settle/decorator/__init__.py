"""``@settler.operation(...)``: retryable outbound calls, settled once (SPEC 6).

- :mod:`settle.decorator._signature` turns a call into its operation id, request
  fingerprint and principal;
- :mod:`settle.decorator._plan` decides every step (reserve, replay, wait, run, settle,
  retry) without I/O;
- :mod:`settle.decorator._sync` and :mod:`settle.decorator._async` carry the steps out;
- :class:`Attempt` is what the decorated function may receive.
"""

from settle.decorator._async import AsyncOperation
from settle.decorator._plan import DEFAULT_RETRY
from settle.decorator._sync import Operation
from settle.decorator.attempt import Attempt

__all__ = ["DEFAULT_RETRY", "AsyncOperation", "Attempt", "Operation"]
