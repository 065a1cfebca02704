"""What ``create_app`` and ``token_authorizer`` are given is checked when they are called,
by the rule the console applies later, not at the first request or the first resolve."""

from __future__ import annotations

import pytest

from settle import AsyncSettler, Settler
from settle.errors import InvalidInput
from settle.web import create_app, token_authorizer
from settle.web._security import MAX_PRINCIPAL_CHARS
from tests.web.conftest import TOKEN, client_for
from tests.web.evidence import stale_settlement
from tests.web.test_console_http import csrf_of


@pytest.mark.asyncio
@pytest.mark.parametrize("pattern", ["a*b.example.com", "*example.com", "example.*"])
async def test_create_app_refuses_a_host_pattern_starlette_refuses(
    reader: AsyncSettler, pattern: str
) -> None:
    """Starlette builds its middleware at the first request: ``allowed_hosts=['a*b']``
    made an app that answered every request with 500 (an AssertionError)."""
    with pytest.raises(InvalidInput, match="allowed_hosts must be") as caught:
        create_app(reader, allowed_hosts=["localhost", pattern])
    assert repr(pattern) in str(caught.value)


@pytest.mark.asyncio
async def test_create_app_takes_the_host_patterns_starlette_takes(reader: AsyncSettler) -> None:
    served = [
        (["*"], "anything.example"),
        (["*.example.com", "console.example.com"], "eu.example.com"),
        (["*.example.com", "console.example.com"], "console.example.com"),
        ([], "localhost"),  # the default: loopback names
        (None, "localhost"),
    ]
    for hosts, host in served:
        async with client_for(create_app(reader, allowed_hosts=hosts)) as client:
            assert (await client.get("/", headers={"host": host})).status_code == 200, hosts


@pytest.mark.parametrize(
    "principal", ["", "a\nb", "ops\tbob", "x\u202e", "p" * (MAX_PRINCIPAL_CHARS + 1), None]
)
def test_token_authorizer_refuses_a_principal_no_note_can_carry(principal: object) -> None:
    with pytest.raises(InvalidInput, match=r"^principal must be "):
        token_authorizer(TOKEN, principal)  # type: ignore[arg-type]


@pytest.mark.parametrize("token", ["", "tok\n", "tok\r", "\udcff", "a\x00b"])
def test_token_authorizer_refuses_a_token_no_sign_in_form_can_send(token: str) -> None:
    with pytest.raises(InvalidInput, match=r"^token must not be empty") as caught:
        token_authorizer(token)
    assert isinstance(caught.value, ValueError)  # as the empty token's refusal always was


@pytest.mark.asyncio
async def test_a_principal_that_fills_the_note_still_resolves(
    reader: AsyncSettler, writer: Settler
) -> None:
    """The longest principal leaves room for a one-character note, and resolves."""
    longest = "p" * MAX_PRINCIPAL_CHARS
    ref = stale_settlement(writer, "order-long-principal")
    app = create_app(reader, authorize=token_authorizer(TOKEN, longest))
    async with client_for(app) as browser:
        form = (await browser.get("/signin")).text
        await browser.post("/signin", data={"token": TOKEN, "csrf": csrf_of(form)})
        page = (await browser.get(f"/entry/{ref}")).text
        done = await browser.post(
            f"/entry/{ref}/resolve", data={"note": "x", "csrf": csrf_of(page)}
        )
        assert done.status_code == 303
    resolution = writer.quarantine.get(ref).resolution
    assert resolution is not None
    assert resolution.note == f"[resolved by {longest}] x"


@pytest.mark.asyncio
async def test_a_principal_no_note_can_carry_is_said_at_resolve_not_blamed_on_the_note(
    reader: AsyncSettler, writer: Settler
) -> None:
    """An ``authorize`` of one's own granted ``'a\\nb'``: every resolve was refused with
    "note must not contain control characters or line breaks", of a note typed on one
    line. The console says what is wrong (the principal), by the rule ``settle web`` checks
    its --principal with, and nothing is resolved."""
    ref = stale_settlement(writer, "order-bad-principal")
    app = create_app(reader, authorize=lambda typed: "a\nb" if typed == TOKEN else None)
    async with client_for(app) as browser:
        form = (await browser.get("/signin")).text
        signed = await browser.post("/signin", data={"token": TOKEN, "csrf": csrf_of(form)})
        assert signed.status_code == 303
        page = (await browser.get(f"/entry/{ref}")).text
        refused = await browser.post(
            f"/entry/{ref}/resolve", data={"note": "refunded", "csrf": csrf_of(page)}
        )
    assert refused.status_code == 400
    assert "principal must be" in refused.text
    assert "note must not" not in refused.text
    assert writer.quarantine.get(ref).resolution is None


@pytest.mark.asyncio
async def test_an_ipv6_address_among_the_hosts_serves_its_host_header(
    reader: AsyncSettler,
) -> None:
    """A browser sends an IPv6 address in brackets (``Host: [2001:db8::1]:8000``), which
    Starlette compares whole: ``allowed_hosts=['2001:db8::1']`` (and ``settle web --host
    2001:db8::1``) made a console that answered 400 to every request at that address."""
    app = create_app(reader, allowed_hosts=["2001:db8::1", "[2001:db8::2]"])
    async with client_for(app) as client:
        for host in ("[2001:db8::1]:8000", "[2001:db8::1]", "[2001:db8::2]:8000"):
            assert (await client.get("/", headers={"host": host})).status_code == 200, host
        assert (await client.get("/", headers={"host": "[2001:db8::3]"})).status_code == 400


def test_create_app_refuses_a_sync_settler(writer: Settler) -> None:
    """A sync ``Settler`` was taken, and every page then answered 500 (the console awaits
    its calls): refused when the app is made, naming what to pass instead."""
    with pytest.raises(InvalidInput, match="create_app needs an AsyncSettler") as caught:
        create_app(writer)  # type: ignore[arg-type]
    assert "got Settler" in str(caught.value)


@pytest.mark.asyncio
@pytest.mark.parametrize("authorize", [5, "token", b"x"])
async def test_create_app_refuses_an_authorize_that_cannot_be_called(
    reader: AsyncSettler, authorize: object
) -> None:
    """``authorize=5`` was taken, and every sign-in then answered 500."""
    with pytest.raises(InvalidInput, match="authorize must be a callable"):
        create_app(reader, authorize=authorize)  # type: ignore[arg-type]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "option",
    [{"secret_key": b"k" * 32}, {"secret_key": 5}, {"https_only": "no"}, {"https_only": 1}],
    ids=str,
)
async def test_create_app_refuses_a_secret_key_or_https_only_of_another_type(
    reader: AsyncSettler, option: dict[str, object]
) -> None:
    """The neighbours of a sync settler and an ``authorize`` that cannot be called: a bytes
    ``secret_key`` (as a key is often read) ended ``create_app`` with an AttributeError, and
    ``https_only="no"`` (an environment variable) was taken as True."""
    with pytest.raises(InvalidInput, match=f"{next(iter(option))} must be"):
        create_app(reader, **option)  # type: ignore[arg-type]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "authorize", [None, token_authorizer("t0ken-for-ops", "ops")], ids=["read-only", "token"]
)
async def test_create_app_refuses_an_empty_secret_key(
    reader: AsyncSettler, authorize: object
) -> None:
    """``secret_key=""`` (an unset variable read as empty) was taken as "no key": each
    process signed its sessions with a random one, so a sign-in ended at every restart and
    failed on every other worker of the service, with nothing said."""
    with pytest.raises(InvalidInput, match="secret_key must not be empty"):
        create_app(reader, authorize=authorize, secret_key="")  # type: ignore[arg-type]
