"""Flask: the guarded request's attempt is in ``g.settle`` for every hook of the app, also
one registered before the extension (an app factory that sets up hooks, then extensions).
A real Flask app (its test client) on a real Redis."""

from __future__ import annotations

from typing import Any

from flask import Flask, g

from settle import Settler
from settle.flask import Idempotency

H = {"Idempotency-Key": "k-1", "X-Principal": "tenant:acme"}


def principal(req: Any) -> str | None:
    return req.headers.get("X-Principal")


def test_a_hook_registered_before_the_extension_sees_the_attempt(settler: Settler) -> None:
    seen: list[int | None] = []
    app = Flask(__name__)
    app.config["SETTLE"] = {"settler": settler, "principal": principal}

    @app.before_request
    def audit() -> None:
        attempt = getattr(g, "settle", None)
        seen.append(None if attempt is None else attempt.generation)

    @app.post("/pay")
    def pay() -> Any:
        return {"generation": g.settle.generation}, 201

    Idempotency(app)
    client = app.test_client()
    first = client.post("/pay", headers=H, data="x")
    again = client.post("/pay", headers=H, data="x")
    assert first.status_code == again.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true"
    assert seen == [first.get_json()["generation"]]  # the replay runs no hook of the view
