"""What a replay hands back is what the first call returned, whatever the result holds; a
call whose id or request cannot be derived is a typed error with nothing written. Real
Redis, sync and async shells (found against the peer's serialization and key tests)."""

from __future__ import annotations

import dataclasses
import itertools
import typing
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, create_model

from settle import AsyncSettler, Settler, State
from settle.decorator._signature import _ambiguous
from settle.errors import FingerprintError, InvalidInput

P = "tenant:acme"


@dataclasses.dataclass
class SignedReceipt:
    charge_id: str
    signature: bytes


class BinaryReceipt(BaseModel):
    """A model that keeps any bytes (not only UTF-8 text) by its own setting."""

    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")
    charge_id: str
    blob: bytes


def test_bytes_inside_a_dataclass_a_dict_or_a_list_replay_as_committed(settler: Settler) -> None:
    runs: list[str] = []

    @settler.operation(key="sig:{n}", principal=P)
    def sign(n: int) -> SignedReceipt:
        runs.append("sign")
        return SignedReceipt(charge_id=f"ch-{n}", signature=b"abc")

    @settler.operation(key="sigs:{n}", principal=P)
    def sigs(n: int) -> dict[str, list[bytes]]:
        runs.append("sigs")
        return {"sig": [b"abc", b"d\xc3\xa9f"]}

    assert sign(1) == sign(1) == SignedReceipt("ch-1", b"abc")
    assert sigs(1) == sigs(1) == {"sig": [b"abc", b"d\xc3\xa9f"]}
    assert runs == ["sign", "sigs"]


def test_a_model_that_stores_bytes_as_base64_keeps_binary_data(settler: Settler) -> None:
    @settler.operation(key="bin-model:{n}", principal=P)
    def receipt(n: int) -> BinaryReceipt:
        return BinaryReceipt(charge_id=f"ch-{n}", blob=b"%PDF \x00\xff")

    assert receipt(1) == receipt(1) == BinaryReceipt(charge_id="ch-1", blob=b"%PDF \x00\xff")


def test_optional_bytes_replay_the_committed_bytes(settler: Settler) -> None:
    @settler.operation(key="blob:{n}", principal=P)
    def blob(n: int) -> bytes | None:
        return b'"hi"' if n else None  # e.g. a provider's raw body, which may be JSON

    assert blob(1) == blob(1) == b'"hi"'
    assert blob(0) is None
    assert blob(0) is None


def test_plain_bytes_keep_any_binary_data(settler: Settler) -> None:
    @settler.operation(key="raw:{n}", principal=P)
    def raw(n: int) -> bytes:
        return b"%PDF \x00\xff"

    assert raw(1) == raw(1) == b"%PDF \x00\xff"


@pytest.mark.parametrize("kind", [bytearray, memoryview])
@pytest.mark.parametrize("data", [b"\x00\x01abc", b"%PDF \x00\xff"], ids=["text", "binary"])
def test_a_bytearray_or_memoryview_result_replays_as_its_bytes(
    settler: Settler, kind: Any, data: bytes
) -> None:
    """Found in audit: only ``bytes`` were stored as they are. A bytearray returned under
    ``-> bytes`` was stored as JSON, and its replay was that JSON text (or, not UTF-8, the
    completion was refused and the function ran again on the next call)."""
    runs: list[int] = []

    @settler.operation(key="blob:{n}", principal=P)
    def blob(n: int) -> bytes:
        runs.append(n)
        return kind(data)  # type: ignore[no-any-return]

    assert bytes(blob(1)) == data
    replay = blob(1)
    assert runs == [1]
    assert type(replay) is bytes
    assert replay == data


def test_binary_data_a_replay_could_not_give_back_is_refused_with_a_typed_error(
    settler: Settler,
) -> None:
    """Bytes that are not UTF-8 have no JSON form: under a type other than ``bytes`` the
    result cannot be stored as it was returned, so the completion is refused (the attempt
    is left provisional, nothing is stored that a replay would read as something else)."""

    @settler.operation(key="bin:{n}", principal=P)
    def blob(n: int) -> bytes | None:
        return b"%PDF \x00\xff"

    with pytest.raises(FingerprintError, match="not UTF-8") as caught:
        blob(1)
    assert caught.value.operation_id == "bin:1"
    record = settler.get("bin:1")
    assert record is not None
    assert record.state is State.PROVISIONAL
    assert record.result is None


def test_results_given_to_complete_replay_through_value(settler: Settler) -> None:
    r = settler.reserve("direct:1", {"n": 1}, principal=P)
    settler.complete(r.reservation, {"sig": b"abc"})
    replay = settler.reserve("direct:1", {"n": 1}, principal=P)
    assert replay.value(dict[str, bytes]) == {"sig": b"abc"}


@pytest.mark.asyncio
async def test_async_results_replay_as_committed(async_settler: AsyncSettler) -> None:
    @async_settler.operation(key="asig:{n}", principal=P)
    async def sign(n: int) -> SignedReceipt:
        return SignedReceipt(charge_id=f"ch-{n}", signature=b"abc")

    @async_settler.operation(key="ablob:{n}", principal=P)
    async def blob(n: int) -> bytes | None:
        return b'"hi"'

    assert await sign(1) == await sign(1) == SignedReceipt("ch-1", b"abc")
    assert await blob(1) == await blob(1) == b'"hi"'


@pytest.mark.asyncio
async def test_async_a_bytearray_result_replays_as_its_bytes(async_settler: AsyncSettler) -> None:
    """Found in audit: a bytearray that is not UTF-8 text, returned under ``-> bytes``, had
    its completion refused (FingerprintError), the operation left provisional, and the next
    call ran the function again."""
    runs: list[int] = []

    @async_settler.operation(key="ablob2:{n}", principal=P)
    async def blob(n: int) -> bytes:
        runs.append(n)
        return bytearray(b"PDF-1.7\xff")

    assert await blob(1) == b"PDF-1.7\xff"
    replay = await blob(1)
    assert runs == [1]
    assert type(replay) is bytes
    assert replay == b"PDF-1.7\xff"


# -- ids and requests that cannot be derived -------------------------------------------------


class MaybeOrder(BaseModel):
    order_id: str | None
    amount: int


def test_a_failing_fingerprint_or_key_callable_is_invalid_input_and_writes_nothing(
    settler: Settler,
) -> None:
    runs = 0

    @settler.operation(key="fp:{req[id]}", principal=P, fingerprint=lambda req: req["body"])
    def by_body(req: dict[str, Any]) -> int:
        nonlocal runs
        runs += 1
        return 1

    @settler.operation(key=lambda request: f"k:{request}", principal=P)
    def by_request(order: str) -> int:
        nonlocal runs
        runs += 1
        return 1

    with pytest.raises(InvalidInput, match="fingerprint callable raised KeyError") as caught:
        by_body({"id": "x"})
    assert caught.value.operation_id == "fp:x"
    assert isinstance(caught.value.__cause__, KeyError)
    with pytest.raises(InvalidInput, match="cannot derive the key") as caught:
        by_request(order="a")
    assert isinstance(caught.value.__cause__, TypeError)
    assert runs == 0
    assert settler.get("fp:x") is None


@pytest.mark.parametrize("missing", [None, ""])
def test_a_key_template_over_a_missing_value_is_refused_not_shared(
    settler: Settler, missing: str | None
) -> None:
    runs = 0

    @settler.operation(key="charge:{request.order_id}", principal=P)
    def charge(request: MaybeOrder) -> int:
        nonlocal runs
        runs += 1
        return request.amount

    with pytest.raises(InvalidInput, match=r"\{request.order_id\}"):
        charge(MaybeOrder(order_id=missing, amount=1))
    assert runs == 0
    assert settler.get(f"charge:{missing}") is None
    assert charge(MaybeOrder(order_id="o-1", amount=2)) == 2  # a real id still works


def test_zero_is_a_key_value_like_any_other(settler: Settler) -> None:
    @settler.operation(key="seq:{n}", principal=P)
    def seq(n: int) -> int:
        return n

    assert seq(0) == 0
    assert settler.get("seq:0") is not None


def test_a_malformed_key_template_is_refused_at_decoration(settler: Settler) -> None:
    with pytest.raises(InvalidInput, match="malformed"):

        @settler.operation(key="charge:{order_id", principal=P)
        def charge(order_id: str) -> int:
            return 1


@pytest.mark.asyncio
async def test_async_a_failing_fingerprint_callable_is_invalid_input(
    async_settler: AsyncSettler,
) -> None:
    @async_settler.operation(key="afp:{req[id]}", principal=P, fingerprint=lambda req: req["body"])
    async def f(req: dict[str, Any]) -> int:
        return 1

    with pytest.raises(InvalidInput, match="fingerprint callable raised"):
        await f({"id": "x"})
    assert await async_settler.get("afp:x") is None


def test_a_result_type_of_str_or_bytes_is_refused_at_decoration(settler: Settler) -> None:
    """Both are stored as a JSON string: a replay could not say which one was returned."""
    with pytest.raises(InvalidInput, match="cannot tell str from bytes"):

        @settler.operation(key="sb:{n}", principal=P)
        def either(n: int) -> str | bytes:
            return b"abc"

    with pytest.raises(InvalidInput, match="cannot tell str from bytes"):

        @settler.operation(key="sb2:{n}", principal=P, result_type=bytes | str | None)
        def other(n: int) -> Any:
            return b"abc"


def test_an_unstorable_str_is_not_blamed_on_bytes(settler: Settler) -> None:
    @settler.operation(key="surrogate:{n}", principal=P)
    def name(n: int) -> str:
        return "report-\udc80.pdf"  # os.fsdecode of a file name that is not UTF-8

    with pytest.raises(FingerprintError) as caught:
        name(1)
    assert "bytes" not in str(caught.value)
    assert "surrogates" in str(caught.value)


@dataclasses.dataclass
class Signed:
    value: str | bytes


class SignedModel(BaseModel):
    values: list[bytes | str]


@pytest.mark.parametrize(
    "declared", [dict[str, str | bytes], list[bytes | str | None], Signed, SignedModel]
)
def test_str_or_bytes_anywhere_in_the_result_type_is_refused(
    settler: Settler, declared: Any
) -> None:
    with pytest.raises(InvalidInput, match="cannot tell str from bytes"):

        @settler.operation(key="nsb:{n}", principal=P, result_type=declared)
        def either(n: int) -> Any:
            return {"sig": b"abc"}


@dataclasses.dataclass
class Page:
    ids: list[int]
    tags: set[str]


@dataclasses.dataclass
class Blobs:
    parts: list[str | bytes]


@dataclasses.dataclass
class Counts:
    by_name: dict[str, int]
    pair: tuple[int, str]


@dataclasses.dataclass
class Signed:
    sig: tuple[int, str | bytes]


def test_a_dataclass_with_str_or_bytes_next_to_another_is_refused(settler: Settler) -> None:
    """Blobs alone is refused (the commit's test); next to another dataclass it must be too."""
    with pytest.raises(InvalidInput, match="cannot tell str from bytes"):

        @settler.operation(key="pb:{n}", principal=P)
        def both(n: int) -> tuple[Page, Blobs]:
            return Page([1], {"a"}), Blobs([b"abc"])


def test_a_dataclass_with_str_or_bytes_after_another_is_refused(settler: Settler) -> None:
    with pytest.raises(InvalidInput, match="cannot tell str from bytes"):

        @settler.operation(key="cs:{n}", principal=P)
        def both(n: int) -> tuple[Counts, Signed]:
            return Counts({"a": 1}, (1, "x")), Signed((1, b"abc"))


def test_str_or_bytes_in_a_large_model_is_refused(settler: Settler) -> None:
    """A response model with many optional list fields, one of them str | bytes."""
    fields: dict[str, object] = {f"f{i}": (list[int] | None, None) for i in range(120)}
    big_model = create_model("Big", **fields, sig=(str | bytes, ""))  # type: ignore[call-overload]
    with pytest.raises(InvalidInput, match="cannot tell str from bytes"):

        @settler.operation(key="big:{n}", principal=P, result_type=big_model)
        def big(n: int) -> Any:
            return big_model(sig=b"abc")


@dataclasses.dataclass
class Tagged:
    KIND: typing.ClassVar[str | bytes] = "receipt"  # not a field: never stored
    charge_id: str = ""


def test_a_class_variable_is_not_part_of_the_result(settler: Settler) -> None:
    @settler.operation(key="tg:{n}", principal=P)
    def tagged(n: int) -> Tagged:
        return Tagged(charge_id=f"ch-{n}")

    assert tagged(1) == tagged(1) == Tagged("ch-1")


class SigDict(typing.TypedDict):
    sig: str | bytes


class SigTuple(typing.NamedTuple):
    sig: str | bytes


@pytest.mark.parametrize("declared", [SigDict, SigTuple])
def test_str_or_bytes_in_a_typeddict_or_namedtuple_is_refused(
    settler: Settler, declared: Any
) -> None:
    with pytest.raises(InvalidInput, match="cannot tell str from bytes"):

        @settler.operation(key="td:{n}", principal=P, result_type=declared)
        def sig(n: int) -> Any:
            return {"sig": b"abc"}


def test_str_or_bytes_in_the_second_of_two_dataclasses_is_always_refused() -> None:
    """tuple[A, B], B holding str | bytes, over 126 field layouts of A: each is refused (the
    types looked at are kept alive: a freed one's id, reused, once hid the next one)."""
    kinds = ["int", "list[int]", "dict[str, int]", "tuple[int, str]", "int | None", "set[str]"]
    bad = ["list[str | bytes]", "dict[str, str | bytes]", "tuple[int, str | bytes]"]
    missed = []
    for k in (1, 2):
        for combo in itertools.product(kinds, repeat=k):
            for b in bad:
                ns: dict[str, Any] = {"__name__": __name__}
                fields = "".join(f"    f{i}: {t}\n" for i, t in enumerate(combo))
                exec(
                    "from __future__ import annotations\nimport dataclasses\n"
                    f"@dataclasses.dataclass\nclass A:\n{fields}"
                    f"@dataclasses.dataclass\nclass B:\n    y: {b}\n",
                    ns,
                )
                pair = (ns["A"], ns["B"])
                if not _ambiguous(tuple.__class_getitem__(pair), {}):
                    missed.append((combo, b))
    assert not missed, f"{len(missed)} of 126 not refused, e.g. {missed[:2]}"


def test_a_bytearray_under_optional_bytes_replays_as_bytes(settler: Settler) -> None:
    """Found in review (a surviving mutant: ``isinstance(value, bytes)`` in Plan.ran): a
    bytes-like result under a type other than ``bytes`` is stored as JSON, and replays as
    the bytes it held, not the raw object."""
    runs: list[int] = []

    @settler.operation(key="ob:{n}", principal=P)
    def blob(n: int) -> bytes | None:
        runs.append(n)
        return bytearray(b"abc")

    @settler.operation(key="ob2:{n}", principal=P)
    def blob2(n: int) -> typing.Optional[bytes]:  # noqa: UP045  # the spelling matters
        runs.append(n)
        return memoryview(b"xyz")

    assert blob(1) == b"abc"
    assert blob(1) == b"abc"
    assert blob2(1) == b"xyz"
    assert blob2(1) == b"xyz"
    assert runs == [1, 1]
