"""Flask: a response the app gives before the guarded view is reached (a ``before_request``
hook's refusal, such as a CSRF check's 400; a 404 or 405 of routing) is sent but never
stored, as under Django's middleware (``NotReached``): the same request sent again with the
same key runs the view once what refused it is put right outside the request (a token in
a header). A real Flask app over real HTTP, on a real Redis."""

from __future__ import annotations

import functools
import uuid
from typing import Any

import httpx
from flask import Blueprint, Flask, abort, g, request

from settle import Settler, State
from settle.flask import Idempotency
from settle.http.keys import operation_id
from tests.http.apps import serve_wsgi

H = {"Idempotency-Key": "k-1", "X-Principal": "tenant:acme"}


def principal(req: Any) -> str | None:
    return req.headers.get("X-Principal")


def shop(settler: Settler, runs: list[str]) -> Flask:
    app = Flask(__name__)
    app.config["SETTLE"] = {"settler": settler, "principal": principal}

    @app.before_request
    def csrf() -> Any:  # as Flask-WTF's CSRFProtect: a 400 before the view
        if request.method == "POST" and request.headers.get("X-CSRFToken") != "t0ken":
            return {"error": "the CSRF token is missing"}, 400
        return None

    @app.post("/pay")
    def pay() -> Any:
        runs.append("pay")
        return {"charge": uuid.uuid4().hex, "generation": g.settle.generation}, 201

    admin = Blueprint("admin", __name__, url_prefix="/admin")

    @admin.before_request
    def staff_only() -> None:
        if request.headers.get("X-Staff") != "yes":
            abort(403)

    @admin.post("/refund")
    def refund() -> Any:
        runs.append("refund")
        return {"refund": uuid.uuid4().hex}, 201

    app.register_blueprint(admin)
    Idempotency(app)
    return app


def state(settler: Settler, key: str) -> State:
    record = settler.get(operation_id("http", key, "tenant:acme", "principal"))
    assert record is not None
    return record.state


def test_a_before_request_refusal_is_not_stored(settler: Settler) -> None:
    runs: list[str] = []
    with serve_wsgi(shop(settler, runs)) as base, httpx.Client(base_url=base) as client:
        refused = client.post("/pay", json={"amount": 1}, headers=H)
        assert refused.status_code == 400
        assert runs == []
        assert state(settler, "k-1") is State.PROVISIONAL  # nothing ran under it
        # The token put right in a header: the same request, the same key, runs the view.
        fixed = {**H, "X-CSRFToken": "t0ken"}
        first = client.post("/pay", json={"amount": 1}, headers=fixed)
        assert first.status_code == 201, first.text
        assert "Idempotent-Replayed" not in first.headers
        again = client.post("/pay", json={"amount": 1}, headers=fixed)
        assert again.status_code == 201
        assert again.headers["Idempotent-Replayed"] == "true"
        assert again.content == first.content
        assert runs == ["pay"]
        # A changed request is still another one (the record keeps its fingerprint).
        changed = client.post("/pay", json={"amount": 2}, headers=fixed)
        assert changed.status_code == 422


def test_a_blueprint_hook_abort_is_not_stored(settler: Settler) -> None:
    runs: list[str] = []
    ok = {**H, "X-CSRFToken": "t0ken"}
    with serve_wsgi(shop(settler, runs)) as base, httpx.Client(base_url=base) as client:
        assert client.post("/admin/refund", content=b"r", headers=ok).status_code == 403
        first = client.post("/admin/refund", content=b"r", headers={**ok, "X-Staff": "yes"})
        assert first.status_code == 201
        assert runs == ["refund"]


def test_a_routing_404_and_405_are_not_stored(settler: Settler) -> None:
    runs: list[str] = []
    ok = {**H, "X-CSRFToken": "t0ken"}
    with serve_wsgi(shop(settler, runs)) as base, httpx.Client(base_url=base) as client:
        assert client.post("/nowhere", content=b"x", headers=ok).status_code == 404
        assert state(settler, "k-1") is State.PROVISIONAL
        other = {**ok, "Idempotency-Key": "k-2"}
        assert client.patch("/pay", content=b"x", headers=other).status_code == 405
        assert state(settler, "k-2") is State.PROVISIONAL


def test_an_abort_in_the_view_is_its_answer_and_stored(settler: Settler) -> None:
    app = Flask(__name__)
    app.config["SETTLE"] = {"settler": settler, "principal": principal}
    runs: list[str] = []

    @app.post("/pay")
    def pay() -> Any:
        runs.append("pay")
        abort(404)  # no such payment method: its answer

    Idempotency(app)
    with serve_wsgi(app) as base, httpx.Client(base_url=base) as client:
        first = client.post("/pay", content=b"x", headers=H)
        again = client.post("/pay", content=b"x", headers=H)
    assert first.status_code == again.status_code == 404
    assert again.headers["Idempotent-Replayed"] == "true"
    assert runs == ["pay"]


def test_flasks_own_options_answer_is_not_stored(settler: Settler) -> None:
    """``OPTIONS`` guarded by the policy: Flask answers it itself for a view that does not
    handle it (its ``Allow`` header), without the view; a view that handles it answers it."""
    app = Flask(__name__)
    app.config["SETTLE"] = {
        "settler": settler,
        "principal": principal,
        "methods": ["POST", "OPTIONS"],
    }
    runs: list[str] = []

    @app.post("/pay")
    def pay() -> Any:
        runs.append("pay")
        return {"paid": True}, 201

    @app.route("/quote", methods=["OPTIONS"], provide_automatic_options=False)
    def quote() -> Any:
        runs.append("quote")
        return {"fee": 1}, 200

    Idempotency(app)
    with serve_wsgi(app) as base, httpx.Client(base_url=base) as client:
        assert client.options("/pay", headers=H).status_code == 200
        assert state(settler, "k-1") is State.PROVISIONAL  # Flask's answer, not the view's
        other = {**H, "Idempotency-Key": "k-2"}
        first = client.options("/quote", headers=other)
        again = client.options("/quote", headers=other)
    assert first.status_code == again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert state(settler, "k-2") is State.COMPLETED
    assert runs == ["quote"]


def test_a_view_decorators_refusal_is_the_views_answer_and_stored(settler: Settler) -> None:
    """A decorator on the view (as Flask-Login's ``@login_required``) runs as part of the
    view: its 401 is stored like an ``abort()`` in the view (docs/http-endpoints.md)."""
    app = Flask(__name__)
    app.config["SETTLE"] = {"settler": settler, "principal": principal}
    runs: list[str] = []

    def login_required(view: Any) -> Any:
        @functools.wraps(view)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if request.headers.get("X-Session") != "s":
                abort(401)
            return view(*args, **kwargs)

        return guarded

    @app.post("/pay")
    @login_required
    def pay() -> Any:
        runs.append("pay")
        return {"paid": True}, 201

    Idempotency(app)
    with serve_wsgi(app) as base, httpx.Client(base_url=base) as client:
        first = client.post("/pay", content=b"x", headers=H)
        again = client.post("/pay", content=b"x", headers={**H, "X-Session": "s"})
    assert first.status_code == again.status_code == 401
    assert again.headers["Idempotent-Replayed"] == "true"
    assert state(settler, "k-1") is State.COMPLETED
    assert runs == []
