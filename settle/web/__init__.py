"""The quarantine console: a web app for the people who settle the disputes (docs/console.md).

``create_app(settler, authorize=...)`` returns a Starlette app to serve or to mount in a
FastAPI or Starlette service; ``settle web`` serves it. Needs the ``web`` extra
(``pip install 'settle-sdk[web]'``).
"""

from __future__ import annotations

from settle.errors import ConfigurationError

try:
    from settle.web._security import end_sessions, token_authorizer
    from settle.web.app import create_app
except ImportError as exc:  # starlette or jinja2 missing
    raise ConfigurationError(
        f"the quarantine console needs the 'web' extra ({exc.name} is not installed): "
        "pip install 'settle-sdk[web]'"
    ) from exc

__all__ = ["create_app", "end_sessions", "token_authorizer"]
