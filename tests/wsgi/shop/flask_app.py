"""The Flask shop (the example of docs/http-endpoints.md)."""

# flask_app.py
import os
import uuid

from flask import Flask, g, request

from settle.flask import Idempotency

API_KEYS = {"sk_test_acme": "tenant:acme", "sk_test_umbrella": "tenant:umbrella"}


def tenant_of(req) -> str | None:
    """Who is calling: the tenant of the bearer token. None answers 401."""
    scheme, _, token = req.headers.get("Authorization", "").partition(" ")
    return API_KEYS.get(token) if scheme.lower() == "bearer" else None


app = Flask(__name__)
app.config["SETTLE"] = {
    "url": os.environ.get("SETTLE_REDIS_URL", "redis://localhost:6379/0"),
    "namespace": os.environ.get("SETTLE_NAMESPACE", "payments"),
    "lease": float(os.environ.get("SETTLE_LEASE", "30")),
    "principal": tenant_of,
    "paths": ["/payments", "/payments/*"],
}
Idempotency(app)


@app.post("/payments")
def create_payment():
    payment = request.get_json()
    attempt = g.settle  # settle.Attempt
    charge_id = f"ch_{uuid.uuid4().hex[:16]}"  # charge with attempt.idempotency_key
    body = {**payment, "id": charge_id, "generation": attempt.generation}
    return body, 201, {"Location": f"/payments/{charge_id}"}
