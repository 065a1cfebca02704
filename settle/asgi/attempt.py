"""The :class:`~settle.Attempt` a guarded handler finds in ``scope["settle"]``:
:func:`settle.http.attempt.current_attempt`, under its former ASGI name."""

from settle.http.attempt import current_attempt

__all__ = ["current_attempt"]
