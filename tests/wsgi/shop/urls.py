"""The Django shop's URLs (the example of docs/http-endpoints.md)."""

# urls.py
from django.urls import path
from shop.views import PaymentView, RefundView

from settle.django import idempotent

urlpatterns = [
    path("payments", PaymentView.as_view()),  # guarded by the middleware (SETTLE["paths"])
    path("refunds/<str:payment_id>", idempotent(RefundView.as_view())),  # guarded per view
]

# -- test-only views ------------------------------------------------------------------------

from django.http import HttpRequest, JsonResponse  # noqa: E402 - after the documented part
from shop import probe  # noqa: E402


@idempotent
def flaky(request: HttpRequest) -> JsonResponse:
    probe.ran(request.settle, request.path)
    return JsonResponse({"run": probe.crash_first(request.path)}, status=201)


urlpatterns += [path("flaky", flaky)]
