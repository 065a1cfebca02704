"""The Flask shop as gunicorn serves it in the tests: with the run probe."""

from flask import g, request
from shop import probe
from shop.flask_app import app


@app.before_request
def _probe() -> None:
    probe.ran(g.get("settle"), request.path)


@app.post("/payments/flaky")
def flaky() -> tuple[dict[str, int], int]:
    return {"run": probe.crash_first(request.path)}, 201


__all__ = ["app"]
