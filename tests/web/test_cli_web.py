"""``settle web`` as a user runs it: the installed console script, a real server on a
loopback port, a real redis-server."""

from __future__ import annotations

from pathlib import Path

import click
import httpx
import pytest

from settle import Settler
from settle.cli.web import web
from settle.web._security import CSP
from tests.cli.conftest import settle
from tests.web.evidence import conflicting, stale_settlement
from tests.web.server import free_port, settle_web
from tests.web.test_console_http import csrf_of

TOKEN = "cli-token-7f3a"
DOC = Path(__file__).resolve().parents[2] / "docs" / "console.md"


def test_without_a_token_the_console_is_read_only(redis_url: str, writer: Settler) -> None:
    ref = stale_settlement(writer, "order-cli-ro")
    ns = writer.config.namespace
    with settle_web("--redis-url", redis_url, "--namespace", ns) as url:
        page = httpx.get(f"{url}/entry/{ref}")
        assert page.status_code == 200
        assert page.headers["content-security-policy"] == CSP
        assert "read-only console" in page.text
        assert "order-cli-ro" in page.text
        assert httpx.get(f"{url}/signin").status_code == 404
        refused = httpx.post(f"{url}/entry/{ref}/resolve", data={"note": "x", "csrf": "x"})
        assert refused.status_code == 403
        overview = httpx.get(url + "/")
        assert "stale_generation" in overview.text
    assert writer.quarantine.get(ref).resolution is None


def test_with_a_token_a_signed_in_user_resolves_and_is_named(
    redis_url: str, writer: Settler
) -> None:
    ref = conflicting(writer, "order-cli-rw")
    ns = writer.config.namespace
    with (
        settle_web(
            "--redis-url", redis_url, "--namespace", ns, "--principal", "ops-bob", token=TOKEN
        ) as url,
        httpx.Client(base_url=url) as browser,
    ):
        form = browser.get("/signin").text
        assert (
            browser.post("/signin", data={"token": "wrong", "csrf": csrf_of(form)}).status_code
            == 403
        )
        signed = browser.post("/signin", data={"token": TOKEN, "csrf": csrf_of(form)})
        assert signed.status_code == 303
        page = browser.get(f"/entry/{ref}").text
        assert "signed in as ops-bob" in page
        done = browser.post(
            f"/entry/{ref}/resolve", data={"note": "refunded ch_2", "csrf": csrf_of(page)}
        )
        assert done.status_code == 303
    resolution = writer.quarantine.get(ref).resolution
    assert resolution is not None
    assert resolution.note == "[resolved by ops-bob] refunded ch_2"


def test_a_missing_namespace_is_refused_before_serving(redis_url: str) -> None:
    done = settle(
        "web", "--redis-url", redis_url, "--namespace", "never-written", "--port", str(free_port())
    )
    assert done.returncode == 3
    assert "does not exist" in done.stderr


def test_every_option_of_settle_web_is_documented_where_the_proxy_advice_is() -> None:
    # --allow-host was in no doc, while docs/console.md sent users behind a reverse proxy,
    # whose Host header the console then refused (400) on every request.
    text = DOC.read_text(encoding="utf-8")
    options = [o for p in web.params if isinstance(p, click.Option) for o in p.opts]
    assert [o for o in options if o.startswith("--") and f"`{o}" not in text] == []
    proxy = text[text.index("behind a reverse proxy") :][:600]
    assert "--allow-host" in proxy


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (("--token", "x", "--principal", "a\nb"), "--principal"),
        (("--token", "x", "--principal", ""), "--principal"),
        (("--token", "x", "--principal", "p" * 5000), "--principal"),
        (("--principal", "ops\tbob"), "--principal"),
        (("--token", "cli-token\r"), "--token"),
        (("--token", "\udcff"), "--token"),  # a byte that is no UTF-8: a lone surrogate
        (("--allow-host", "a*b.example.com"), "--allow-host"),
        (("--allow-host", "*example.com"), "--allow-host"),
    ],
)
def test_an_option_the_console_cannot_use_is_refused_at_start_up(
    redis_url: str, writer: Settler, args: tuple[str, ...], option: str
) -> None:
    """``settle web --token x --principal $'a\\nb'`` served a console whose every resolve
    was refused (the principal goes into the note, which is one line); a token with a line
    break one nobody could sign in to (a password field cannot send it), a token that is no
    UTF-8 a traceback; ``--allow-host 'a*b'`` one whose every page was a 500 (Starlette
    checks the patterns at the first request). Each is refused before anything is served:
    exit 2, the option named, nothing else said."""
    ns = writer.config.namespace
    connection = ("--redis-url", redis_url, "--namespace", ns, "--port", str(free_port()))
    done = settle("web", *connection, *args, timeout=20)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.startswith(f"settle: bad {option}: must "), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "cli-token" not in done.stderr  # a token is never shown


def test_the_options_the_console_can_use_start_it(redis_url: str, writer: Settler) -> None:
    """The start-up checks refuse only what the console cannot use: a principal with
    spaces and non-ASCII letters, wildcard hosts Starlette takes."""
    ns = writer.config.namespace
    with settle_web(
        "--redis-url",
        redis_url,
        "--namespace",
        ns,
        "--principal",
        "Zoë Ortiz (support)",
        "--allow-host",
        "*.internal.example.com",
        "--allow-host",
        "settle.example.com",
        token=TOKEN,
    ) as url:
        assert httpx.get(url + "/").status_code == 200
        served = httpx.get(url + "/", headers={"host": "eu.internal.example.com"})
        assert served.status_code == 200
        assert httpx.get(url + "/", headers={"host": "evil.example"}).status_code == 400


def test_an_ipv6_allow_host_serves_its_host_header(redis_url: str, writer: Settler) -> None:
    """``--allow-host 2001:db8::5`` (an address, as ``--host`` takes it) was taken and
    matched nothing: a browser sends ``Host: [2001:db8::5]:PORT``, and got 400."""
    ns = writer.config.namespace
    with settle_web(
        "--redis-url", redis_url, "--namespace", ns, "--allow-host", "2001:db8::5"
    ) as url:
        port = url.rsplit(":", 1)[1]
        served = httpx.get(url + "/", headers={"host": f"[2001:db8::5]:{port}"})
        assert served.status_code == 200
        other = httpx.get(url + "/", headers={"host": f"[2001:db8::6]:{port}"})
        assert other.status_code == 400
