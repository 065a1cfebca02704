"""Django views guarded the ways the peers' suites use (django-idempotency-key,
drf-idempotencykey): the middleware around a decorated view, a REST framework handler method,
settings overridden per test, a request the CSRF check refuses, an async view. A real Django
(its test client, in this process) on a real Redis; tests/wsgi/test_wsgi_gunicorn.py runs a
Django project under gunicorn."""

from __future__ import annotations

import contextlib
import gzip
import io
import itertools
import json
import socket
import sys
import threading
import tracemalloc
import types
import uuid
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import django
from django.conf import settings

if not settings.configured:
    settings.configure(
        SECRET_KEY="settle-tests-only",
        DEBUG=False,
        ALLOWED_HOSTS=["testserver"],
        ROOT_URLCONF="tests.wsgi.test_django_views",
        INSTALLED_APPS=["rest_framework"],
        DATABASES={},
        MIDDLEWARE=[],
        REST_FRAMEWORK={
            "DEFAULT_AUTHENTICATION_CLASSES": [],
            "DEFAULT_PERMISSION_CLASSES": [],
            "UNAUTHENTICATED_USER": None,
            "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
        },
        USE_TZ=True,
    )
    django.setup()

import httpx
import pytest
from django.core.exceptions import (
    BadRequest,
    PermissionDenied,
    RequestDataTooBig,
    SuspiciousOperation,
)
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished
from django.http import (
    FileResponse,
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    HttpResponseRedirect,
    JsonResponse,
    StreamingHttpResponse,
)
from django.http.multipartparser import MultiPartParserError
from django.middleware.csrf import CsrfViewMiddleware
from django.template.response import SimpleTemplateResponse
from django.test import Client, override_settings
from django.test.client import encode_multipart
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.cache import never_cache
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.response import Response
from rest_framework.views import APIView
from rest_framework.viewsets import ViewSet
from structlog.testing import capture_logs

from settle import AsyncSettler, Settler, State
from settle.asgi import IdempotencyMiddleware as ASGIGuard
from settle.django import _VIEW_GUARDS, idempotent
from settle.django import IdempotencyMiddleware as DjangoGuard
from settle.errors import ConfigurationError
from settle.http.keys import operation_id
from settle.wsgi import IdempotencyMiddleware as WSGIGuard
from tests.http.apps import serve, serve_wsgi
from tests.wsgi.servers import Sending, connect, read_answer, reset
from tests.wsgi.test_wsgi_lost_lease import lose, superseded_and_untouched
from tests.wsgi.test_wsgi_middleware import _take_over

urlpatterns: list[Any] = []
_modules = itertools.count()
RUNS: list[str] = []


def principal(request: Any) -> str | None:
    return request.META.get("HTTP_X_PRINCIPAL")


def urlconf(*patterns: Any) -> str:
    """A fresh URLconf module (Django caches resolvers per module name)."""
    name = f"settle_urls_{next(_modules)}"
    module = types.ModuleType(name)
    module.urlpatterns = list(patterns)  # type: ignore[attr-defined]
    sys.modules[name] = module
    return name


@pytest.fixture
def settle_settings(settler: Settler) -> Iterator[dict[str, Any]]:
    RUNS.clear()
    options = {"settler": settler, "principal": principal}
    with override_settings(SETTLE=options):
        yield options


def headers(key: str) -> dict[str, str]:
    return {"HTTP_IDEMPOTENCY_KEY": key, "HTTP_X_PRINCIPAL": "tenant:acme"}


# -- 1. the decorator on a view that the middleware guards too ------------------------------


def test_decorated_view_under_the_middleware(settle_settings: dict[str, Any]) -> None:
    """django-idempotency-key's own usage (tests/views.py + tests/tests/test_middleware.py):
    the middleware installed and the view decorated. Expected: one run, then a replay."""

    @idempotent
    def create(request: HttpRequest) -> JsonResponse:
        RUNS.append("create")
        return JsonResponse({"id": uuid.uuid4().hex}, status=201)

    middleware = ["settle.django.IdempotencyMiddleware"]
    with override_settings(ROOT_URLCONF=urlconf(path("create", create)), MIDDLEWARE=middleware):
        client = Client()
        first = client.post("/create", {}, **headers("k-1"))
        again = client.post("/create", {}, **headers("k-1"))
    assert (first.status_code, again.status_code) == (201, 201), (first.content, again.content)
    assert again.content == first.content
    assert RUNS == ["create"]


# -- 2. the decorator on a class-based view's handler method --------------------------------


class PaymentAPIView(APIView):
    @method_decorator(idempotent)
    def post(self, request: Any) -> Response:
        RUNS.append("post")
        return Response({"id": uuid.uuid4().hex}, status=201)


class PaymentViewSet(ViewSet):
    @method_decorator(idempotent)
    def create(self, request: Any) -> Response:
        RUNS.append("create")
        return Response({"id": uuid.uuid4().hex}, status=201)


@pytest.mark.parametrize(
    "view",
    [PaymentAPIView.as_view(), PaymentViewSet.as_view({"post": "create"})],
    ids=["APIView.post", "ViewSet.create"],
)
def test_decorated_drf_handler_method(settle_settings: dict[str, Any], view: Any) -> None:
    """django-idempotency-key tests/viewsets.py decorates a ViewSet's ``create``;
    drf-idempotencykey guards APIView.post. Django's way to decorate a method with a
    function decorator is method_decorator. Expected: 201, then the same 201 replayed."""
    with override_settings(ROOT_URLCONF=urlconf(path("pay", view))):
        client = Client(raise_request_exception=False)
        first = client.post("/pay", {}, **headers("k-2"))
        again = client.post("/pay", {}, **headers("k-2"))
    assert len(RUNS) == 1, (RUNS, first.status_code, again.status_code)
    assert (first.status_code, again.status_code) == (201, 201), (first.content, again.content)
    assert again.content == first.content  # each retry ran the handler (a charge) again
    assert again["Idempotent-Replayed"] == "true"


# -- 3. settings changed after the decorated view served a request -------------------------


def test_decorator_follows_overridden_settings(settle_settings: dict[str, Any]) -> None:
    """Peer suites change settings per test (override_settings / pytest-django's
    ``settings``: IDEMPOTENCY_KEY_REQUIRED, IDEMPOTENCY_KEY_HEADER, ...). The middleware
    re-reads SETTLE when the test client loads it; the decorator should too."""

    @idempotent
    def create(request: HttpRequest) -> JsonResponse:
        RUNS.append("create")
        return JsonResponse({"ok": True}, status=201)

    with override_settings(ROOT_URLCONF=urlconf(path("create", create))):
        assert Client().post("/create", {}, **headers("k-3")).status_code == 201
        with override_settings(SETTLE={**settle_settings, "header": "X-Idempotency-Key"}):
            response = Client().post(
                "/create", {}, HTTP_X_IDEMPOTENCY_KEY="k-4", HTTP_X_PRINCIPAL="tenant:acme"
            )
    assert response.status_code == 201, response.content


# -- 4. CSRF: a request the CSRF check refused never reached the view -----------------------


def test_csrf_refusal_does_not_consume_the_key(settle_settings: dict[str, Any]) -> None:
    """django-idempotency-key runs in process_view, after CsrfViewMiddleware's: a POST the
    CSRF check refuses (403) leaves the key unused. The client fetches a token and retries
    with the same key (token in X-CSRFToken, same body): the view must run."""

    def create(request: HttpRequest) -> JsonResponse:
        RUNS.append("create")
        return JsonResponse({"ok": True}, status=201)

    middleware = [
        "django.middleware.csrf.CsrfViewMiddleware",
        "settle.django.IdempotencyMiddleware",
    ]
    with override_settings(ROOT_URLCONF=urlconf(path("create", create)), MIDDLEWARE=middleware):
        client = Client(enforce_csrf_checks=True)
        refused = client.post("/create", {"a": "1"}, **headers("k-csrf"))
        token = "a" * 32
        client.cookies["csrftoken"] = token
        retried = client.post("/create", {"a": "1"}, HTTP_X_CSRFTOKEN=token, **headers("k-csrf"))
    assert refused.status_code == 403
    assert (retried.status_code, RUNS) == (201, ["create"]), (
        retried.status_code,
        retried.get("Idempotent-Replayed"),
    )


class _ProjectCsrf(CsrfViewMiddleware):
    """A project's own CSRF middleware (a subclass), listed by its dotted path."""


@pytest.mark.parametrize(
    ("middleware", "warned"),
    [
        (["settle.django.IdempotencyMiddleware", "django.middleware.csrf.CsrfViewMiddleware"], 1),
        (["settle.django.IdempotencyMiddleware", f"{__name__}._ProjectCsrf"], 1),
        (["django.middleware.csrf.CsrfViewMiddleware", "settle.django.IdempotencyMiddleware"], 0),
        (["settle.django.IdempotencyMiddleware"], 0),
    ],
    ids=["before-csrf", "before-a-subclass", "after-csrf", "no-csrf"],
)
def test_listed_before_the_csrf_check_is_logged_at_start(
    settle_settings: dict[str, Any], middleware: list[str], warned: int
) -> None:
    """Listed before ``CsrfViewMiddleware``, settle's middleware lets a request through to
    the view before the CSRF check refuses it, so the 403 is stored and replayed for the key
    and the request sent again with its token never runs the view: a deployment that lists
    it so is told once, as Django loads the middleware, what to change (not refused: views
    that are all ``csrf_exempt`` lose nothing)."""

    def create(request: HttpRequest) -> JsonResponse:
        return JsonResponse({"ok": True}, status=201)

    conf = urlconf(path("create", create))
    with override_settings(ROOT_URLCONF=conf, MIDDLEWARE=middleware), capture_logs() as logs:
        client = Client()
        client.post("/create", {"a": "1"}, **headers("k-order"))
        client.post("/create", {"a": "1"}, **headers("k-order"))
    order = [e for e in logs if e["event"] == "settle.django.middleware_order"]
    assert len(order) == warned, order
    if warned:
        assert order[0]["log_level"] == "warning"
        assert order[0]["middleware"] == "settle.django.IdempotencyMiddleware"
        assert order[0]["before"] == middleware[1]


def _function_middleware(get_response: Callable[[HttpRequest], Any]) -> Any:
    """A project's function-based middleware (Django's middleware factory form)."""

    def middleware(request: HttpRequest) -> Any:
        return get_response(request)

    return middleware


@pytest.mark.parametrize(
    ("middleware", "warned"),
    [
        (
            (
                f"{__name__}._function_middleware",
                "django.middleware.csrf.CsrfViewMiddleware",
                "settle.django.IdempotencyMiddleware",
            ),
            0,
        ),
        (
            (
                "settle.django.IdempotencyMiddleware",
                f"{__name__}._function_middleware",
                "django.middleware.csrf.CsrfViewMiddleware",
            ),
            1,
        ),
    ],
    ids=["after-csrf", "before-csrf"],
)
def test_a_function_middleware_listed_does_not_stop_the_project_starting(
    settle_settings: dict[str, Any], middleware: tuple[str, ...], warned: int
) -> None:
    """A function-based middleware (a factory, not a class: Django's own documented form)
    listed in ``MIDDLEWARE`` (a tuple here) must not make settle's order check fail the
    project's start: every request was a 500 (``TypeError`` of ``issubclass``) and the
    view never ran. The order is still checked around it."""
    ran: list[int] = []

    def create(request: HttpRequest) -> JsonResponse:
        ran.append(1)
        return JsonResponse({"ok": True}, status=201)

    conf = urlconf(path("create", create))
    with override_settings(ROOT_URLCONF=conf, MIDDLEWARE=middleware), capture_logs() as logs:
        client = Client(enforce_csrf_checks=False)
        answer = client.post("/create", {"a": "1"}, **headers("k-function-mw"))
    assert answer.status_code == 201
    assert ran == [1]
    order = [e for e in logs if e["event"] == "settle.django.middleware_order"]
    assert len(order) == warned, order


def test_csrf_refusal_then_a_token_added_to_the_body_is_a_changed_request(
    settle_settings: dict[str, Any],
) -> None:
    """The key stays bound to the request the CSRF check refused: the token added to the
    form body (``csrfmiddlewaretoken``) makes another request, 422 as any changed body, and
    the view does not run; the record is neither released nor rebound (an earlier attempt
    under the key may have run the view). The same form with the token in X-CSRFToken is
    the same request, and runs the view (docs/http-endpoints.md, Django, "Order")."""

    def checkout(request: HttpRequest) -> HttpResponseBase:
        RUNS.append("checkout")
        return HttpResponseRedirect("/receipt/1")

    middleware = [
        "django.middleware.csrf.CsrfViewMiddleware",
        "settle.django.IdempotencyMiddleware",
    ]
    form = {"amount": "10"}
    conf = urlconf(path("checkout", checkout))
    with override_settings(ROOT_URLCONF=conf, MIDDLEWARE=middleware):
        client = Client(enforce_csrf_checks=True)
        refused = client.post("/checkout", form, **headers("k-form"))
        token = "a" * 32
        client.cookies["csrftoken"] = token
        in_body = {**form, "csrfmiddlewaretoken": token}
        changed = client.post("/checkout", in_body, **headers("k-form"))
        in_header = client.post("/checkout", form, HTTP_X_CSRFTOKEN=token, **headers("k-form"))
    assert refused.status_code == 403
    assert changed.status_code == 422
    assert changed.json()["type"] == "urn:settle:problem:idempotency-key-reused"
    assert in_header.status_code == 302
    assert RUNS == ["checkout"]


# -- 5. an async view: refused when decorated (settle.django guards sync views) -------------


def test_an_async_view_is_refused_when_decorated() -> None:
    async def create(request: HttpRequest) -> JsonResponse:
        return JsonResponse({}, status=201)

    with pytest.raises(ConfigurationError, match="async view"):
        idempotent(create)

    class AsyncView(View):
        async def post(self, request: HttpRequest) -> JsonResponse:
            return JsonResponse({}, status=201)

    with pytest.raises(ConfigurationError, match="async view"):
        idempotent(AsyncView.as_view())


# -- what the peers' suites check and settle does as they expect ---------------------------


def twice(view: Any, key: str = "k", route: str = "v", **extra: Any) -> tuple[Any, Any]:
    with override_settings(ROOT_URLCONF=urlconf(path(route, view))):
        client = Client(raise_request_exception=False)
        first = client.post("/" + route, {"a": "1"}, **{**headers(key), **extra})
        again = client.post("/" + route, {"a": "1"}, **{**headers(key), **extra})
    return first, again


def test_plain_view_method_decorator(settle_settings: dict[str, Any]) -> None:
    class V(View):
        @method_decorator(idempotent)
        def post(self, request: Any) -> JsonResponse:
            RUNS.append("p")
            return JsonResponse({"id": uuid.uuid4().hex}, status=201)

    first, again = twice(V.as_view())
    assert (first.status_code, again.status_code, RUNS) == (201, 201, ["p"])
    assert again.content == first.content
    assert again["Idempotent-Replayed"] == "true"


def test_api_view_function(settle_settings: dict[str, Any]) -> None:
    @idempotent
    @api_view(["POST"])
    def create(request: Any) -> Response:
        RUNS.append("c")
        return Response(
            {"id": uuid.uuid4().hex, "gen": request.settle.generation},
            status=201,
            headers={"Location": "/x/1"},
        )

    first, again = twice(create)
    assert (first.status_code, again.status_code, RUNS) == (201, 201, ["c"])
    assert again.content == first.content
    assert again["Location"] == "/x/1"


class PIn(serializers.Serializer):
    amount = serializers.IntegerField(min_value=1)


def test_drf_validation_400_is_stored(settle_settings: dict[str, Any]) -> None:
    class V(APIView):
        def post(self, request: Any) -> Response:
            RUNS.append("v")
            PIn(data=request.data).is_valid(raise_exception=True)
            return Response({}, status=201)

    first, again = twice(idempotent(V.as_view()))
    assert (first.status_code, again.status_code, RUNS) == (400, 400, ["v"])
    assert again.content == first.content


def test_500_and_exception_not_stored(settle_settings: dict[str, Any]) -> None:
    @idempotent
    def boom(request: HttpRequest) -> HttpResponse:
        RUNS.append("b")
        return HttpResponse("no", status=503)

    first, again = twice(boom)
    assert (first.status_code, again.status_code, RUNS) == (503, 503, ["b", "b"])

    @idempotent
    def raises(request: HttpRequest) -> HttpResponse:
        RUNS.append("r")
        raise RuntimeError("x")

    RUNS.clear()
    first, again = twice(raises, key="k2")
    assert (first.status_code, again.status_code, RUNS) == (500, 500, ["r", "r"])


def test_html_template_response_replayed(settle_settings: dict[str, Any]) -> None:
    @idempotent
    def page(request: HttpRequest) -> HttpResponse:
        RUNS.append("h")
        return HttpResponse(f"<p>{uuid.uuid4().hex}</p>", status=201)

    first, again = twice(page)
    assert (first.status_code, again.status_code, RUNS) == (201, 201, ["h"])
    assert again.content == first.content
    assert again["Content-Type"] == first["Content-Type"]


def test_streaming_and_file_responses(settle_settings: dict[str, Any]) -> None:
    @idempotent
    def stream(request: HttpRequest) -> StreamingHttpResponse:
        RUNS.append("s")
        return StreamingHttpResponse(
            iter([b"a", uuid.uuid4().hex.encode()]), status=201, content_type="text/plain"
        )

    first, again = twice(stream)
    assert (first.status_code, again.status_code, RUNS) == (201, 201, ["s"])
    assert b"".join(first.streaming_content) == again.content

    @idempotent
    def file(request: HttpRequest) -> FileResponse:
        RUNS.append("f")
        return FileResponse(
            io.BytesIO(uuid.uuid4().hex.encode()), as_attachment=True, filename="r.txt"
        )

    RUNS.clear()
    first, again = twice(file, key="kf")
    assert (first.status_code, again.status_code, RUNS) == (200, 200, ["f"])
    assert b"".join(first.streaming_content) == again.content
    assert "Content-Disposition" in first
    assert "Content-Disposition" not in again


def test_principal_scoping_and_missing_key(settle_settings: dict[str, Any]) -> None:
    @idempotent
    def create(request: HttpRequest) -> JsonResponse:
        RUNS.append(request.META["HTTP_X_PRINCIPAL"])
        return JsonResponse({"id": uuid.uuid4().hex}, status=201)

    with override_settings(ROOT_URLCONF=urlconf(path("c", create))):
        c = Client()
        a = c.post("/c", {}, HTTP_IDEMPOTENCY_KEY="same", HTTP_X_PRINCIPAL="tenant:a")
        b = c.post("/c", {}, HTTP_IDEMPOTENCY_KEY="same", HTTP_X_PRINCIPAL="tenant:b")
        missing = c.post("/c", {}, HTTP_X_PRINCIPAL="tenant:a")
        anon = c.post("/c", {}, HTTP_IDEMPOTENCY_KEY="z")
        changed = c.post("/c", {"x": "2"}, HTTP_IDEMPOTENCY_KEY="same", HTTP_X_PRINCIPAL="tenant:a")
        get = c.get("/c", HTTP_X_PRINCIPAL="tenant:a")
    assert a.content != b.content
    assert RUNS[:2] == ["tenant:a", "tenant:b"]
    assert (missing.status_code, anon.status_code, changed.status_code, get.status_code) == (
        400,
        401,
        422,
        201,
    )


def test_optional_key(settle_settings: dict[str, Any]) -> None:
    @idempotent(require_key=False)
    def create(request: HttpRequest) -> JsonResponse:
        RUNS.append("o")
        return JsonResponse({"settle": getattr(request, "settle", None) is not None}, status=201)

    with override_settings(ROOT_URLCONF=urlconf(path("c", create))):
        r = Client().post("/c", {}, HTTP_X_PRINCIPAL="tenant:a")
    assert r.status_code == 201
    assert r.json() == {"settle": False}


def test_multipart_upload_through_middleware(settle_settings: dict[str, Any]) -> None:
    def upload(request: HttpRequest) -> JsonResponse:
        RUNS.append("u")
        f = request.FILES["doc"]
        return JsonResponse(
            {"size": f.size, "name": request.POST["name"], "id": uuid.uuid4().hex}, status=201
        )

    mw = ["settle.django.IdempotencyMiddleware"]
    with override_settings(ROOT_URLCONF=urlconf(path("up", upload)), MIDDLEWARE=mw):
        c = Client()
        data = {"name": "n", "doc": SimpleUploadedFile("a.txt", b"hello")}
        first = c.post("/up", data, **headers("up"))
        data = {"name": "n", "doc": SimpleUploadedFile("a.txt", b"hello")}
        again = c.post("/up", data, **headers("up"))
    assert first.status_code == 201
    assert first.json()["size"] == 5
    assert again.content == first.content
    assert RUNS == ["u"]


BIG = 3 << 20  # over Django's DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB)


def measured(request: HttpRequest) -> JsonResponse:
    """What a view gets of a large body: its size, or its own 413 when Django refuses it
    (``RequestDataTooBig``, from ``request.body`` or from a form's fields)."""
    RUNS.append("measured")
    try:
        if request.content_type == "application/json":
            size = len(json.loads(request.body)["pad"])
        else:
            size = sum(len(v) for v in request.POST.values())
            size += sum(f.size or 0 for f in request.FILES.values())
    except RequestDataTooBig:
        return JsonResponse({"refused": "too big"}, status=413)
    return JsonResponse({"size": size}, status=201)


LARGE_BODIES: dict[str, Callable[[], dict[str, Any]]] = {
    "file": lambda: {"data": {"doc": SimpleUploadedFile("a.bin", b"x" * BIG)}},
    "form-field": lambda: {"data": {"note": "x" * BIG}},
    "json": lambda: {"data": {"pad": "x" * BIG}, "content_type": "application/json"},
    "urlencoded": lambda: {
        "data": "pad=" + "x" * BIG,
        "content_type": "application/x-www-form-urlencoded",
    },
}


@pytest.mark.parametrize("body", LARGE_BODIES.values(), ids=LARGE_BODIES.keys())
def test_a_large_body_gets_what_django_alone_gives_the_view(
    settle_settings: dict[str, Any], body: Callable[[], dict[str, Any]]
) -> None:
    """settle reads the body under its own ``max_request_bytes`` (raised here to 8 MiB)
    and leaves it for the view to read as Django would: Django's DATA_UPLOAD_MAX_MEMORY_SIZE
    applies where it does without settle (``request.body``, a form's fields), never to an
    upload's files. settle used to read ``request.body`` itself, so every body over 2.5 MB
    got Django's bare 400 before the view, a 3 MB file upload included."""
    conf = urlconf(path("big", measured))
    with override_settings(ROOT_URLCONF=conf, MIDDLEWARE=[]):
        bare = Client().post("/big", **body(), **headers("bare"))
    mw = ["settle.django.IdempotencyMiddleware"]
    options = {**settle_settings, "max_request_bytes": 8 << 20}
    RUNS.clear()
    with override_settings(ROOT_URLCONF=conf, MIDDLEWARE=mw, SETTLE=options):
        guarded = Client().post("/big", **body(), **headers("big"))
        again = Client().post("/big", **body(), **headers("big"))
    assert (guarded.status_code, guarded.content) == (bare.status_code, bare.content)
    assert again.content == guarded.content
    assert again["Idempotent-Replayed"] == "true"
    assert RUNS == ["measured"]


def test_a_body_over_max_request_bytes_is_refused_by_settle(
    settle_settings: dict[str, Any],
) -> None:
    """Read under settle's own limit: a body over ``max_request_bytes`` is settle's 413
    problem, whatever Django's limits say, and the view never runs."""
    mw = ["settle.django.IdempotencyMiddleware"]
    options = {**settle_settings, "max_request_bytes": 1 << 20}
    conf = urlconf(path("big", measured))
    with override_settings(ROOT_URLCONF=conf, MIDDLEWARE=mw, SETTLE=options):
        data = {"doc": SimpleUploadedFile("a.bin", b"x" * (2 << 20))}
        refused = Client().post("/big", data, **headers("too-big"))
    assert refused.status_code == 413
    assert refused.json()["type"] == "urn:settle:problem:request-too-large"
    assert RUNS == []


def reads_the_body(request: HttpRequest) -> JsonResponse:
    """A view that reads the body and the form with no guard against Django's limits."""
    RUNS.append("reads")
    return JsonResponse({"size": len(request.body), "fields": len(request.POST)}, status=201)


class ReadsTheBodyAPIView(APIView):
    @method_decorator(idempotent)
    def post(self, request: Any) -> Response:
        RUNS.append("reads")
        return Response({"size": len(request.body), "fields": len(request.POST)}, status=201)


REFUSED_BODIES: dict[str, dict[str, Any]] = {
    # request.body over DATA_UPLOAD_MAX_MEMORY_SIZE: RequestDataTooBig
    "too-big": {"data": {"pad": "x" * BIG}, "content_type": "application/json"},
    # request.POST over DATA_UPLOAD_MAX_NUMBER_FIELDS (lowered to 2): TooManyFieldsSent
    "too-many-fields": {"data": {"a": "1", "b": "2", "c": "3"}},
}


@pytest.mark.parametrize("guard", ["middleware", "decorator", "rest-framework"])
@pytest.mark.parametrize("body", REFUSED_BODIES.values(), ids=REFUSED_BODIES.keys())
def test_a_view_that_djangos_body_limits_refuse_has_its_400_stored(
    settle_settings: dict[str, Any], guard: str, body: dict[str, Any]
) -> None:
    """The view reads a body Django's own limits refuse: Django answers 400, and that 400
    is the view's answer, stored as any 4xx and replayed (docs/http-endpoints.md, "Body
    limits"), under the middleware and under ``@idempotent`` alike, on a REST framework
    handler too. (The decorator saw the exception, left the attempt provisional and ran the
    view again on every retry.)"""
    limits = {"DATA_UPLOAD_MAX_NUMBER_FIELDS": 2}
    with override_settings(ROOT_URLCONF=urlconf(path("r", reads_the_body)), **limits):
        bare = Client().post("/r", **body, **headers("bare"))
    RUNS.clear()
    views = {
        "decorator": idempotent(reads_the_body),
        "rest-framework": ReadsTheBodyAPIView.as_view(),
    }
    view = views.get(guard, reads_the_body)
    mw = ["settle.django.IdempotencyMiddleware"] if guard == "middleware" else []
    options = {**settle_settings, "max_request_bytes": 8 << 20}
    conf = urlconf(path("r", view))
    with override_settings(ROOT_URLCONF=conf, MIDDLEWARE=mw, SETTLE=options, **limits):
        first = Client().post("/r", **body, **headers("k-refused"))
        again = Client().post("/r", **body, **headers("k-refused"))
    assert bare.status_code == 400
    assert (first.status_code, first.content) == (bare.status_code, bare.content)
    assert again.content == first.content
    assert again["Idempotent-Replayed"] == "true"
    assert RUNS == ["reads"]


DJANGO_4XX: dict[str, Exception] = {
    "Http404": Http404("no such payment"),
    "PermissionDenied": PermissionDenied(),
    "BadRequest": BadRequest(),
    "SuspiciousOperation": SuspiciousOperation("a forged field"),
    "MultiPartParserError": MultiPartParserError("a malformed multipart body"),
}


@pytest.mark.parametrize("guard", ["middleware", "decorator"])
@pytest.mark.parametrize("raised", DJANGO_4XX.values(), ids=DJANGO_4XX.keys())
def test_an_exception_django_answers_with_a_4xx_has_that_answer_stored(
    settle_settings: dict[str, Any], guard: str, raised: Exception
) -> None:
    """A view raises an exception Django answers with a 4xx (404, 403, 400): that answer is
    the view's, stored and replayed under the middleware and under ``@idempotent`` alike.
    (The decorator saw the exception first and left the attempt provisional, so a retry ran
    the view again where the middleware replayed the 4xx.)"""

    def refuses(request: HttpRequest) -> HttpResponse:
        RUNS.append("refuses")
        raise raised

    with override_settings(ROOT_URLCONF=urlconf(path("r", refuses)), MIDDLEWARE=[]):
        bare = Client().post("/r", {"a": "1"}, **headers("bare"))
    RUNS.clear()
    view = idempotent(refuses) if guard == "decorator" else refuses
    mw = ["settle.django.IdempotencyMiddleware"] if guard == "middleware" else []
    with override_settings(ROOT_URLCONF=urlconf(path("r", view)), MIDDLEWARE=mw):
        first = Client().post("/r", {"a": "1"}, **headers("k-4xx"))
        again = Client().post("/r", {"a": "1"}, **headers("k-4xx"))
    assert 400 <= bare.status_code < 500
    assert (first.status_code, first.content) == (bare.status_code, bare.content)
    assert again.content == first.content
    assert again["Idempotent-Replayed"] == "true"
    assert RUNS == ["refuses"]


def _chunked(data: bytes) -> Iterator[bytes]:
    """``data`` as a request body of unknown length (sent chunked)."""
    for start in range(0, len(data), 64 << 10):
        yield data[start : start + (64 << 10)]


def test_a_chunked_body_over_max_request_bytes_is_never_read_whole(
    settle_settings: dict[str, Any], redis_url: str, namespace: str
) -> None:
    """Under Django's ASGI handler a chunked body (no Content-Length) of 40 MB is spooled
    to disk before the middleware runs; settle reads it from there under
    ``max_request_bytes`` (1 MiB here), a chunk at a time, and answers its 413 without
    ever holding the whole body in memory."""
    body = b"x" * (40 << 20)
    options = {**settle_settings, "max_request_bytes": 1 << 20}
    conf = urlconf(path("r", reads_the_body))
    mw = ["settle.django.IdempotencyMiddleware"]
    with override_settings(ROOT_URLCONF=conf, MIDDLEWARE=mw, SETTLE=options):
        unused = AsyncSettler.from_url(redis_url, namespace=namespace)  # serve() closes it
        with serve(ASGIHandler(), unused) as base, httpx.Client(base_url=base, timeout=60) as c:
            sent = {"Content-Type": "application/octet-stream", "Idempotency-Key": "k-chunked"}
            tracemalloc.start()
            try:
                response = c.post(
                    "/r", content=_chunked(body), headers={**sent, "X-Principal": "tenant:acme"}
                )
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
    assert response.status_code == 413
    assert response.json()["type"] == "urn:settle:problem:request-too-large"
    assert peak < 16 << 20, peak
    assert RUNS == []


def test_multipart_upload_parsed_by_the_csrf_check_before_the_decorator(
    settle_settings: dict[str, Any],
) -> None:
    """CsrfViewMiddleware reads ``request.POST`` for the form's token before a decorated
    view runs, and Django keeps no multipart body once parsed: settle used to fail every
    such request with RawPostDataException (a 500; so did REST framework's
    SessionAuthentication). The parsed form now stands for the body: the retry replays, a
    changed file is a changed request (422)."""

    @idempotent
    def upload(request: HttpRequest) -> JsonResponse:
        RUNS.append("u")
        body = request.FILES["doc"].read()
        return JsonResponse({"size": len(body), "name": request.POST["name"]}, status=201)

    csrf = ["django.middleware.csrf.CsrfViewMiddleware"]
    token = "a" * 32

    def send(client: Client, content: bytes) -> Any:
        data = {
            "csrfmiddlewaretoken": token,
            "name": "n",
            "doc": SimpleUploadedFile("a.txt", content, content_type="text/plain"),
        }
        return client.post("/up", data, **headers("up-csrf"))

    with override_settings(ROOT_URLCONF=urlconf(path("up", upload)), MIDDLEWARE=csrf):
        client = Client(enforce_csrf_checks=True)
        client.cookies["csrftoken"] = token
        first = send(client, b"hello")
        again = send(client, b"hello")
        changed = send(client, b"hellO")
    assert first.status_code == 201, first.content
    assert first.json() == {"size": 5, "name": "n"}  # the view read the whole file
    assert again.content == first.content
    assert again["Idempotent-Replayed"] == "true"
    assert changed.status_code == 422
    assert RUNS == ["u"]


@pytest.mark.parametrize("parsed", [False, True], ids=["raw-body", "form-parsed-before"])
def test_a_multipart_upload_built_again_under_a_new_boundary_replays(
    settle_settings: dict[str, Any], parsed: bool
) -> None:
    """A client library makes a new random boundary every time it builds a multipart body
    (requests, httpx, a browser; Django's test client alone keeps one), and a client
    retries by building the body again. The boundary is framing: the retry is the same
    request, and it got 422. Raw (the middleware reads the body) and parsed before settle
    (the CSRF check reads request.POST before a decorated view) alike."""

    def upload(request: HttpRequest) -> JsonResponse:
        RUNS.append("u")
        body = request.FILES["doc"].read()
        return JsonResponse({"size": len(body), "id": uuid.uuid4().hex}, status=201)

    token = "a" * 32
    if parsed:
        view: Any = idempotent(upload)
        mw = ["django.middleware.csrf.CsrfViewMiddleware"]
    else:
        view = upload
        mw = ["settle.django.IdempotencyMiddleware"]

    def send(client: Client, content: bytes, boundary: str) -> Any:
        data = {
            "csrfmiddlewaretoken": token,
            "name": "n",
            "doc": SimpleUploadedFile("a.txt", content, content_type="text/plain"),
        }
        return client.post(
            "/up",
            encode_multipart(boundary, data),
            content_type=f"multipart/form-data; boundary={boundary}",
            **headers(f"up-boundary-{parsed}"),
        )

    with override_settings(ROOT_URLCONF=urlconf(path("up", view)), MIDDLEWARE=mw):
        client = Client(enforce_csrf_checks=parsed)
        client.cookies["csrftoken"] = token
        first = send(client, b"hello", uuid.uuid4().hex)
        again = send(client, b"hello", uuid.uuid4().hex)
        changed = send(client, b"hellO", uuid.uuid4().hex)
    assert first.status_code == 201, first.content
    assert again.status_code == 201, again.content
    assert again.content == first.content
    assert again["Idempotent-Replayed"] == "true"
    assert changed.status_code == 422
    assert RUNS == ["u"]


def test_a_form_changed_past_its_close_delimiter_is_another_request(
    settle_settings: dict[str, Any],
) -> None:
    """Django's multipart parser reads parts after the close delimiter (an epilogue, to RFC
    2046, and to settle's reading of the parts): a changed amount there under the same key
    is another request (422), not the first payment's replay."""
    amounts: list[str] = []

    def pay(request: HttpRequest) -> JsonResponse:
        amounts.append(request.POST["amount"])
        return JsonResponse({"id": uuid.uuid4().hex}, status=201)

    def body(amount: bytes) -> bytes:
        return (
            b'--B\r\nContent-Disposition: form-data; name="note"\r\n\r\nx\r\n--B--\r\n'
            b'--B\r\nContent-Disposition: form-data; name="amount"\r\n\r\n%b\r\n--B--\r\n' % amount
        )

    mw = ["settle.django.IdempotencyMiddleware"]
    with override_settings(ROOT_URLCONF=urlconf(path("pay", pay)), MIDDLEWARE=mw):
        client = Client()
        sent = [
            client.post(
                "/pay",
                body(amount),
                content_type="multipart/form-data; boundary=B",
                **headers("pay-epilogue"),
            )
            for amount in (b"100", b"999")
        ]
    assert sent[0].status_code == 201, sent[0].content
    assert amounts == ["100"], "Django read the part past the close delimiter"
    assert sent[1].status_code == 422, (sent[1].status_code, sent[1].content)


class StreamReader:
    """A middleware that reads the body as a stream (a webhook signature check)."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> Any:
        request.signed = request.read()  # type: ignore[attr-defined]
        request.POST  # noqa: B018 - touched after: Django leaves an empty form, not a parsed one
        return self.get_response(request)


def test_a_body_read_as_a_stream_before_settle_is_refused_never_guessed(
    settle_settings: dict[str, Any],
) -> None:
    """Read with ``request.read()`` before settle, a JSON body leaves Django no copy:
    settle refuses with a ConfigurationError saying what to move, rather than give two
    different bodies one fingerprint (and replay the first one's response to the second)."""

    @idempotent
    def charge(request: HttpRequest) -> JsonResponse:
        RUNS.append("c")
        return JsonResponse({"ok": True}, status=201)

    middleware = ["tests.wsgi.test_django_views.StreamReader"]
    with override_settings(ROOT_URLCONF=urlconf(path("charge", charge)), MIDDLEWARE=middleware):
        client = Client(raise_request_exception=True)
        for amount in (1, 999):
            with pytest.raises(ConfigurationError, match="read before settle"):
                client.post(
                    "/charge",
                    {"amount": amount},
                    content_type="application/json",
                    **headers("k-stream"),
                )
            with pytest.raises(ConfigurationError, match="read before settle"):
                client.post("/charge", {"amount": str(amount)}, **headers("k-stream-form"))
    assert RUNS == []


# -- paths Django decoded itself; method_decorator with a list ---------------------------------

MW = ["settle.django.IdempotencyMiddleware"]


def test_non_latin1_path_under_the_middleware(settle_settings: dict[str, Any]) -> None:
    """A GET (not even guarded) to /статья under the middleware."""

    def page(request: HttpRequest, slug: str) -> JsonResponse:
        return JsonResponse({"slug": slug})

    with override_settings(ROOT_URLCONF=urlconf(path("<str:slug>", page)), MIDDLEWARE=MW):
        r = Client(raise_request_exception=False).get("/статья")
    assert r.status_code == 200, r.status_code


def test_two_accented_paths_are_two_requests(settle_settings: dict[str, Any]) -> None:
    """/café and /cafè are two resources; the same key on the second must not replay the
    first's response (422 or a run of its own)."""

    def create(request: HttpRequest, name: str) -> JsonResponse:
        RUNS.append(name)
        return JsonResponse({"name": name}, status=201)

    with override_settings(ROOT_URLCONF=urlconf(path("<str:name>", create)), MIDDLEWARE=MW):
        c = Client()
        first = c.post("/café", {}, **headers("k-cafe"))
        other = c.post("/cafè", {}, **headers("k-cafe"))
    assert first.json() == {"name": "café"}
    assert other.status_code == 422, (other.status_code, other.get("Idempotent-Replayed"))
    assert RUNS == ["café"]


def test_an_accented_path_pattern_guards(settle_settings: dict[str, Any]) -> None:
    """paths=["/café"] under the middleware: the second POST with the key is a replay."""

    def create(request: HttpRequest) -> JsonResponse:
        RUNS.append("c")
        return JsonResponse({"id": uuid.uuid4().hex}, status=201)

    with override_settings(
        ROOT_URLCONF=urlconf(path("café", create)),
        MIDDLEWARE=MW,
        SETTLE={**settle_settings, "paths": ["/café"]},
    ):
        c = Client()
        c.post("/café", {}, **headers("k-p"))
        c.post("/café", {}, **headers("k-p"))
    assert RUNS == ["c"], RUNS


class ListView(View):
    @method_decorator([idempotent, never_cache])
    def post(self, request: Any) -> JsonResponse:
        RUNS.append("p")
        return JsonResponse({"id": uuid.uuid4().hex}, status=201)


def test_a_method_decorator_list_builds_one_guard(settle_settings: dict[str, Any]) -> None:
    with override_settings(ROOT_URLCONF=urlconf(path("l", ListView.as_view()))):
        c = Client()
        before = len(_VIEW_GUARDS)
        for i in range(20):
            assert c.post("/l", {}, **headers(f"k-l{i}")).status_code == 201
        grown = len(_VIEW_GUARDS) - before
    assert grown <= 1, f"{grown} guards built for one view"


class ListAPIView(APIView):
    @method_decorator([idempotent, never_cache])
    def post(self, request: Any) -> Response:
        RUNS.append("a")
        return Response({"id": uuid.uuid4().hex}, status=201)


def test_a_method_decorator_list_on_a_rest_framework_handler(
    settle_settings: dict[str, Any],
) -> None:
    with override_settings(ROOT_URLCONF=urlconf(path("a", ListAPIView.as_view()))):
        c = Client(raise_request_exception=False)
        first = c.post("/a", {}, **headers("k-a"))
        again = c.post("/a", {}, **headers("k-a"))
    assert (first.status_code, again.status_code, RUNS) == (201, 201, ["a"]), (
        first.content[:200],
        again.content[:200],
        RUNS,
    )


class StripVersion:
    """A common middleware: /v1/... and /v2/... are served by one URLconf."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> Any:
        for prefix in ("/v1", "/v2"):
            if request.path_info.startswith(prefix + "/"):
                request.path_info = request.path_info[len(prefix) :]
                request.api_version = prefix  # type: ignore[attr-defined]
        return self.get_response(request)


def test_two_request_paths_rewritten_to_one_are_two_requests(
    settle_settings: dict[str, Any],
) -> None:
    """POST /v1/charges then POST /v2/charges with the same key and body: two request
    targets, so the second is 422 (as before the commit), never v1's stored response."""

    def charges(request: HttpRequest) -> JsonResponse:
        RUNS.append(request.api_version)  # type: ignore[attr-defined]
        return JsonResponse({"version": request.api_version}, status=201)  # type: ignore[attr-defined]

    mw = [f"{__name__}.StripVersion", "settle.django.IdempotencyMiddleware"]
    with override_settings(ROOT_URLCONF=urlconf(path("charges", charges)), MIDDLEWARE=mw):
        c = Client()
        first = c.post("/v1/charges", {}, **headers("k-v"))
        other = c.post("/v2/charges", {}, **headers("k-v"))
    assert first.json() == {"version": "/v1"}
    assert other.status_code == 422, (other.status_code, other.content, RUNS)


# -- the view's resources are released once, the request finished once ----------------------
#
# PEP 3333: whoever consumes an app's iterable calls its close(), however it ends. Django's
# responses release what they hold (a streaming iterator's close(), a FileResponse's file)
# in HttpResponseBase.close(), which the server calls on what it sent, and which sends
# request_finished: that ends the request (close_old_connections closes the database
# connection). A response settle collects and then does not send must have its resources
# released by settle, without ending the request. Served here by the stdlib's WSGI server,
# as in production.

CLOSED: list[str] = []


class Chunks:
    """A streaming body with a ``close()`` (a file, a cursor) that records each call;
    ``broken``: its source fails after the first chunk."""

    def __init__(self, *parts: bytes, broken: bool = False) -> None:
        self.parts = parts
        self.broken = broken

    def __iter__(self) -> Iterator[bytes]:
        for part in self.parts:
            yield part
            if self.broken:
                raise RuntimeError("the stream's source failed")

    def close(self) -> None:
        CLOSED.append("body")


class Held(io.BytesIO):
    """A file a response holds; records each ``close()``."""

    def close(self) -> None:
        CLOSED.append("file")
        super().close()


def holding(response: HttpResponseBase) -> HttpResponseBase:
    """``response`` holding a file that its ``close()`` closes, as Django registers a
    FileResponse's file or a streaming body's ``close``."""
    response._resource_closers.append(Held().close)  # type: ignore[attr-defined]
    return response


class Unstorable(HttpResponseBase):
    """Neither an HttpResponse nor a StreamingHttpResponse: settle refuses to store it."""


class UnrenderableTemplate(SimpleTemplateResponse):
    @property
    def rendered_content(self) -> str:
        raise RuntimeError("the template failed to render")


class Served:
    """The project under the stdlib's WSGI server at ``base``."""

    def __init__(self, base: str, client: httpx.Client, sending: Sending) -> None:
        self.base = base
        self.sending = sending
        self._client = client
        self._lock = threading.Lock()
        self._finished = 0
        #: How many times request_finished was sent (by anyone) for each request, in order.
        self.finishes: list[int] = []

    def finished(self, **_: Any) -> None:
        """request_finished: Django's handler sends it when the server closes its response."""
        with self._lock:
            self._finished += 1

    def finished_so_far(self) -> int:
        """request_finished signals of the request under way, until now."""
        with self._lock:
            return self._finished

    def ended(self) -> None:
        """Wait until the server has closed what it sent for the request, and count the
        request_finished signals that request sent."""
        assert self.sending.closed.wait(10), "the server never closed its response"
        self.sending.closed.clear()
        with self._lock:
            self.finishes.append(self._finished)
            self._finished = 0

    def post(self, key: str) -> httpx.Response:
        """POST to ``/v``; returns once the server has closed what it sent."""
        return self.post_body(key, b"{}")

    def post_body(self, key: str, body: bytes) -> httpx.Response:
        return self.send(body, headers_of(key))

    def send(self, body: bytes, headers: dict[str, str]) -> httpx.Response:
        answer = self._client.post("/v", content=body, headers=headers)
        self.ended()
        return answer


@contextlib.contextmanager
def served(view: Any, middleware: list[str] | None = None) -> Iterator[Served]:
    """``view`` at ``/v`` under the stdlib's WSGI server."""
    CLOSED.clear()
    settings = {"ROOT_URLCONF": urlconf(path("v", view)), "ALLOWED_HOSTS": ["127.0.0.1"]}
    with override_settings(**settings, MIDDLEWARE=middleware or []):
        sending = Sending(WSGIHandler())
        with serve_wsgi(sending) as base, httpx.Client(base_url=base, timeout=30) as client:
            site = Served(base, client, sending)
            request_finished.connect(site.finished)  # from any sender
            try:
                yield site
            finally:
                request_finished.disconnect(site.finished)


def headers_of(key: str) -> dict[str, str]:
    return {"Idempotency-Key": key, "X-Principal": "tenant:acme", "Content-Type": "text/plain"}


def guarded_by(how: str, view: Any) -> tuple[Any, list[str]]:
    """``view`` decorated, or plain under the middleware."""
    if how == "decorator":
        return idempotent(view), []
    return view, ["settle.django.IdempotencyMiddleware"]


def _breaking_stream() -> HttpResponseBase:
    return StreamingHttpResponse(Chunks(b"charged ", b"twice", broken=True), status=201)


@pytest.mark.parametrize(
    ("how", "make", "closes"),
    [
        ("decorator", _breaking_stream, ["body"]),
        ("middleware", _breaking_stream, ["body"]),
        ("decorator", lambda: holding(Unstorable(status=201)), ["file"]),
        ("middleware", lambda: holding(Unstorable(status=201)), ["file"]),
        # Under the middleware Django renders it itself, before settle sees it.
        ("decorator", lambda: holding(UnrenderableTemplate("r.html", status=201)), ["file"]),
    ],
    ids=[
        "stream-breaks-while-collected-decorator",
        "stream-breaks-while-collected-middleware",
        "cannot-be-stored-decorator",
        "cannot-be-stored-middleware",
        "render-raises-decorator",
    ],
)
def test_a_view_response_settle_fails_on_is_closed_once(
    settle_settings: dict[str, Any],
    how: str,
    make: Callable[[], HttpResponseBase],
    closes: list[str],
) -> None:
    """Found in review: the view's response was dropped unclosed when collecting it raised
    (its file or iterator left open until garbage collection). The client gets Django's
    500, the attempt is provisional (the retry runs the view again) and the view's
    resources (its streaming body, its file) are released once. Found in a second review:
    settle released them with ``close()``, which sent request_finished in the middle of
    the request; it is sent once per request, when the server closes the 500."""

    def view(request: HttpRequest) -> HttpResponseBase:
        RUNS.append("v")
        return make()

    with served(*guarded_by(how, view)) as site:
        failed = site.post("k-fails")
        closed = list(CLOSED)
        again = site.post("k-fails")
    assert failed.status_code == 500
    assert sorted(closed) == closes
    assert again.status_code == 500
    assert RUNS == ["v", "v"]
    assert site.finishes == [1, 1]


def _stale_stream() -> HttpResponseBase:
    return StreamingHttpResponse(Chunks(b"stale ", b"charge"), status=201)


def _stale_file() -> HttpResponseBase:
    return FileResponse(Held(b"stale charge"), status=201)


@pytest.mark.parametrize("how", ["decorator", "middleware"])
@pytest.mark.parametrize(
    ("make", "closes"), [(_stale_stream, ["body"]), (_stale_file, ["file"])], ids=["stream", "file"]
)
def test_a_superseded_view_response_is_released_once_with_settles_answer(
    settle_settings: dict[str, Any],
    how: str,
    make: Callable[[], HttpResponseBase],
    closes: list[str],
) -> None:
    """Found in review: when the attempt lost its reservation while the view ran, settle
    answered 409 (or the authoritative replay) in its place and dropped the view's response
    unclosed. Its resources (a streaming body, a FileResponse's file) are now released
    once, when the server closes settle's answer (not sooner: closing sends
    request_finished, which closes the database connection). Found in a second review:
    settle's answer closed the view's response and then itself, sending request_finished
    twice; the request now finishes once."""
    settler: Settler = settle_settings["settler"]

    def view(request: HttpRequest) -> HttpResponseBase:
        RUNS.append("v")
        _take_over(settler, request.settle.operation_id)  # type: ignore[attr-defined]
        return make()

    with served(*guarded_by(how, view)) as site:
        answer = site.post("k-lost")
    assert answer.status_code == 409
    assert answer.json()["type"] == "urn:settle:problem:attempt-superseded"
    assert sorted(CLOSED) == closes
    assert site.finishes == [1]


async def _receipt_parts(receipt: str) -> Any:
    for part in (b"receipt ", receipt.encode()):
        yield part


@pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume asynchronous")
@pytest.mark.parametrize("how", ["decorator", "middleware"])
def test_a_streaming_response_of_an_async_iterator_is_stored_and_replayed(
    settle_settings: dict[str, Any], how: str
) -> None:
    """A sync view may stream an async iterator: Django serves it under WSGI (consumed
    through async_to_sync, with its warning). settle collected it as a sync iterator and
    failed on it (TypeError) after the view had run, so the client got a 500, the attempt
    was left provisional and every retry ran the view again: a charge per retry. It is now
    collected as Django collects it, stored and replayed."""

    def view(request: HttpRequest) -> StreamingHttpResponse:
        RUNS.append("v")
        return StreamingHttpResponse(_receipt_parts(uuid.uuid4().hex), status=201)

    with served(*guarded_by(how, view)) as site:
        first = site.post("k-async")
        again = site.post("k-async")
    assert first.status_code == again.status_code == 201, first.text
    assert first.content.startswith(b"receipt ")
    assert again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"
    assert RUNS == ["v"]


@pytest.mark.parametrize("how", ["decorator", "middleware"])
def test_a_view_that_stops_on_its_lost_lease_answers_superseded(
    settle_settings: dict[str, Any], how: str
) -> None:
    """The view stops as the docs ask when a newer attempt took its key over:
    ``attempt.check()`` raises ``StaleAttempt`` (Django's 500 under the middleware). Its
    client got that 500 where ASGI, which stops such a handler itself, answers 409
    ``attempt-superseded``; it now gets the 409 too, and the stale attempt settles nothing
    (the newer attempt's record is left as it was)."""
    settler: Settler = settle_settings["settler"]
    seen: dict[str, Any] = {}

    def view(request: HttpRequest) -> HttpResponseBase:
        RUNS.append("v")
        attempt = request.settle  # type: ignore[attr-defined]
        seen["operation"], seen["newer"] = attempt.operation_id, lose(settler, attempt)
        attempt.check()
        return JsonResponse({"charged": True}, status=201)

    with (
        override_settings(SETTLE={**settle_settings, "lease": 0.6}),
        served(*guarded_by(how, view)) as site,
    ):
        answer = site.post("k-stop")
    superseded_and_untouched(settler, answer, seen["operation"], seen["newer"])
    assert site.finishes == [1]


@pytest.mark.parametrize("how", ["decorator", "middleware"])
@pytest.mark.parametrize("size", [16, 64 << 10], ids=["stored", "too-large-to-store"])
def test_a_streaming_view_response_that_goes_out_is_closed_once(
    settle_settings: dict[str, Any], how: str, size: int
) -> None:
    """The view's own response goes out (stored, or over max_response_bytes and completed
    as not stored): the server closes it, once (its streaming body released once, the
    request finished once); settle releases nothing itself. The retry replays (or is 410)
    without running the view."""

    def view(request: HttpRequest) -> StreamingHttpResponse:
        RUNS.append("v")
        return StreamingHttpResponse(Chunks(b"a" * size, uuid.uuid4().bytes), status=201)

    limit = {"max_response_bytes": 32 << 10}
    with (
        override_settings(SETTLE={**settle_settings, **limit}),
        served(*guarded_by(how, view)) as site,
    ):
        first = site.post("k-out")
        closed = list(CLOSED)
        again = site.post("k-out")
    assert first.status_code == 201
    assert len(first.content) == size + 16
    assert sorted(closed) == ["body"]
    assert again.status_code == (201 if size < limit["max_response_bytes"] else 410)
    assert RUNS == ["v"]
    assert site.finishes == [1, 1]


@pytest.mark.parametrize("how", ["decorator", "middleware"])
def test_a_client_gone_while_its_response_is_sent_is_no_error(
    settle_settings: dict[str, Any], how: str
) -> None:
    """The client resets the connection before its response is written: the server's write
    fails and it closes the view's response unexhausted (once). The response was settled
    before sending: settle logs nothing at error level, nothing after its
    ``settle.http.completed``, and leaves the record completed; the retry replays it."""
    entered, gone = threading.Event(), threading.Event()
    size = 200 << 10  # more than a socket buffer: the server's write must fail

    def view(request: HttpRequest) -> StreamingHttpResponse:
        RUNS.append("v")
        entered.set()
        assert gone.wait(10)
        return StreamingHttpResponse(Chunks(b"x" * size), status=201)

    with capture_logs() as events, served(*guarded_by(how, view)) as site:
        sock = connect(site.base)
        sock.sendall(
            b"POST /v HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: k-gone\r\n"
            b"X-Principal: tenant:acme\r\nContent-Type: text/plain\r\n"
            b"Content-Length: 2\r\n\r\n{}"
        )
        assert entered.wait(10)
        reset(sock)
        gone.set()
        site.ended()
        assert not site.sending.exhausted  # its write failed: the client never got it
        closed, logged = list(CLOSED), list(events)
        record = settle_settings["settler"].get(
            operation_id("http", "k-gone", "tenant:acme", "principal")
        )
        again = site.post("k-gone")
    assert sorted(closed) == ["body"]
    assert [e["event"] for e in logged if e["log_level"] not in ("debug", "info")] == []
    assert [e["event"] for e in logged][-1] == "settle.http.completed"
    assert record is not None
    assert record.state is State.COMPLETED
    assert again.status_code == 201
    assert again.headers["idempotent-replayed"] == "true"
    assert len(again.content) == size
    assert RUNS == ["v"]


@pytest.mark.parametrize("how", ["decorator", "middleware"])
def test_a_body_that_ends_before_its_length_runs_nothing(
    settle_settings: dict[str, Any], how: str
) -> None:
    """The client sends 10 of its 100 body bytes and closes its sending side; the server
    ends wsgi.input there and Django reads the 10 bytes as the whole body. Found in review:
    settle fingerprinted and ran the view on them and stored its answer, so the whole
    request sent again with the key got 422. Now: a 400 ``request-incomplete`` problem,
    nothing run, and the whole request runs."""

    def view(request: HttpRequest) -> HttpResponse:
        RUNS.append(request.body.decode())
        return HttpResponse(f"charged {len(request.body)}", status=201)

    with served(*guarded_by(how, view)) as site:
        with connect(site.base) as sock:
            sock.sendall(
                b"POST /v HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: k-part\r\n"
                b"X-Principal: tenant:acme\r\nContent-Type: text/plain\r\n"
                b"Content-Length: 100\r\n\r\n" + b"x" * 10
            )
            sock.shutdown(socket.SHUT_WR)
            status, problem = read_answer(sock)
        site.ended()
        whole = site.post_body("k-part", b"x" * 100)
    assert status.endswith(b" 400 Bad Request"), (status, problem)
    assert json.loads(problem)["type"] == "urn:settle:problem:request-incomplete"
    assert (whole.status_code, whole.content) == (201, b"charged 100")
    assert RUNS == ["x" * 100]
    assert site.finishes == [1, 1]


SEEN: list[int] = []


class Watching:
    """A middleware outside settle's (as an error handler, a transaction or a per-request
    URLconf is): records how many times request_finished was sent while the request was
    still inside it. The request is not over there: that signal closes the database
    connection (close_old_connections) and drops the request's URLconf (reset_urlconf)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        sent: list[object] = []

        def finished(**_: Any) -> None:
            sent.append(None)

        request_finished.connect(finished, weak=False, dispatch_uid=f"watch-{id(sent)}")
        try:
            return self.get_response(request)
        finally:
            request_finished.disconnect(dispatch_uid=f"watch-{id(sent)}")
            SEEN.append(len(sent))


@pytest.mark.parametrize("how", ["decorator", "middleware"])
def test_a_failed_view_response_leaves_the_request_open_to_its_middlewares(
    settle_settings: dict[str, Any], how: str
) -> None:
    """Found in review: when a decorated view's streaming body raised, settle closed the
    view's response at once, and close() sends request_finished: the database connection
    was closed under the middlewares still running (a TestCase failed with 'Cannot operate
    on a closed database', an error handler under ATOMIC_REQUESTS could not query). settle
    now releases the body without that signal: nothing finishes the request inside it, the
    body is released once and the request finishes once, when its 500 is closed."""
    SEEN.clear()

    def view(request: HttpRequest) -> HttpResponseBase:
        RUNS.append("v")
        return _breaking_stream()

    view, inner = guarded_by(how, view)
    with served(view, ["tests.wsgi.test_django_views.Watching", *inner]) as site:
        failed = site.post("k-open")
    assert failed.status_code == 500
    assert SEEN == [0]
    assert CLOSED == ["body"]
    assert site.finishes == [1]
    assert RUNS == ["v"]


class ReadsTheForm:
    """A middleware that reads ``request.POST`` before the view, as CsrfViewMiddleware does
    on every POST."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        request.POST.get("amount")
        return self.get_response(request)


FORM = (
    b'--B\r\nContent-Disposition: form-data; name="csrfmiddlewaretoken"\r\n\r\n'
    + b"a" * 32
    + b'\r\n--B\r\nContent-Disposition: form-data; name="amount"\r\n\r\n100\r\n'
    b'--B\r\nContent-Disposition: form-data; name="note"\r\n\r\n' + b"n" * 200 + b"\r\n--B--\r\n"
)


def _cut_then_whole(
    site: Served, headers: dict[str, str], body: bytes, sent: int
) -> tuple[bytes, bytes, httpx.Response]:
    """``body`` declared whole, its first ``sent`` bytes sent and the sending side closed
    (the client stopped): the status line and body of that answer; then the whole request
    again, with the same headers."""
    with connect(site.base) as sock:
        head = "".join(f"{n}: {v}\r\n" for n, v in headers.items())
        sock.sendall(
            f"POST /v HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[:sent]
        )
        sock.shutdown(socket.SHUT_WR)
        status, problem = read_answer(sock)
    site.ended()
    return status, problem, site.send(body, headers)


@pytest.mark.parametrize(
    ("how", "before"),
    [
        ("decorator", ["django.middleware.csrf.CsrfViewMiddleware"]),
        ("middleware", ["tests.wsgi.test_django_views.ReadsTheForm"]),
    ],
    ids=["csrf-check-then-decorator", "form-read-then-middleware"],
)
def test_a_parsed_multipart_body_that_ends_before_its_length_runs_nothing(
    settle_settings: dict[str, Any], how: str, before: list[str]
) -> None:
    """Found in review: a multipart body parsed before settle (the CSRF check reads
    request.POST before a decorated view) was fingerprinted from its parsed form, never
    checked for its end: a client that sent 180 of its bytes and stopped got the view run
    on the truncated form (Django's parser does not complain), and the whole request sent
    again with the key got 422. Now: 400 ``request-incomplete``, nothing run, and the whole
    request runs once."""

    def pay(request: HttpRequest) -> HttpResponse:
        RUNS.append(request.POST["note"])
        return HttpResponse(f"charged {request.POST['amount']}", status=201)

    view, inner = guarded_by(how, pay)
    form = {
        "Idempotency-Key": "k-form",
        "X-Principal": "tenant:acme",
        "Content-Type": "multipart/form-data; boundary=B",
        "Cookie": "csrftoken=" + "a" * 32,
    }
    with served(view, [*before, *inner]) as site:
        status, problem, whole = _cut_then_whole(site, form, FORM, 180)
    assert status.endswith(b" 400 Bad Request"), (status, problem)
    assert json.loads(problem)["type"] == "urn:settle:problem:request-incomplete"
    assert (whole.status_code, whole.content) == (201, b"charged 100")
    assert RUNS == ["n" * 200]


#: A urlencoded form whose amount a cut would change: 1000 cut after "amount=10".
URLENCODED = b"csrfmiddlewaretoken=" + b"a" * 32 + b"&note=" + b"n" * 40 + b"&amount=1000"


@pytest.mark.parametrize(
    ("how", "before"),
    [
        ("decorator", ["django.middleware.csrf.CsrfViewMiddleware"]),
        ("middleware", ["tests.wsgi.test_django_views.ReadsTheForm"]),
    ],
    ids=["csrf-check-then-decorator", "form-read-then-middleware"],
)
def test_a_read_urlencoded_body_that_ends_before_its_length_runs_nothing(
    settle_settings: dict[str, Any], how: str, before: list[str]
) -> None:
    """Found in review: a urlencoded form read before settle (the CSRF check reads
    request.POST, which reads request.body) leaves no stream of the wire to ask; a client
    that stopped after "amount=10" of "amount=1000" would have been charged 10. Its length
    is compared with Content-Length: 400 ``request-incomplete``, nothing run, and the whole
    request runs once."""

    def pay(request: HttpRequest) -> HttpResponse:
        RUNS.append(request.POST["amount"])
        return HttpResponse(f"charged {request.POST['amount']}", status=201)

    view, inner = guarded_by(how, pay)
    form = {
        "Idempotency-Key": "k-urlencoded",
        "X-Principal": "tenant:acme",
        "Content-Type": "application/x-www-form-urlencoded",
        "Cookie": "csrftoken=" + "a" * 32,
    }
    with served(view, [*before, *inner]) as site:
        status, problem, whole = _cut_then_whole(site, form, URLENCODED, -2)
    assert status.endswith(b" 400 Bad Request"), (status, problem)
    assert json.loads(problem)["type"] == "urn:settle:problem:request-incomplete"
    assert (whole.status_code, whole.content) == (201, b"charged 1000")
    assert RUNS == ["1000"]


class Gunzips:
    """The gzip recipe: a middleware that replaces the body with its decompressed bytes,
    leaving CONTENT_LENGTH at the compressed length."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if request.headers.get("Content-Encoding") == "gzip":
            request._body = gzip.decompress(request.body)
        return self.get_response(request)


@pytest.mark.parametrize("how", ["decorator", "middleware"])
def test_a_body_a_middleware_replaced_before_settle_runs(
    settle_settings: dict[str, Any], how: str
) -> None:
    """Found in review: a body a middleware replaced before settle (decompressed, here
    shorter than the compressed bytes its CONTENT_LENGTH counts) was refused as cut short,
    400 ``request-incomplete``. Django's stream of the body was read to its end: the view
    runs, and the retry replays."""

    def pay(request: HttpRequest) -> HttpResponse:
        RUNS.append(request.body.decode())
        return HttpResponse(b"charged " + request.body, status=201)

    plain = b'{"amount":100}'
    body = gzip.compress(plain)
    assert len(body) > len(plain)
    view, inner = guarded_by(how, pay)
    with served(view, ["tests.wsgi.test_django_views.Gunzips", *inner]) as site:
        sent = {**headers_of("k-gz"), "Content-Encoding": "gzip"}
        first = site.send(body, sent)
        again = site.send(body, sent)
    assert (first.status_code, first.content) == (201, b"charged " + plain), first.content
    assert again.headers["idempotent-replayed"] == "true"
    assert RUNS == ['{"amount":100}']


class RefusesAPIView(APIView):
    """A REST framework handler that raises what Django answers with a 4xx, as
    ``self.get_object()`` (``get_object_or_404``) and ``self.check_permissions`` do."""

    raised: Exception = Http404()

    def post(self, request: Any) -> Response:
        RUNS.append("refuses")
        raise self.raised


class GuardedRefusesAPIView(RefusesAPIView):
    @method_decorator(idempotent)
    def post(self, request: Any) -> Response:
        return super().post(request)


@pytest.mark.parametrize(
    "raised", [Http404("no such payment"), PermissionDenied()], ids=["Http404", "PermissionDenied"]
)
def test_a_rest_framework_handler_keeps_its_own_4xx_under_the_decorator(
    settle_settings: dict[str, Any], raised: Exception
) -> None:
    """REST framework answers Http404 and PermissionDenied from a handler with its own
    response (JSON ``{"detail": ...}`` through the view's renderer), not Django's HTML page.
    Decorating the handler with ``@idempotent`` must not change the answer the client gets:
    it is that JSON response, stored and replayed."""
    RefusesAPIView.raised = raised
    with override_settings(ROOT_URLCONF=urlconf(path("r", RefusesAPIView.as_view()))):
        bare = Client().post("/r", {}, **headers("bare"))
    RUNS.clear()
    with override_settings(ROOT_URLCONF=urlconf(path("r", GuardedRefusesAPIView.as_view()))):
        first = Client().post("/r", {}, **headers("k-drf-4xx"))
        again = Client().post("/r", {}, **headers("k-drf-4xx"))
    assert bare["Content-Type"] == "application/json"
    assert (first.status_code, first.content) == (bare.status_code, bare.content)
    assert first["Content-Type"] == "application/json"
    assert again.content == first.content
    assert again["Idempotent-Replayed"] == "true"
    assert RUNS == ["refuses"]


def test_django_under_the_asgi_guard_runs_its_view_once_and_finds_its_attempt(
    settle_settings: dict[str, Any], redis_url: str, namespace: str
) -> None:
    """A Django project moved to ASGI: ``settle.asgi.IdempotencyMiddleware`` around
    Django's ``ASGIHandler`` (as the docs advise for async views), with
    ``settle.django.IdempotencyMiddleware`` still in ``MIDDLEWARE``. The Django guard
    reserved the key the ASGI guard held, found it in progress and answered 409 to every
    request. It now passes the request through, and the view finds the ASGI guard's
    attempt in ``request.settle``."""
    generations: list[int] = []

    def pay(request: HttpRequest) -> HttpResponse:
        generations.append(request.settle.generation)  # type: ignore[attr-defined]
        return HttpResponse(f"charged {uuid.uuid4().hex}".encode(), status=201)

    def tenant(scope: Any) -> str:
        return "tenant:acme"

    conf = urlconf(path("pay", pay))
    mw = ["settle.django.IdempotencyMiddleware"]
    with override_settings(ROOT_URLCONF=conf, MIDDLEWARE=mw):
        outer = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
        app = ASGIGuard(ASGIHandler(), settler=outer, principal=tenant)
        with serve(app, outer) as base, httpx.Client(base_url=base, timeout=30) as c:
            sent = {"Idempotency-Key": "k-asgi", "X-Principal": "tenant:acme"}
            first = c.post("/pay", content=b"{}", headers=sent)
            again = c.post("/pay", content=b"{}", headers=sent)
    assert first.status_code == 201, first.text
    assert "idempotent-replayed" not in first.headers
    assert (again.status_code, again.content) == (201, first.content)
    assert again.headers["idempotent-replayed"] == "true"
    assert len(generations) == 1


def test_django_under_the_asgi_guard_still_guards_its_own_key(
    settle_settings: dict[str, Any], redis_url: str, namespace: str
) -> None:
    """The pass-through is for the ASGI guard's own operation only. A Django guard that keys
    charges by its own header (``X-Charge-Key``) under an ASGI guard that keys every POST by
    ``Idempotency-Key`` when one is sent: a charge retried as a new call (a new
    ``Idempotency-Key``, the same charge key) ran the view again, because the Django guard
    passed through whatever the ASGI guard held. It guards its own key now."""
    runs: list[str] = []

    def pay(request: HttpRequest) -> HttpResponse:
        runs.append("pay")
        return HttpResponse(f"charged {uuid.uuid4().hex}".encode(), status=201)

    def tenant(scope: Any) -> str:
        return "tenant:acme"

    conf = urlconf(path("pay", pay))
    mw = ["settle.django.IdempotencyMiddleware"]
    own = {**settle_settings, "header": "X-Charge-Key"}
    with override_settings(ROOT_URLCONF=conf, MIDDLEWARE=mw, SETTLE=own):
        outer = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
        app = ASGIGuard(ASGIHandler(), settler=outer, principal=tenant, require_key=False)
        with serve(app, outer) as base, httpx.Client(base_url=base, timeout=30) as c:
            sent = [
                c.post(
                    "/pay",
                    content=b"{}",
                    headers={
                        "X-Charge-Key": "c-1",
                        "Idempotency-Key": sdk_key,
                        "X-Principal": "tenant:acme",
                    },
                )
                for sdk_key in ("sdk-1", "sdk-2")
            ]
    first, again = sent
    assert first.status_code == 201, first.text
    assert (again.status_code, again.content) == (201, first.content)
    assert again.headers["idempotent-replayed"] == "true"
    assert runs == ["pay"]


# -- the 401's challenge (RFC 9110 15.5.2: WWW-Authenticate) --------------------------------


@pytest.mark.parametrize("guard", ["middleware", "decorator"])
def test_the_401_carries_the_configured_challenge(
    settle_settings: dict[str, Any], guard: str
) -> None:
    """The 401 ``principal-required`` went out without ``WWW-Authenticate``, which a 401
    must carry. ``www_authenticate`` names the challenge; it is on that 401 only, never on
    the view's response or its replay."""
    challenge = 'Bearer realm="shop"'

    def create(request: HttpRequest) -> JsonResponse:
        RUNS.append("create")
        return JsonResponse({"id": uuid.uuid4().hex}, status=201)

    own = {**settle_settings, "www_authenticate": challenge}
    if guard == "middleware":
        conf, mw = urlconf(path("c", create)), ["settle.django.IdempotencyMiddleware"]
    else:
        conf, mw = urlconf(path("c", idempotent(www_authenticate=challenge)(create))), []
        own = settle_settings
    with override_settings(ROOT_URLCONF=conf, MIDDLEWARE=mw, SETTLE=own):
        c = Client()
        anonymous = c.post("/c", {}, HTTP_IDEMPOTENCY_KEY="k-1")
        first = c.post("/c", {}, **headers("k-1"))
        again = c.post("/c", {}, **headers("k-1"))
    assert anonymous.status_code == 401
    assert anonymous["WWW-Authenticate"] == challenge
    assert anonymous.json()["type"] == "urn:settle:problem:principal-required"
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.content == first.content
    assert not first.has_header("WWW-Authenticate")
    assert not again.has_header("WWW-Authenticate")
    assert RUNS == ["create"]


def test_a_challenge_with_a_line_break_is_refused(settle_settings: dict[str, Any]) -> None:
    bad = {**settle_settings, "www_authenticate": 'Bearer realm="shop"\r\nSet-Cookie: a=b'}
    with (
        override_settings(SETTLE=bad),
        pytest.raises(ConfigurationError, match="www_authenticate must"),
    ):
        DjangoGuard(lambda request: HttpResponse())


def test_django_under_the_wsgi_guard_runs_its_view_once_and_finds_its_attempt(
    settle_settings: dict[str, Any], settler: Settler
) -> None:
    """As under the ASGI guard, so under ``settle.wsgi.IdempotencyMiddleware`` around
    Django's ``WSGIHandler`` with ``settle.django.IdempotencyMiddleware`` in ``MIDDLEWARE``
    as well: the Django guard saw nothing of the WSGI guard's attempt (it is in the environ,
    Django's ``request.META``), reserved its operation again, found it in progress and
    answered 409 to every request. It passes the request through now, and the view finds
    the WSGI guard's attempt in ``request.settle``."""
    generations: list[int] = []

    def pay(request: HttpRequest) -> HttpResponse:
        generations.append(request.settle.generation)  # type: ignore[attr-defined]
        return HttpResponse(f"charged {uuid.uuid4().hex}".encode(), status=201)

    conf = urlconf(path("pay", pay))
    mw = ["settle.django.IdempotencyMiddleware"]
    with override_settings(ROOT_URLCONF=conf, MIDDLEWARE=mw):
        app = WSGIGuard(WSGIHandler(), settler=settler, principal=_environ_principal)
        with serve_wsgi(app) as base, httpx.Client(base_url=base, timeout=30) as c:
            sent = {"Idempotency-Key": "k-wsgi", "X-Principal": "tenant:acme"}
            first = c.post("/pay", content=b"{}", headers=sent)
            again = c.post("/pay", content=b"{}", headers=sent)
    assert first.status_code == 201, first.text
    assert (again.status_code, again.content) == (201, first.content)
    assert again.headers["idempotent-replayed"] == "true"
    assert len(generations) == 1


def _environ_principal(environ: Any) -> str | None:
    return environ.get("HTTP_X_PRINCIPAL")


def test_a_decorated_view_under_two_guards_passes_through_the_outer_ones_operation(
    settle_settings: dict[str, Any], redis_url: str, namespace: str
) -> None:
    """Three guards: the ASGI guard and ``@idempotent`` key the same operation (the
    ``Idempotency-Key``), Django's middleware between them its own (``X-Charge-Key``). The
    decorator saw only the middleware's attempt in ``request.settle``, reserved the ASGI
    guard's operation again, found it in progress and answered 409 to every request."""
    runs: list[str] = []
    view = idempotent(header="Idempotency-Key")(_charging(runs))
    conf, mw = urlconf(path("pay", view)), ["settle.django.IdempotencyMiddleware"]
    own = {**settle_settings, "header": "X-Charge-Key"}
    with override_settings(ROOT_URLCONF=conf, MIDDLEWARE=mw, SETTLE=own):
        outer = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
        app = ASGIGuard(ASGIHandler(), settler=outer, principal=lambda scope: "tenant:acme")
        with serve(app, outer) as base, httpx.Client(base_url=base, timeout=30) as c:
            sent = {"X-Charge-Key": "c-3", "Idempotency-Key": "k-3", "X-Principal": "tenant:acme"}
            first = c.post("/pay", content=b"{}", headers=sent)
            again = c.post("/pay", content=b"{}", headers=sent)
    assert first.status_code == 201, first.text
    assert (again.status_code, again.content) == (201, first.content)
    assert again.headers["idempotent-replayed"] == "true"
    assert runs == ["pay"]


def _charging(runs: list[str]) -> Callable[[HttpRequest], HttpResponse]:
    """A view whose every run is one charge, named in ``runs``."""

    def pay(request: HttpRequest) -> HttpResponse:
        runs.append("pay")
        return HttpResponse(f"charged {uuid.uuid4().hex}".encode(), status=201)

    return pay


@pytest.mark.parametrize("how", ["decorator", "middleware"])
def test_a_streaming_response_of_an_async_iterator_under_asgi_is_served_without_warnings(
    settle_settings: dict[str, Any], redis_url: str, namespace: str, how: str
) -> None:
    """Under Django's ASGI handler an async iterator is what a streaming view should give
    (Django warns of a sync one). settle collected it through async_to_sync, with Django's
    warning that it "must consume asynchronous iterators" synchronously, and put it back as
    a list, with Django's warning that it "must consume synchronous iterators": two
    warnings (errors under ``-W error``) the view without settle does not cause. It is
    collected and put back as an async iterator, as the view gave it."""

    def view(request: HttpRequest) -> StreamingHttpResponse:
        RUNS.append("v")
        return StreamingHttpResponse(_receipt_parts(uuid.uuid4().hex), status=201)

    guarded, mw = guarded_by(how, view)
    with override_settings(ROOT_URLCONF=urlconf(path("r", guarded)), MIDDLEWARE=mw):
        unused = AsyncSettler.from_url(redis_url, namespace=namespace)  # serve() closes it
        with (
            warnings.catch_warnings(record=True) as caught,
            serve(ASGIHandler(), unused) as base,
            httpx.Client(base_url=base, timeout=30) as client,
        ):
            warnings.simplefilter("always")
            sent = headers_of("k-async-asgi")
            first = client.post("/r", content=b"x", headers=sent)
            again = client.post("/r", content=b"x", headers=sent)
    assert first.status_code == again.status_code == 201, first.text
    assert first.content.startswith(b"receipt ")
    assert again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"
    assert RUNS == ["v"]
    streaming = [str(w.message) for w in caught if "StreamingHttpResponse" in str(w.message)]
    assert streaming == []
