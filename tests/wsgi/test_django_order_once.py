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


def test_the_order_warning_comes_back_with_a_list_seen_before(
    settle_settings: dict[str, Any],
) -> None:
    """A list that comes back after another (an ``override_settings`` ended, a test after
    one that changed ``MIDDLEWARE``) is a change too: warned again, so a test asserting the
    warning does not depend on which test ran first."""
    conf = urlconf(path("create", create))
    other = ["settle.django.IdempotencyMiddleware"]
    with override_settings(ROOT_URLCONF=conf, MIDDLEWARE=BEFORE_CSRF), capture_logs() as first:
        Client().post("/create", {"a": "1"}, **headers("k-back-1"))
    with override_settings(ROOT_URLCONF=conf, MIDDLEWARE=other):
        Client().post("/create", {"a": "1"}, **headers("k-back-2"))
    with override_settings(ROOT_URLCONF=conf, MIDDLEWARE=BEFORE_CSRF), capture_logs() as again:
        Client().post("/create", {"a": "1"}, **headers("k-back-3"))
    assert (len(_order(first)), len(_order(again))) == (1, 1), (first, again)
