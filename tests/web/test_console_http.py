"""The console through the real ASGI app (httpx ASGITransport) on a real redis-server:
pages, filters, cursor paging across shards, export, and the safety rules."""

from __future__ import annotations

import json
import re

import httpx
import pytest
import redis
from starlette.applications import Starlette
from starlette.routing import Mount
from structlog.testing import capture_logs

from settle import AsyncSettler, Reserved, Settler
from settle._core.keys import Keys
from settle._log import binding_digest
from settle.web import _query, create_app, token_authorizer
from settle.web._security import CSP
from tests.web.conftest import TOKEN, client_for
from tests.web.evidence import (
    IMG,
    SCRIPT,
    conflicting,
    hostile_entry,
    legacy_note,
    listing_order,
    stale_settlement,
    unknown,
)

pytestmark = pytest.mark.asyncio

_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def csrf_of(html: str) -> str:
    match = _CSRF.search(html)
    assert match, "the page has no CSRF field"
    return match.group(1)


def assert_no_markup_from(html: str, *stored: str) -> None:
    """Stored text never reaches the page as markup (the pages have no script and no
    image of their own, so any ``<script`` or ``<img`` would be stored text)."""
    assert "<script" not in html.lower()
    assert "<img" not in html.lower()
    for value in stored:
        assert value not in html


def refs_in(html: str) -> list[str]:
    return re.findall(r'<td class="mono nowrap"><a href="/entry/(\d+/\d+-\d+)">', html)


async def test_every_page_carries_the_content_security_policy(
    writer: Settler, read_only: httpx.AsyncClient
) -> None:
    ref = conflicting(writer, "order-csp")
    for path in (
        "/",
        "/quarantine",
        f"/entry/{ref}",
        "/quarantine.jsonl",
        "/static/console.css",
        "/entry/0/1-1",  # not found
        "/quarantine?kind=nonsense",  # bad input
    ):
        response = await read_only.get(path)
        assert response.headers["content-security-policy"] == CSP, path
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["x-content-type-options"] == "nosniff"
    assert (await read_only.get("/entry/0/1-1")).status_code == 404
    assert (await read_only.get("/quarantine?kind=nonsense")).status_code == 400


async def test_overview_counts_records_and_quarantine_and_draws_a_chart(
    writer: Settler, read_only: httpx.AsyncClient
) -> None:
    conflicting(writer, "order-1")
    conflicting(writer, "order-2")
    stale_settlement(writer, "order-3")
    response = await read_only.get("/")
    assert response.status_code == 200
    html = response.text
    completed = re.search(r'state completed">completed</span></td><td class="num">(\d+)<', html)
    assert completed
    assert completed.group(1) == "3"
    kinds = dict(
        re.findall(
            r'\?kind=(\w+)&amp;since=[^"]*">\w+</a></td>\s*<td class="num">'
            r'(?:<span class="badge unresolved">)?(\d+)',
            html,
        )
    )
    assert kinds["conflicting_settlement"] == "2"
    assert kinds["stale_generation"] == "1"
    assert kinds["misbound"] == "0"
    assert '<svg class="chart"' in html
    bars = re.findall(r"<title>[^<]* UTC: (\d+)</title>", html)
    assert sum(map(int, bars)) == 3
    assert (await read_only.get("/?window=7d")).status_code == 200
    assert (await read_only.get("/?window=forever")).status_code == 400


async def test_list_filters_by_kind_operation_and_status(
    writer: Settler, read_only: httpx.AsyncClient, reader: AsyncSettler
) -> None:
    c = conflicting(writer, "order-c")
    s = stale_settlement(writer, "order-s")
    u = unknown(writer, "order-u")
    writer.quarantine.resolve(s, note="harmless: the second charge was voided")

    async def refs(query: str) -> set[str]:
        response = await read_only.get("/quarantine" + query)
        assert response.status_code == 200, response.text
        return set(refs_in(response.text))

    assert await refs("") == {c, s, u}
    assert await refs("?kind=stale_generation") == {s}
    assert await refs("?operation=order-u") == {u}
    assert await refs("?status=unresolved") == {c, u}
    assert await refs("?status=resolved") == {s}
    assert await refs("?since=1h") == {c, s, u}
    assert await refs("?until=2000-01-01T00:00:00") == set()
    html = (await read_only.get("/quarantine?status=resolved")).text
    assert '<span class="badge resolved">resolved</span>' in html
    assert (await read_only.get("/quarantine?since=yesterday")).status_code == 400
    # Before 1970 is "from the start" (stream ids count from it), not a Redis outage (503).
    assert await refs("?since=1969-12-31T23:59:59Z") == {c, s, u}
    assert await refs("?since=0001-01-01T00:00:00") == {c, s, u}
    assert await refs("?until=1969-12-31T23:59:59Z") == set()
    assert await refs("?since=100000000d") == {c, s, u}  # back before the year 1: all
    assert (await read_only.get("/quarantine.jsonl?since=100000000d")).status_code == 200
    # Values past what a date holds are the reader's mistake (400), not a crash (500).
    for query in (
        "/quarantine?since=99999999999d",
        "/quarantine.jsonl?since=99999999999d",
        "/quarantine?after=99999999999999999999:0/99999999999999999999-0",
        "/quarantine?after=1:0/1700000000000-18446744073709551616",  # seq past 64 bits
    ):
        response = await read_only.get(query)
        assert response.status_code == 400, (query, response.status_code)
        assert "content-security-policy" in response.headers  # the console's own page


async def test_paging_walks_every_shard_newest_first_without_gaps_or_repeats(
    writer: Settler, read_only: httpx.AsyncClient
) -> None:
    written = [conflicting(writer, f"order-{i}") for i in range(23)]
    seen: list[str] = []
    url = "/quarantine?size=10"
    pages = 0
    while url:
        html = (await read_only.get(url)).text
        seen.extend(refs_in(html))
        pages += 1
        nxt = re.search(r'<a class="button secondary" href="(\?[^"]*)">Older', html)
        url = "/quarantine" + nxt.group(1).replace("&amp;", "&") if nxt else ""
    assert pages == 3
    assert sorted(seen) == sorted(written)
    assert len(set(seen)) == len(seen)
    shards = {r.split("/")[0] for r in seen}
    assert len(shards) > 1  # the pages really span several shards
    # The console's order is the engine's across shards: the stream id's millisecond and
    # sequence, then the server time (µs: two shards' entries of one id are ordered as they
    # were written), then the shard.
    keys = [listing_order(writer.quarantine.get(r)) for r in seen]
    assert keys == sorted(keys, reverse=True)


async def test_a_resolved_only_page_stops_at_its_scan_budget_and_goes_on(
    writer: Settler, reader: AsyncSettler
) -> None:
    refs = [conflicting(writer, f"order-{i}") for i in range(12)]
    writer.quarantine.resolve(refs[0], note="oldest one settled")
    flt = _query.Filter(status="resolved")
    first = await _query.page(reader, flt, size=5, budget=4)
    assert first.entries == []
    assert first.partial
    assert first.next is not None
    found = []
    after = first.next
    while after:
        more = await _query.page(reader, flt, after=after, size=5, budget=4)
        found.extend(e.ref for e in more.entries)
        after = more.next
    assert found == [refs[0]]


async def test_an_entry_shows_tuple_record_payload_and_attempts(
    writer: Settler, read_only: httpx.AsyncClient
) -> None:
    big = {"blob": "x" * 1000}
    ref = conflicting(writer, "order-big", big)
    html = (await read_only.get(f"/entry/{ref}")).text
    entry = writer.quarantine.get(ref)
    assert entry.payload.truncated  # the writer keeps 256 bytes
    assert f"{entry.payload.size} bytes" in html
    assert entry.payload.sha256 in html
    assert f"truncated: 256 of {entry.payload.size} bytes kept" in html
    assert "<small>text</small>" in html  # cut JSON is shown as text, not parsed
    assert "x" * 1001 not in html  # never more than the quarantine holds
    assert "conflicting_settlement" in html
    assert re.search(r'<span class="state completed">completed</span>', html)
    assert "tenant:acme" in html
    attempts = writer.attempts("order-big")
    assert html.count('<td class="mono nowrap">') >= len(attempts)
    assert "QUARANTINED" in html.upper()
    assert "ch_1" in html  # the record's committed result

    small = conflicting(writer, "order-small", {"charge_id": "ch_9", "n": 1})
    html = (await read_only.get(f"/entry/{small}")).text
    assert "<small>json</small>" in html
    assert "&#34;charge_id&#34;: &#34;ch_9&#34;" in html


async def test_stored_html_and_script_are_shown_as_text(
    writer: Settler, guarded: httpx.AsyncClient
) -> None:
    ref = hostile_entry(writer)
    note = f"refunded {SCRIPT} {IMG} \x1b[2J"
    legacy_note(writer, ref, note)  # stored by an earlier version: shown as it is
    for path in ("/quarantine", f"/entry/{ref}", "/?window=1h"):
        html = (await guarded.get(path)).text
        assert_no_markup_from(html, SCRIPT, IMG)
    html = (await guarded.get(f"/entry/{ref}")).text
    assert "&lt;script&gt;window.__settle_xss = 1&lt;/script&gt;" in html
    assert "&lt;img src=x onerror=" in html
    assert '<span class="ctl" title="control character">\\x1b</span>[2J' in html
    listing = (await guarded.get("/quarantine")).text
    assert "order-&lt;img src=x onerror=" in listing
    # A filter typed into the form is echoed back as an attribute value, escaped too.
    reflected = await guarded.get("/quarantine", params={"operation": f'"><{SCRIPT}'})
    assert_no_markup_from(reflected.text, SCRIPT)
    assert 'value="&#34;&gt;&lt;&lt;script&gt;' in reflected.text


async def test_a_read_only_console_refuses_to_resolve(
    writer: Settler, read_only: httpx.AsyncClient
) -> None:
    ref = stale_settlement(writer, "order-ro")
    html = (await read_only.get(f"/entry/{ref}")).text
    assert "read-only" in html
    assert "<textarea" not in html
    assert 'name="csrf"' not in html
    page = await read_only.get("/")
    assert "set-cookie" not in page.headers  # a read-only console keeps no session
    response = await read_only.post(f"/entry/{ref}/resolve", data={"note": "x", "csrf": "x"})
    assert response.status_code == 403
    assert writer.quarantine.get(ref).resolution is None
    assert (await read_only.get("/signin")).status_code == 404


async def test_sign_in_csrf_and_resolution_record_the_principal(
    writer: Settler, guarded: httpx.AsyncClient
) -> None:
    ref = stale_settlement(writer, "order-auth")
    page = (await guarded.get(f"/entry/{ref}")).text
    assert "Sign in" in page
    assert "<textarea" not in page
    form = (await guarded.get("/signin")).text
    # Not signed in: refused even with the session's valid CSRF token.
    refused = await guarded.post(f"/entry/{ref}/resolve", data={"note": "x", "csrf": csrf_of(form)})
    assert refused.status_code == 403
    assert "Sign in to resolve" in refused.text

    assert 'type="password"' in form
    wrong = await guarded.post("/signin", data={"token": "guess", "csrf": csrf_of(form)})
    assert wrong.status_code == 403
    assert "not accepted" in wrong.text
    no_csrf = await guarded.post("/signin", data={"token": TOKEN})
    assert no_csrf.status_code == 403
    with capture_logs() as signed_in:
        ok = await guarded.post(
            f"/signin?next=/entry/{ref}", data={"token": TOKEN, "csrf": csrf_of(form)}
        )
    assert ok.status_code == 303
    assert ok.headers["location"] == f"/entry/{ref}"
    cookie = ok.headers["set-cookie"].lower()
    assert cookie.startswith("settle_console_")  # one name per namespace
    assert "httponly" in cookie
    assert "samesite=lax" in cookie  # a link from a chat keeps the session (docs/console.md)

    page = (await guarded.get(f"/entry/{ref}")).text
    assert "signed in as alice@finance" in page
    token = csrf_of(page)
    for bad in ({"note": "x"}, {"note": "x", "csrf": "forged"}, {"note": "x", "csrf": ""}):
        response = await guarded.post(f"/entry/{ref}/resolve", data=bad)
        assert response.status_code == 403
    assert writer.quarantine.get(ref).resolution is None
    assert (
        await guarded.post(f"/entry/{ref}/resolve", data={"note": " ", "csrf": token})
    ).status_code == 400

    with capture_logs() as resolved:  # typed with Enter in the form's textarea
        done = await guarded.post(
            f"/entry/{ref}/resolve", data={"note": "voided the\r\nlate charge\t", "csrf": token}
        )
    assert done.status_code == 303
    # The principal is logged as its keyed digest, under the field every event names it by.
    for logs, event in ((signed_in, "settle.web.signed_in"), (resolved, "settle.web.resolved")):
        [entry] = [e for e in logs if e["event"] == event]
        assert entry["binding_digest"] == binding_digest("alice@finance")
        assert "principal" not in entry
        assert "alice@finance" not in repr(entry)
    resolution = writer.quarantine.get(ref).resolution
    assert resolution is not None
    assert resolution.note == "[resolved by alice@finance] voided the late charge"
    page = (await guarded.get(done.headers["location"])).text
    assert "Resolved. The evidence is kept" in page
    assert "[resolved by alice@finance] voided the late charge" in page

    again = await guarded.post(f"/entry/{ref}/resolve", data={"note": "other", "csrf": token})
    page = (await guarded.get(again.headers["location"])).text
    assert "already resolved; the first note stands" in page
    assert writer.quarantine.get(ref).resolution == resolution


async def test_sign_in_never_redirects_off_the_console(guarded: httpx.AsyncClient) -> None:
    for target in ("https://evil.example/", "//evil.example/", "/\\evil.example"):
        form = (await guarded.get("/signin")).text
        response = await guarded.post(
            "/signin", params={"next": target}, data={"token": TOKEN, "csrf": csrf_of(form)}
        )
        assert response.status_code == 303
        assert response.headers["location"] == "/"


async def test_sign_out_ends_the_session(writer: Settler, guarded: httpx.AsyncClient) -> None:
    form = (await guarded.get("/signin")).text
    await guarded.post("/signin", data={"token": TOKEN, "csrf": csrf_of(form)})
    page = (await guarded.get("/")).text
    assert "signed in as" in page
    assert (await guarded.post("/signout", data={"csrf": csrf_of(page)})).status_code == 303
    assert "signed in as" not in (await guarded.get("/")).text


async def test_export_streams_the_filter_as_json_lines(
    writer: Settler, read_only: httpx.AsyncClient
) -> None:
    conflicting_refs = [conflicting(writer, f"order-{i}") for i in range(7)]
    stale = stale_settlement(writer, "order-st")
    async with read_only.stream("GET", "/quarantine.jsonl?kind=conflicting_settlement") as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/x-ndjson")
        assert "attachment" in r.headers["content-disposition"]
        lines = [json.loads(line) async for line in r.aiter_lines() if line]
    # oldest first, in the listing's order
    entries = [writer.quarantine.get(ref) for ref in conflicting_refs]
    expected = sorted(entries, key=listing_order)
    assert [line["ref"] for line in lines] == [e.ref for e in expected]
    assert stale not in {line["ref"] for line in lines}
    assert lines[0]["payload"]["json"] == {"charge_id": "ch_2"}
    everything = (await read_only.get("/quarantine.jsonl")).text.splitlines()
    assert len(everything) == 8


async def test_a_namespace_that_does_not_fit_answers_503_saying_why(
    redis_url: str, writer: Settler
) -> None:
    wrong = AsyncSettler.from_url(redis_url, namespace=writer.config.namespace, shards=8)
    try:
        async with client_for(create_app(wrong)) as client:
            response = await client.get("/quarantine")
    finally:
        await wrong.aclose()
    assert response.status_code == 503
    assert "shards" in response.text
    assert response.headers["content-security-policy"] == CSP


async def test_invisible_characters_in_a_note_are_made_visible(
    writer: Settler, read_only: httpx.AsyncClient
) -> None:
    # Settle refuses control and format characters in ids, principals and (now) notes, but a
    # note stored by an earlier version may hold any: a right-to-left override would make
    # "refunded" followed by reversed text read as something else.
    ref = conflicting(writer, "order-bidi")
    legacy_note(writer, ref, "refunded \u202edesufer ton\u200b\r\nsecond line")
    html = (await read_only.get(f"/entry/{ref}")).text
    mark = '<span class="ctl" title="control character">{}</span>'
    shown = (
        "refunded "
        + mark.format("\\u202e")
        + "desufer ton"
        + mark.format("\\u200b")
        + mark.format("\\x0d")
        + mark.format("\\x0a")  # one line, as the CLI shows it (SPEC 8)
        + "second line"
    )
    assert shown in html
    assert "\u202e" not in html


async def test_nothing_is_skipped_when_a_shard_ids_ran_ahead_of_its_clock(
    redis_url: str, writer: Settler, reader: AsyncSettler
) -> None:
    # A server whose clock stepped back (NTP, a VM restored) keeps appending after its
    # stream's last id, so that shard's entries carry ids ahead of their recorded times while
    # the other shards' do not. XSETID leaves one shard's stream as such a step would.
    refs = [conflicting(writer, f"order-{i}") for i in range(4)]
    ahead = int(refs[0].split("/")[0])
    raw = redis.Redis.from_url(redis_url)
    try:
        stream = Keys(writer.config.namespace, 4).quarantine(ahead)
        last_ms = int(raw.xinfo_stream(stream)["last-generated-id"].decode().split("-")[0])
        raw.execute_command("XSETID", stream, f"{last_ms + 3_600_000}-0")
    finally:
        raw.close()
    refs += [conflicting(writer, f"order-{i}") for i in range(4, 16)]
    entries = [writer.quarantine.get(ref) for ref in refs]
    assert any(e.shard == ahead and e.id.startswith(str(last_ms + 3_600_000)) for e in entries)
    assert len({e.shard for e in entries}) > 1
    order = sorted(entries, key=listing_order)
    newest = [e.ref for e in reversed(order)]

    # The engine's listing is cut in that order: the first k are the first k of the whole.
    for k in (1, 3, 7, 16):
        assert [e.ref for e in await reader.quarantine.list(limit=k)] == newest[:k]
        oldest = await reader.quarantine.list(limit=k, newest_first=False)
        assert [e.ref for e in oldest] == newest[::-1][:k]
    # Every page size, both ways: each entry on exactly one page, in that order.
    for size in (1, 2, 3, 5):
        for newest_first in (True, False):
            seen: list[str] = []
            after = None
            while True:
                got = await _query.page(
                    reader, _query.Filter(), after=after, size=size, newest_first=newest_first
                )
                seen += [e.ref for e in got.entries]
                if got.next is None:
                    break
                after = got.next
            assert seen == (newest if newest_first else newest[::-1]), (size, newest_first)
    exported = [e.ref async for e in _query.export_entries(reader, _query.Filter(), batch=3)]
    assert exported == newest[::-1]


async def test_stored_bytes_that_are_not_strict_json_are_shown_as_text(
    redis_url: str, writer: Settler, read_only: httpx.AsyncClient
) -> None:
    # Nesting 3000 deep used to answer the entry page and the export with a bare 500
    # (RecursionError); NaN / Infinity went into the export, which JSON readers refuse.
    uncapped = Settler.from_url(redis_url, namespace=writer.config.namespace, shards=4)
    try:
        deep = b"[" * 3000
        r = uncapped.reserve("order-deep", {"amount": 1}, principal="tenant:acme", lease=5)
        assert isinstance(r, Reserved)
        uncapped.complete(r.reservation, deep)  # the record's result
        late = uncapped.complete(r.reservation, deep + b"]")  # the quarantined payload
        assert late.quarantine_id is not None
        for n, stored in enumerate((b'{"x": NaN}', b'{"x": Infinity}', b'{"x": 1e400}')):
            conflicting(uncapped, f"order-nan-{n}", stored)
    finally:
        uncapped.close()
    page = await read_only.get(f"/entry/{late.quarantine_id}")
    assert page.status_code == 200
    assert "<small>text</small>" in page.text
    assert "[[[[" in page.text

    def refuse(name: str) -> object:
        raise AssertionError(f"{name} in the export")

    export = await read_only.get("/quarantine.jsonl")
    assert export.status_code == 200
    lines = [json.loads(line, parse_constant=refuse) for line in export.text.splitlines()]
    assert len(lines) == 4
    assert all(line["payload"]["json"] is None for line in lines)


async def test_invisible_format_characters_are_marked_as_the_cli_escapes_them(
    writer: Settler, read_only: httpx.AsyncClient
) -> None:
    # U+061C (a bidi mark) and tag characters (invisible text) were written raw; the CLI
    # escaped them. One rule now decides for both.
    hidden = "acct\u061c-42 \U000e0049\U000e0047\U000e004e\tend"
    ref = conflicting(writer, "order-tags", {"to": hidden})
    html = (await read_only.get(f"/entry/{ref}")).text
    mark = '<span class="ctl" title="control character">{}</span>'
    assert "acct" + mark.format("\\u061c") + "-42 " + mark.format("\\U000e0049") in html
    assert "\u061c" not in html
    assert not any(0xE0000 <= ord(ch) <= 0xE007F for ch in html)


async def test_an_entry_settle_cannot_decode_is_named_on_every_page_not_hidden(
    writer: Settler, read_only: httpx.AsyncClient, redis_url: str
) -> None:
    """A foreign entry (or one of a newer settle's kinds) used to answer a bare 500, then
    a 500 naming it that hid every readable entry; every page now names it, shows why
    (escaped: the why quotes the stored value), keeps the readable entries and offers no
    resolve (docs/console.md, "Entries settle cannot decode")."""
    readable = [conflicting(writer, "order-1"), stale_settlement(writer, "order-2")]
    shard = int(readable[0].split("/")[0])
    stream = Keys(writer.config.namespace, writer.config.shards).quarantine(shard)
    with redis.Redis.from_url(redis_url) as raw:
        entry_id = raw.xadd(stream, {"op": "x", "kind": "<b>from_the_future</b>"}).decode()
    foreign = f"{shard}/{entry_id}"
    why = "&lt;b&gt;from_the_future&lt;/b&gt;"
    for path in ("/", "/quarantine", "/quarantine.jsonl", f"/entry/{foreign}"):
        response = await read_only.get(path)
        assert response.status_code == 200, (path, response.text[-600:])
        assert response.headers["content-security-policy"] == CSP, path
        if path.endswith(".jsonl"):  # JSON lines, the why as it is; never read as HTML
            assert response.headers["content-type"].startswith("application/x-ndjson")
        else:
            assert "<b>from_the_future" not in response.text, path
    listing = (await read_only.get("/quarantine")).text
    assert sorted(refs_in(listing)) == sorted([*readable, foreign])
    row = listing[listing.index('<tr class="undecodable">') :]
    row = row[: row.index("</tr>")]
    assert f'href="/entry/{foreign}"' in row
    assert "cannot be decoded: " in row
    assert why in row
    assert "1 entry cannot be decoded" in (await read_only.get("/")).text
    lines = [json.loads(x) for x in (await read_only.get("/quarantine.jsonl")).text.splitlines()]
    assert sorted(line["ref"] for line in lines) == sorted([*readable, foreign])
    (marked,) = [line for line in lines if "undecodable" in line]
    assert marked["ref"] == foreign
    assert "<b>from_the_future</b>" in marked["undecodable"]  # JSON: the why as it is
    page = (await read_only.get(f"/entry/{foreign}")).text
    assert foreign in page
    assert "cannot be decoded: " in page
    assert why in page
    assert 'name="note"' not in page
    assert "/resolve" not in page
    for ref in readable:
        assert (await read_only.get(f"/entry/{ref}")).status_code == 200


async def test_a_result_that_is_not_strict_json_is_shown_as_its_text(
    writer: Settler, read_only: httpx.AsyncClient
) -> None:
    """The record's result {"x": NaN} is not JSON to settle: the entry page showed it as
    the base64 of its JSON form; it is shown as the payload is, as text, a tab kept and an
    invisible character marked."""
    r = writer.reserve("order-nan-result", {"amount": 1}, principal="tenant:acme", lease=5)
    assert isinstance(r, Reserved)
    writer.complete(r.reservation, b'{"x": NaN,\t"y": "a\x1bb"}')
    late = writer.complete(r.reservation, {"charge_id": "ch_2"})
    assert late.quarantine_id is not None
    html = (await read_only.get(f"/entry/{late.quarantine_id}")).text
    assert "eyJ4Ijog" not in html  # the base64 of the stored bytes
    assert "stored result (text)" in html
    mark = '<span class="ctl" title="control character">\\x1b</span>'
    assert "{&#34;x&#34;: NaN,\t&#34;y&#34;: &#34;a" + mark + "b&#34;}" in html


async def test_tabs_and_line_breaks_in_a_text_payload_are_kept(
    writer: Settler, read_only: httpx.AsyncClient
) -> None:
    """In a <pre> block a tab and a line break are layout, not hidden characters."""
    ref = conflicting(writer, "order-tsv", b"id\tamount\nch_2\t990\r\n")
    html = (await read_only.get(f"/entry/{ref}")).text
    assert "<small>text</small>" in html
    assert "id\tamount\nch_2\t990" in html
    assert '<span class="ctl" title="control character">\\x0d</span>' in html
    assert "\\x09" not in html


async def test_a_sign_in_on_one_console_is_no_session_of_another_mounted_with_the_same_key(
    redis_url: str, namespace: str
) -> None:
    """Two consoles in one service (``/payments`` and ``/refunds``, other namespaces), one
    ``secret_key`` from the environment, as the docs' FastAPI example has it: a sign-in to
    ``/payments`` was a session of ``/refunds`` too (same cookie, same key), which showed
    "signed in as" the payments principal and recorded resolutions under it, although the
    refunds console never granted it."""
    refunds_ns = f"{namespace}-refunds"
    payments = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
    refunds = AsyncSettler.from_url(redis_url, namespace=refunds_ns, shards=4)
    writer = Settler.from_url(redis_url, namespace=refunds_ns, shards=4)
    try:
        ref = stale_settlement(writer, "order-refund")
        shared = "one-key-for-every-console"
        app = Starlette(
            routes=[
                Mount(
                    "/payments",
                    create_app(
                        payments,
                        authorize=token_authorizer(TOKEN, "intern@support"),
                        secret_key=shared,
                    ),
                ),
                Mount(
                    "/refunds",
                    create_app(
                        refunds,
                        authorize=token_authorizer("refunds-token", "lead@refunds"),
                        secret_key=shared,
                    ),
                ),
            ]
        )
        async with client_for(app) as browser:
            form = (await browser.get("/payments/signin")).text
            signed = await browser.post(
                "/payments/signin", data={"token": TOKEN, "csrf": csrf_of(form)}
            )
            assert signed.status_code == 303
            assert "signed in as intern@support" in (await browser.get("/payments/")).text

            page = (await browser.get(f"/refunds/entry/{ref}")).text
            assert "signed in as" not in page
            assert "<textarea" not in page
            # Refused even with this console's own valid CSRF token: nobody signed in here.
            form = (await browser.get("/refunds/signin")).text
            refused = await browser.post(
                f"/refunds/entry/{ref}/resolve", data={"note": "refunded", "csrf": csrf_of(form)}
            )
            assert refused.status_code == 403
            assert writer.quarantine.get(ref).resolution is None
            # Signing in to /refunds does not sign the browser out of /payments.
            token = {"token": "refunds-token", "csrf": csrf_of(form)}
            assert (await browser.post("/refunds/signin", data=token)).status_code == 303
            assert "signed in as lead@refunds" in (await browser.get(f"/refunds/entry/{ref}")).text
            assert "signed in as intern@support" in (await browser.get("/payments/")).text
    finally:
        writer.close()
        await payments.aclose()
        await refunds.aclose()
