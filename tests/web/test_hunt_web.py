"""What a hostile acceptance tester found in the console: filters that listed another
operation's evidence, responses without the security headers, forms and filters whose
bytes were altered before use, and a note box that cut what was typed. Real apps (httpx
ASGITransport and ``settle web`` under uvicorn) on the session's redis-server."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from settle import Settler
from settle.web._security import CSP
from tests.web.evidence import conflicting
from tests.web.server import settle_web

#: What docs/console.md says every response of the console carries.
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


def refs_in(html: str) -> list[str]:
    return re.findall(r'<td class="mono nowrap"><a href="/entry/(\d+/\d+-\d+)">', html)


@pytest.mark.asyncio
async def test_an_operation_filter_lists_that_operation_spaces_and_all(
    writer: Settler, read_only: httpx.AsyncClient
) -> None:
    """An operation id may start or end with a space (settle takes any printable text).
    The filter stripped it: ``?operation=%20order-1%20`` listed, and exported, the entries
    of ``order-1``, another operation's evidence, under the filter of this one."""
    spaced = conflicting(writer, " order-1 ")
    plain = conflicting(writer, "order-1")
    listed = await read_only.get("/quarantine?operation=%20order-1%20")
    assert listed.status_code == 200
    assert refs_in(listed.text) == [spaced]
    assert 'name="operation" value=" order-1 "' in listed.text  # the filter as typed
    assert refs_in((await read_only.get("/quarantine?operation=order-1")).text) == [plain]
    exported = await read_only.get("/quarantine.jsonl?operation=+order-1+")
    lines = [json.loads(line) for line in exported.text.splitlines()]
    assert [(line["ref"], line["operation_id"]) for line in lines] == [(spaced, " order-1 ")]
    # The export link of the page keeps the operation as it is too.
    link = re.search(r'href="(/quarantine\.jsonl\?[^"]*)"', listed.text)
    assert link is not None
    again = await read_only.get(link.group(1).replace("&amp;", "&"))
    assert [json.loads(line)["ref"] for line in again.text.splitlines()] == [spaced]


def test_a_refused_host_gets_the_security_headers_too(redis_url: str, writer: Settler) -> None:
    """docs/console.md: every response carries the CSP, X-Frame-Options, nosniff,
    Referrer-Policy and no-store. The 400 of a ``Host`` the console does not serve (DNS
    rebinding) carried none of them: the host check ran before the headers were added."""
    ns = writer.config.namespace
    with settle_web("--redis-url", redis_url, "--namespace", ns) as url:
        for host in ("rebound.example", "127.0.0.1.", "localhost:80@evil"):
            refused = httpx.get(url + "/quarantine", headers={"host": host})
            assert refused.status_code == 400, host
            for name, value in SECURITY_HEADERS.items():
                assert refused.headers.get(name) == value, (host, name)
        served = httpx.get(url + "/quarantine")
        assert served.status_code == 200
        for name, value in SECURITY_HEADERS.items():
            assert served.headers[name] == value
