"""Requests given as pydantic models, ported from aws-lambda-powertools' idempotency tests
(``_pydantic/test_idempotency_uuid_serialization.py``, ``test_idempotency_hash_serialization.py``):
a model's request fingerprint is the same in every process, and a model with no canonical
form is refused with settle's typed error before anything runs or is written."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from datetime import UTC, datetime
from decimal import Decimal
from enum import Enum
from pathlib import Path
from typing import Annotated
from uuid import UUID

import pytest
from pydantic import BaseModel, ConfigDict, PlainSerializer, field_serializer

from settle import FingerprintError, FingerprintMismatch, Settler, fingerprint

ROOT = Path(__file__).resolve().parents[2]


class Tagged(BaseModel):
    order_id: str
    tags: set[str]


class Attachment(BaseModel):
    order_id: str
    data: bytes


class Opaque(BaseModel):
    order_id: str
    extra: object


def test_a_model_holding_a_set_fingerprints_alike_in_every_process() -> None:
    """Pydantic's JSON mode writes a set as a list in iteration order, which follows the
    per-process string hash: the same request must not get another fingerprint in another
    worker (its retry would be refused as a different request)."""
    code = (
        "from pydantic import BaseModel\n"
        "from settle import fingerprint\n"
        "class Tagged(BaseModel):\n"
        "    order_id: str\n"
        "    tags: set[str]\n"
        "try:\n"
        "    tagged = Tagged(order_id='o-1', tags={'gift', 'express', 'fragile', 'eu'})\n"
        "    print(fingerprint(tagged))\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__)\n"
    )
    outputs = set()
    for seed in ("1", "2", "3", "4", "5"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outputs.add(done.stdout.strip())
    assert len(outputs) == 1, outputs
    # The set is written in one order: the request as a sorted list.
    tagged = Tagged(order_id="o-1", tags={"gift", "express", "fragile", "eu"})
    assert fingerprint(tagged) == fingerprint(
        {"order_id": "o-1", "tags": ["eu", "express", "fragile", "gift"]}
    )
    assert outputs == {fingerprint(tagged)}


class Sized(BaseModel):
    order_id: str
    sizes: frozenset[int]
    lines: list[set[str]]


class SortedBySerializer(BaseModel):
    order_id: str
    tags: set[str]

    @field_serializer("tags", when_used="json")
    def _sorted(self, tags: set[str]) -> list[str]:
        return sorted(tags)


def test_sets_in_a_model_are_ordered_not_refused() -> None:
    """A model holding sets is fingerprinted, never refused (it was, for a while, breaking
    every call of a model that worked): strings sorted as strings, numbers as numbers (the
    order a set of small ints iterates in, so their fingerprints stay what they were), sets
    inside lists too; a serializer that sorts the set itself gives the fingerprint it gave
    before."""
    sized = Sized(order_id="o-1", sizes=frozenset({10, 2, 33}), lines=[{"b", "a"}, {"c"}])
    assert fingerprint(sized) == fingerprint(
        {"order_id": "o-1", "sizes": [2, 10, 33], "lines": [["a", "b"], ["c"]]}
    )
    small = Sized(order_id="o-1", sizes=frozenset({3, 1, 2}), lines=[])
    assert fingerprint(small) == fingerprint(
        {"order_id": "o-1", "sizes": list(frozenset({3, 1, 2})), "lines": []}
    )
    by_serializer = SortedBySerializer(order_id="o-1", tags={"z", "a", "m"})
    assert (
        fingerprint(by_serializer)
        == fingerprint(by_serializer.model_dump(mode="json"))
        == fingerprint({"order_id": "o-1", "tags": ["a", "m", "z"]})
    )


@pytest.mark.parametrize(
    "request_",
    [Attachment(order_id="o-1", data=b"\xff\xfe"), Opaque(order_id="o-1", extra=object())],
    ids=["bytes-not-utf8", "unknown-object"],
)
def test_a_model_pydantic_cannot_dump_is_a_fingerprint_error_and_nothing_runs(
    settler: Settler, request_: BaseModel
) -> None:
    runs: list[str] = []

    @settler.operation(key="ship:{request.order_id}", principal="tenant:acme")
    def ship(request: BaseModel) -> str:
        runs.append("ran")
        return "shipped"

    with pytest.raises(FingerprintError):
        ship(request_)
    with pytest.raises(FingerprintError):
        settler.reserve("ship:o-1", request_, principal="tenant:acme")
    assert runs == []
    assert settler.get("ship:o-1") is None


class Channel(Enum):
    WEB = "web"
    POS = "pos"


@dataclasses.dataclass
class Refund:
    refund_id: str
    amounts: list[Decimal]
    seen_at: dict[str, datetime]
    payments: tuple[UUID, ...]
    channels: list[Channel]


class RefundModel(BaseModel):
    refund_id: str
    amounts: list[Decimal]
    seen_at: dict[str, datetime]
    payments: tuple[UUID, ...]
    channels: list[Channel]


def test_a_dataclass_holding_containers_of_datetimes_and_uuids_is_fingerprinted_like_a_model(
    settler: Settler,
) -> None:
    """docs/outbound-calls.md: dataclass arguments are fingerprinted like pydantic models,
    in pydantic's JSON mode. The values inside a list or dict field too (powertools'
    ``test_new_types_support_persistent_replay_and_payload_validation``)."""
    request = Refund(
        refund_id="r-1",
        amounts=[Decimal("10.10"), Decimal("0.90")],
        seen_at={"created": datetime(2024, 3, 20, 14, 30, tzinfo=UTC)},
        payments=(UUID("12345678-1234-5678-1234-567812345678"),),
        channels=[Channel.WEB],
    )
    model = RefundModel.model_validate(dataclasses.asdict(request))
    assert fingerprint(request) == fingerprint(model)
    runs: list[Refund] = []

    @settler.operation(key="refund:{refund.refund_id}", principal="tenant:acme")
    def refund(refund: Refund) -> str:
        runs.append(refund)
        return "refunded"

    assert refund(request) == "refunded"
    assert refund(dataclasses.replace(request)) == "refunded"  # replayed
    assert len(runs) == 1
    with pytest.raises(FingerprintMismatch):
        refund(dataclasses.replace(request, channels=[Channel.POS]))
    with pytest.raises(FingerprintError):  # a set inside stays refused
        fingerprint(dataclasses.replace(request, seen_at={"created": {1, 2}}))


class PaymentMethod(BaseModel):
    kind: str


class Card(PaymentMethod):
    last4: str


class Charge(BaseModel):
    order_id: str
    amount: int
    method: PaymentMethod


def test_a_subclass_in_a_models_field_is_part_of_the_request(settler: Settler) -> None:
    """A field declared as a base model holding a subclass: pydantic dumps it as the base,
    so a charge to another card had the first charge's fingerprint and was answered with
    its result. A changed request is never the same operation (SPEC 2)."""
    first = Charge(order_id="o-1", amount=4999, method=Card(kind="card", last4="4242"))
    other = Charge(order_id="o-1", amount=4999, method=Card(kind="card", last4="1111"))
    assert fingerprint(first) != fingerprint(other)
    runs: list[Charge] = []

    @settler.operation(key="charge:{request.order_id}", principal="tenant:acme")
    def charge(request: Charge) -> str:
        runs.append(request)
        return f"charged {request.method}"

    charge(first)
    with pytest.raises(FingerprintMismatch):
        charge(other)
    assert runs == [first]


Money = Annotated[Decimal, PlainSerializer(lambda amount: f"{amount:.2f}", return_type=str)]


class Account:
    """A domain object pydantic does not know; the model says how to write it."""

    def __init__(self, number: str) -> None:
        self.number = number


class Transfer(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    transfer_id: str
    amount: Money
    fees: list[Money]
    account: Annotated[Account, PlainSerializer(lambda a: a.number, return_type=str)]


def test_a_models_own_serializers_make_its_fingerprint(settler: Settler) -> None:
    """SPEC 1: a pydantic model is dumped with ``mode="json"`` first, its own serializers
    (``PlainSerializer`` in ``Annotated``) included: its fingerprint is that of its JSON
    dump, as before subclasses were counted (an operation reserved before a deploy must
    match its retry after it). A field whose type only its serializer can write (an
    arbitrary class) is fingerprinted, not refused, and two requests the model writes
    alike (1.5 and 1.50 at two decimals) are the same request."""
    first = Transfer(
        transfer_id="t-1", amount=Decimal("1.5"), fees=[Decimal("0.2")], account=Account("A-1")
    )
    assert fingerprint(first) == fingerprint(first.model_dump(mode="json"))
    runs: list[Transfer] = []

    @settler.operation(key="transfer:{request.transfer_id}", principal="tenant:acme")
    def transfer(request: Transfer) -> str:
        runs.append(request)
        return "sent"

    assert transfer(first) == "sent"
    same = first.model_copy(update={"amount": Decimal("1.50"), "fees": [Decimal("0.20")]})
    assert transfer(same) == "sent"  # replayed
    assert runs == [first]
    with pytest.raises(FingerprintMismatch):
        transfer(first.model_copy(update={"account": Account("B-2")}))


class Order(BaseModel):
    order_id: str
    charge: Charge


class Basket(BaseModel):
    basket_id: str
    charges: list[Charge]


def test_a_subclass_deeper_in_a_model_is_part_of_the_request() -> None:
    """The subclass is held by a model inside the model, or by a list of them: still the
    request's (two charges to different cards are two requests)."""
    card = Card(kind="card", last4="4242")
    other = Card(kind="card", last4="1111")
    first = Charge(order_id="o-1", amount=4999, method=card)
    second = first.model_copy(update={"method": other})
    assert fingerprint(Order(order_id="o-1", charge=first)) != fingerprint(
        Order(order_id="o-1", charge=second)
    )
    assert fingerprint(Basket(basket_id="b-1", charges=[first])) != fingerprint(
        Basket(basket_id="b-1", charges=[second])
    )


class Grouped(BaseModel):
    order_id: str
    groups: list[frozenset[str]]


def test_a_set_inside_a_list_in_a_model_is_ordered() -> None:
    grouped = Grouped(order_id="o-1", groups=[frozenset({"gift", "express"})])
    assert fingerprint(grouped) == fingerprint({"order_id": "o-1", "groups": [["express", "gift"]]})
