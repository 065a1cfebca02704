"""Flask: the 401 ``principal-required`` carries the configured ``WWW-Authenticate``
challenge (RFC 9110 15.5.2), on that 401 only. A real Flask app (its test client) on a
real Redis."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask, g

from settle import Settler
from settle.errors import ConfigurationError
from settle.flask import Idempotency

CHALLENGE = 'Bearer realm="shop"'


def principal(req: Any) -> str | None:
    return req.headers.get("X-Principal")


def _app(settler: Settler, **options: Any) -> Flask:
    app = Flask(__name__)
    app.config["SETTLE"] = {"settler": settler, "principal": principal, **options}

    @app.post("/pay")
    def pay() -> Any:
        return {"generation": g.settle.generation}, 201

    return app


def test_the_401_carries_the_configured_challenge(settler: Settler) -> None:
    app = _app(settler, www_authenticate=CHALLENGE)
    Idempotency(app)
    client = app.test_client()
    anonymous = client.post("/pay", headers={"Idempotency-Key": "k-1"}, data="x")
    signed_in = {"Idempotency-Key": "k-1", "X-Principal": "tenant:acme"}
    first = client.post("/pay", headers=signed_in, data="x")
    again = client.post("/pay", headers=signed_in, data="x")
    assert anonymous.status_code == 401
    assert anonymous.headers.getlist("WWW-Authenticate") == [CHALLENGE]
    assert anonymous.get_json()["type"] == "urn:settle:problem:principal-required"
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert "WWW-Authenticate" not in first.headers
    assert "WWW-Authenticate" not in again.headers


def test_a_challenge_with_a_line_break_is_refused_at_init(settler: Settler) -> None:
    with pytest.raises(ConfigurationError, match="www_authenticate must"):
        Idempotency(_app(settler), www_authenticate='Bearer realm="shop"\nX-Evil: 1')
