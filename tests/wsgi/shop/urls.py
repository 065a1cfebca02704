"""The Django shop's URLs (the example of docs/http-endpoints.md)."""

# urls.py
from django.urls import path
from shop.views import PaymentView, RefundView

from settle.django import idempotent

urlpatterns = [
    path("payments", PaymentView.as_view()),  # guarded by the middleware (SETTLE["paths"])
    path("refunds/<str:payment_id>", idempotent(RefundView.as_view())),  # guarded per view
]
