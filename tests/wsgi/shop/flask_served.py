"""The Flask shop as gunicorn serves it in the tests: with the run probe."""

from flask import g, request
from shop import probe
from shop.flask_app import app


@app.before_request
def _probe() -> None:
    probe.ran(g.get("settle"), request.path)


__all__ = ["app"]
