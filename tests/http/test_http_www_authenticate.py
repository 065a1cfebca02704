"""The 401 ``principal-required`` and its ``WWW-Authenticate`` challenge (RFC 9110 15.5.2:
a 401 MUST carry one), under both protocols: a Starlette app under a real uvicorn server
and a bare PEP 3333 app under the stdlib's threading WSGI server, on a real Redis, through
real httpx clients. (Django and Flask: tests/wsgi.)

The guards answered every 401 without the header, so a client (or an HTTP library that
follows challenges) was told to authenticate but not how. The application names its
challenge with ``www_authenticate``; settle sends it on that 401 only, never stores or
replays it, and leaves the problem document as it was. Without it, no challenge is made
up (docs/http-endpoints.md, "The 401 and its challenge").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from settle import AsyncSettler, Settler
from settle.asgi import IdempotencyMiddleware
from settle.errors import ConfigurationError
from settle.http import IdempotencyPolicy
from settle.wsgi import IdempotencyMiddleware as WSGIMiddleware
from tests.http.apps import Ledger, serve, serve_wsgi, starlette_app, wsgi_app

CHALLENGE = 'Bearer realm="payments", error="invalid_token"'
PAYMENT = {"amount": 4200, "currency": "EUR"}

#: The 401's problem document, with or without a challenge.
UNAUTHENTICATED = {
    "type": "urn:settle:problem:principal-required",
    "title": "Authentication is required",
    "status": 401,
    "detail": "authenticate: a guarded request is bound to the principal that sent it",
}


def _principal(value: str | None) -> str | None:
    """``X-Principal`` names the principal; ``empty`` stands for a callable returning ``""``
    (no usable principal: the same 401)."""
    return "" if value == "empty" else value


def _asgi_principal(scope: Any) -> str | None:
    value = dict(scope["headers"]).get(b"x-principal")
    return _principal(None if value is None else value.decode("latin-1"))


def _wsgi_principal(environ: dict[str, Any]) -> str | None:
    return _principal(environ.get("HTTP_X_PRINCIPAL"))


@dataclass
class Endpoint:
    protocol: str
    client: httpx.Client
    ledger: Ledger


@contextlib.contextmanager
def _endpoint(protocol: str, redis_url: str, namespace: str, **options: Any) -> Iterator[Endpoint]:
    ledger = Ledger()
    with contextlib.ExitStack() as stack:
        if protocol == "asgi":
            async_settler = AsyncSettler.from_url(redis_url, namespace=namespace)
            app = starlette_app(async_settler, ledger, principal=_asgi_principal, **options)
            base = stack.enter_context(serve(app, async_settler))
        else:
            settler = stack.enter_context(
                contextlib.closing(Settler.from_url(redis_url, namespace=namespace))
            )
            app = wsgi_app(settler, ledger, principal=_wsgi_principal, **options)
            base = stack.enter_context(serve_wsgi(app))
        client = stack.enter_context(httpx.Client(base_url=base, timeout=30))
        yield Endpoint(protocol, client, ledger)


@pytest.fixture(params=["asgi", "wsgi"])
def challenging(
    request: pytest.FixtureRequest, redis_url: str, namespace: str
) -> Iterator[Endpoint]:
    """An endpoint configured with ``www_authenticate=CHALLENGE``."""
    with _endpoint(request.param, redis_url, namespace, www_authenticate=CHALLENGE) as endpoint:
        yield endpoint


@pytest.fixture(params=["asgi", "wsgi"])
def plain(request: pytest.FixtureRequest, redis_url: str, namespace: str) -> Iterator[Endpoint]:
    """An endpoint configured without ``www_authenticate``."""
    with _endpoint(request.param, redis_url, namespace) as endpoint:
        yield endpoint


def _post(endpoint: Endpoint, key: str | None, principal: str | None) -> httpx.Response:
    headers = {}
    if key is not None:
        headers["Idempotency-Key"] = key
    if principal is not None:
        headers["X-Principal"] = principal
    return endpoint.client.post("/payments", json=PAYMENT, headers=headers)


@pytest.mark.parametrize("principal", [None, "empty"], ids=["none", "empty"])
def test_the_401_carries_the_configured_challenge(
    challenging: Endpoint, redis_client: Any, namespace: str, principal: str | None
) -> None:
    response = _post(challenging, "k-1", principal)
    assert response.status_code == 401
    assert response.headers.get_list("www-authenticate") == [CHALLENGE]
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json() == UNAUTHENTICATED
    assert challenging.ledger.count() == 0
    assert redis_client.keys(f"settle:{{{namespace}:*") == []  # nothing stored


def test_the_challenge_is_on_the_401_only_and_never_stored_or_replayed(
    challenging: Endpoint,
) -> None:
    anonymous = _post(challenging, "k-1", None)
    assert anonymous.headers["www-authenticate"] == CHALLENGE
    # The same key, authenticated now: the handler runs, and neither its response nor the
    # replay carries the challenge; the other problems do not either.
    first = _post(challenging, "k-1", "tenant:acme")
    again = _post(challenging, "k-1", "tenant:acme")
    missing = _post(challenging, None, None)  # the key is checked first: a 400
    assert (first.status_code, again.status_code, missing.status_code) == (201, 201, 400)
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content
    for response in (first, again, missing):
        assert "www-authenticate" not in response.headers
    assert challenging.ledger.count() == 1


def test_without_the_option_no_challenge_is_made_up(plain: Endpoint) -> None:
    """settle cannot know the application's scheme, and a made-up one misleads a client (a
    browser given ``Basic`` asks its user for a password): the 401 goes out as before."""
    response = _post(plain, "k-1", None)
    assert response.status_code == 401
    assert "www-authenticate" not in response.headers
    assert response.json() == UNAUTHENTICATED


BAD_CHALLENGES = [
    pytest.param('Bearer realm="api"\r\nSet-Cookie: session=evil', id="header-injection"),
    pytest.param('Bearer realm="api"\n', id="trailing-newline"),
    pytest.param('Bearer\trealm="api"', id="tab"),
    pytest.param('Bearer realm="api",\terror="invalid_token"', id="tab-between-parameters"),
    pytest.param('Bearer realm="api\x00"', id="nul"),
    pytest.param('Bearer realm="caf\u00e9"', id="non-ascii"),
    pytest.param('realm="api"', id="no-scheme"),
    pytest.param("", id="empty"),
    pytest.param(" Bearer", id="leading-space"),
    pytest.param("Bearer ", id="trailing-space"),
    pytest.param(b"Bearer", id="bytes"),
    pytest.param(["Bearer"], id="list"),
    pytest.param(1, id="int"),
    # RFC 9110 11.6.1's grammar, not only its characters:
    pytest.param('Bearer realm="api', id="unclosed-quoted-string"),
    pytest.param("Bearer,realm=x", id="a-parameter-with-no-scheme"),
    pytest.param('Bearer realm="a" error="b"', id="parameters-without-a-comma"),
    pytest.param('Bearer realm="a"x', id="text-after-a-quoted-string"),
    pytest.param("Bearer realm=a b", id="a-value-with-a-space-unquoted"),
    pytest.param('Bearer realm="a\\"', id="a-closing-quote-escaped-leaves-it-unclosed"),
    pytest.param('Bearer realm=, error="x"', id="a-parameter-with-no-value"),
    pytest.param('Bearer realm="api", error=', id="a-later-parameter-with-no-value"),
    pytest.param('Bearer realm "api"', id="a-parameter-with-no-equals-sign"),
    pytest.param('Bearer realm="api",', id="a-trailing-comma"),
    pytest.param("Bearer a=b=c", id="an-equals-sign-inside-a-token68"),
    pytest.param(", Bearer", id="a-leading-comma"),
]


@pytest.mark.parametrize("challenge", BAD_CHALLENGES)
def test_a_bad_challenge_is_refused_when_the_policy_is_made(challenge: object) -> None:
    with pytest.raises(ConfigurationError, match="www_authenticate must"):
        IdempotencyPolicy.configure(principal=_asgi_principal, www_authenticate=challenge)


@pytest.mark.asyncio
@pytest.mark.parametrize("challenge", BAD_CHALLENGES[:2])
async def test_the_asgi_and_wsgi_guards_refuse_a_bad_challenge(
    async_settler: AsyncSettler, settler: Settler, challenge: object
) -> None:
    async def asgi_app(*_: Any) -> None:
        raise AssertionError("never called")

    def app(*_: Any) -> list[bytes]:
        raise AssertionError("never called")

    with pytest.raises(ConfigurationError, match="www_authenticate must"):
        IdempotencyMiddleware(
            asgi_app,
            settler=async_settler,
            principal=_asgi_principal,
            www_authenticate=challenge,  # type: ignore[arg-type]
        )
    with pytest.raises(ConfigurationError, match="www_authenticate must"):
        WSGIMiddleware(app, settler=settler, principal=_wsgi_principal, www_authenticate=challenge)


@pytest.mark.parametrize(
    "challenge",
    [
        "Bearer",
        'Bearer realm="api"',
        'Basic realm="api", charset="UTF-8"',
        "Negotiate abc+/=",
        "Bearer abc==",  # a token68
        'Negotiate, Basic realm="api"',  # a scheme alone, then another challenge
        'Bearer realm="a \\"b\\", c", error="invalid_token", Basic realm="b"',  # \" and a comma
        'Digest realm="x", qop="auth,auth-int", nonce="abc", Bearer',
        "Bearer realm = api",  # BWS around "="
        'Bearer realm=""',  # an empty quoted-string
        'Bearer realm="a\\ b"',  # a quoted-pair of a space
        "Bearer a~b",  # a token68 with "~"
        "X-Token.v2 key_id=k-1",  # tchars beyond letters in a scheme, a name and a value
    ],
)
def test_a_challenge_is_taken_as_given(challenge: str) -> None:
    policy = IdempotencyPolicy.configure(principal=_asgi_principal, www_authenticate=challenge)
    assert policy.www_authenticate == challenge
