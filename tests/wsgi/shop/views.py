"""The Django shop's views (the example of docs/http-endpoints.md)."""

# views.py
import uuid

from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView


class PaymentIn(serializers.Serializer):
    amount = serializers.IntegerField(min_value=1)
    currency = serializers.RegexField("^[A-Z]{3}$")
    customer = serializers.CharField()


class PaymentView(APIView):
    def post(self, request):
        payment = PaymentIn(data=request.data)
        payment.is_valid(raise_exception=True)  # a 400 is stored and replayed too
        attempt = request.settle  # settle.Attempt
        charge_id = f"ch_{uuid.uuid4().hex[:16]}"  # charge with attempt.idempotency_key
        return Response(
            {**payment.validated_data, "id": charge_id, "generation": attempt.generation},
            status=201,
            headers={"Location": f"/payments/{charge_id}"},
        )


class RefundView(APIView):
    def post(self, request, payment_id):
        attempt = request.settle
        refund_id = f"re_{uuid.uuid4().hex[:16]}"
        return Response({"id": refund_id, "payment": payment_id, "fence": attempt.generation}, 201)
