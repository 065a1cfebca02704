"""``settle.django.middleware_order`` is advice for an operator: logged once per process for
one ``MIDDLEWARE`` list, however many times Django loads the middleware (each test
``Client``, each ``WSGIHandler``), and again once the list changes."""

from __future__ import annotations

from typing import Any

from django.core.handlers.wsgi import WSGIHandler
from django.http import HttpRequest, JsonResponse
from django.test import Client, override_settings
from django.urls import path
from structlog.testing import capture_logs

from tests.wsgi.test_django_views import headers, settle_settings, urlconf

__all__ = ["settle_settings"]  # the fixture

BEFORE_CSRF = ["settle.django.IdempotencyMiddleware", "django.middleware.csrf.CsrfViewMiddleware"]


def create(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True}, status=201)


def _order(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "settle.django.middleware_order"]


def test_the_order_warning_is_logged_once_per_configuration(
    settle_settings: dict[str, Any],
) -> None:
    conf = urlconf(path("create", create))
    with override_settings(ROOT_URLCONF=conf, MIDDLEWARE=BEFORE_CSRF), capture_logs() as logs:
        for n in range(3):  # three test clients, each loading the middleware
            Client().post("/create", {"a": "1"}, **headers(f"k-once-{n}"))
        WSGIHandler()  # a server's handler loads it again
    assert len(_order(logs)) == 1, _order(logs)
    changed = [*BEFORE_CSRF, "django.middleware.common.CommonMiddleware"]
    with override_settings(ROOT_URLCONF=conf, MIDDLEWARE=changed), capture_logs() as logs:
        Client().post("/create", {"a": "1"}, **headers("k-once-changed"))
        Client().post("/create", {"a": "1"}, **headers("k-once-changed-2"))
    assert len(_order(logs)) == 1, _order(logs)
