"""Jitter from settle's own random generator, never the process's shared one.

settle's retries and polls run in the caller's threads and in its heartbeat threads. Drawn
from the ``random`` module's shared state, their jitter would move an application's seeded
sequence (a simulation, a reproducible test) each time settle retried, and a tool that
watches that state while it draws its own values (hypothesis) would call the application's
test unreliable. tenacity's random waits draw from the shared state; settle's use these.
"""

from __future__ import annotations

import os
import random

from tenacity import RetryCallState, wait_random, wait_random_exponential

__all__ = ["OwnRandomExponentialWait", "OwnRandomWait", "draw"]

_RANDOM = random.Random()  # noqa: S311  # jitter, not a secret
# A forked child starts from its parent's state: draw its own sequence (as ``random`` does),
# or parent and children would back off in step.
os.register_at_fork(after_in_child=_RANDOM.seed)

draw = _RANDOM.random
"""A float in [0, 1) from settle's own generator."""


class OwnRandomWait(wait_random):
    """``tenacity.wait_random`` drawing from settle's own generator."""

    def __call__(self, retry_state: RetryCallState) -> float:  # noqa: ARG002  # tenacity's
        return self.wait_random_min + draw() * (self.wait_random_max - self.wait_random_min)


class OwnRandomExponentialWait(wait_random_exponential):
    """``tenacity.wait_random_exponential`` drawing from settle's own generator."""

    def __call__(self, retry_state: RetryCallState) -> float:
        high = super(wait_random_exponential, self).__call__(retry_state)
        return _RANDOM.uniform(self.min, high)
