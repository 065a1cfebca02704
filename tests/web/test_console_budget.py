"""What one console request costs and shows, on a real redis-server: a payload view is the
stored text (JSON re-indented at most, never re-serialized) within a bounded size, and a
quarantine page reads about as many entries as it shows, however many shards there are."""

from __future__ import annotations

import html as html_lib
import re
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
import pytest_asyncio

from settle import AsyncSettler, Reserved, Settler
from settle.web import _query, create_app
from settle.web._text import VIEW_LIMIT
from tests.cli.helpers import bytes_sent
from tests.web.conftest import client_for
from tests.web.evidence import conflicting, ghost_of, listing_order

pytestmark = pytest.mark.asyncio

_REF = re.compile(r'<td class="mono nowrap"><a href="/entry/(\d+/\d+-\d+)">')

_PRE = re.compile(r'<pre class="payload">(.*?)</pre>', re.DOTALL)


def payload_of(page: str) -> str:
    """The first payload view of an entry page, as the text a browser shows."""
    match = _PRE.search(page)
    assert match, "the page shows no payload"
    return html_lib.unescape(match.group(1))


async def test_a_number_is_shown_as_it_is_stored_not_as_python_reads_it(
    writer: Settler, read_only: httpx.AsyncClient
) -> None:
    # json.loads then json.dumps showed 12345678901234567.89 as 1.2345678901234568e+16:
    # another amount than the provider sent, on the page people settle disputes from.
    ref = conflicting(writer, "order-big-number", b'{"amount":12345678901234567.89,"n":1.50}')
    page = (await read_only.get(f"/entry/{ref}")).text
    assert "<small>json</small>" in page
    shown = payload_of(page)
    assert "12345678901234567.89" in shown
    assert "1.50" in shown
    assert "e+16" not in page
    # Re-indented only: the stored text once the whitespace between tokens is dropped.
    assert "".join(shown.split()) == '{"amount":12345678901234567.89,"n":1.50}'
    assert "only the whitespace between JSON tokens differs" in page


async def test_a_payload_that_only_looks_like_null_is_shown_as_stored(
    writer: Settler, read_only: httpx.AsyncClient
) -> None:
    # A form feed is no JSON whitespace: b"\x0cnull" is not JSON, and was shown as "null".
    ref = conflicting(writer, "order-form-feed", b"\x0cnull")
    page = (await read_only.get(f"/entry/{ref}")).text
    assert "<small>text</small>" in page
    mark = '<span class="ctl" title="control character">\\x0c</span>'
    assert f'<pre class="payload">{mark}null</pre>' in page
    # JSON null itself (JSON whitespace around it) is JSON, and shown as stored.
    ref = conflicting(writer, "order-null", b" null\n")
    page = (await read_only.get(f"/entry/{ref}")).text
    assert "<small>json</small>" in page
    assert payload_of(page) == "null"


async def test_strings_and_escapes_keep_their_stored_spelling(
    writer: Settler, read_only: httpx.AsyncClient
) -> None:
    stored = b'{"to":"caf\\u00e9 \\/ ok","list":[],"o":{},"deep":[[1e2]]}'
    ref = conflicting(writer, "order-escapes", stored)
    shown = payload_of((await read_only.get(f"/entry/{ref}")).text)
    assert '"caf\\u00e9 \\/ ok"' in shown
    assert '"list": []' in shown
    assert '"o": {}' in shown
    assert "1e2" in shown
    assert "".join(shown.split()) == "".join(stored.decode().split())


def _deep_json(size: int) -> bytes:
    """Strict JSON of about ``size`` bytes, nested 150 deep many times over: indented two
    spaces a level, it is hundreds of times its own size."""
    item = b"[" * 150 + b"0" + b"]" * 150
    count = size // (len(item) + 1)
    return b"[" + b",".join([item] * count) + b"]"


async def test_a_deeply_nested_result_renders_a_page_of_bounded_size(
    redis_url: str, writer: Settler, read_only: httpx.AsyncClient
) -> None:
    # A 900 KB stored result of nested arrays rendered a 180 MB page (24 s of CPU on the
    # event loop). The view is the stored text, cut at VIEW_LIMIT with the bytes left out.
    uncapped = Settler.from_url(redis_url, namespace=writer.config.namespace, shards=4)
    try:
        result = _deep_json(900_000)
        payload = _deep_json(60_000)
        r = uncapped.reserve("order-deep-big", {"amount": 1}, principal="tenant:acme", lease=5)
        assert isinstance(r, Reserved)
        uncapped.complete(r.reservation, result)
        late = uncapped.complete(r.reservation, payload)
        assert late.quarantine_id is not None
    finally:
        uncapped.close()
    response = await read_only.get(f"/entry/{late.quarantine_id}")
    assert response.status_code == 200
    page = response.text
    # Two views (payload and stored result) of at most VIEW_LIMIT each, and the rest.
    assert len(response.content) < 2 * VIEW_LIMIT + 64 * 1024
    views = [html_lib.unescape(v) for v in _PRE.findall(page)]
    assert len(views) == 2
    shown_payload, shown_result = views
    # The payload fits as it is stored, but not re-indented (150 levels): stored text.
    assert shown_payload == payload.decode()
    assert "bytes more" not in page.split("stored result")[0]
    # The result is cut: a prefix of the stored text, and the rest counted.
    assert result.decode().startswith(shown_result)
    assert len(shown_result) > VIEW_LIMIT // 2
    more = len(result) - len(shown_result)
    assert f"{more} bytes more" in page


async def test_an_entry_page_of_a_non_ascii_result_stays_within_its_bound(
    redis_url: str, writer: Settler, read_only: httpx.AsyncClient
) -> None:
    # VIEW_LIMIT was counted in characters: a stored result of 900 KB of "€" (three bytes
    # each) rendered a view of 768 KiB, three times the 256 KiB the page promises.
    uncapped = Settler.from_url(redis_url, namespace=writer.config.namespace, shards=4)
    try:
        result = ("€" * 300_000).encode()
        r = uncapped.reserve("order-euros", {"amount": 1}, principal="tenant:acme", lease=5)
        assert isinstance(r, Reserved)
        uncapped.complete(r.reservation, result)
        late = uncapped.complete(r.reservation, b"late")
        assert late.quarantine_id is not None
    finally:
        uncapped.close()
    response = await read_only.get(f"/entry/{late.quarantine_id}")
    assert response.status_code == 200
    assert len(response.content) < VIEW_LIMIT + 64 * 1024
    shown = html_lib.unescape(_PRE.findall(response.text)[1])
    assert result.decode().startswith(shown)
    assert f"{len(result) - len(shown.encode())} bytes more" in response.text


# -- what a page reads ---------------------------------------------------------------------

SHARDS = 16
PAYLOAD = 16 * 1024


@pytest.fixture
def sharded(redis_url: str, namespace: str) -> Iterator[Settler]:
    """A namespace of 16 shards holding 16 KiB payloads (the fixtures' writer keeps 256
    bytes on 4 shards, too little to see what a page reads)."""
    s = Settler.from_url(redis_url, namespace=namespace, shards=SHARDS)
    s.check()
    yield s
    s.close()


def ghosts(settler: Settler, count: int) -> list[str]:
    """``count`` responses of operations that have no record, each a quarantine entry with
    a 16 KiB payload, spread over every shard; their refs."""
    refs = [ghost(settler, str(n)) for n in range(count)]
    assert len({r.split("/")[0] for r in refs}) == SHARDS
    return refs


def ghost(settler: Settler, name: str) -> str:
    """A response of operation ``ghost-<name>``, which has no record: a quarantine entry
    with a 16 KiB payload; its ref."""
    late = ghost_of(name)
    settled = settler.complete(late, b"x" * PAYLOAD)
    assert settled.quarantine_id is not None
    return settled.quarantine_id


def read_bound(entries: int) -> int:
    """What reading ``entries`` entries may cost: their payloads and 4 KiB each besides."""
    return entries * (PAYLOAD + 4096)


@pytest_asyncio.fixture
async def sharded_reader(
    redis_url: str, namespace: str, sharded: Settler
) -> AsyncIterator[AsyncSettler]:
    del sharded  # the namespace exists before the console opens it
    s = AsyncSettler.from_url(redis_url, namespace=namespace, shards=SHARDS)
    yield s
    await s.aclose()


@pytest_asyncio.fixture
async def sharded_console(sharded_reader: AsyncSettler) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(create_app(sharded_reader, overview_limit=20)) as client:
        yield client


async def test_a_page_reads_about_as_many_entries_as_it_shows(
    redis_url: str, sharded: Settler, sharded_console: httpx.AsyncClient
) -> None:
    # A page read `size + 1` entries, payloads included, from EVERY shard and kept one
    # page of them: 16 shards and a page of 200 decoded 3,182 entries (198 MiB) to show
    # 200. A page of N now reads at most 2(N + 1) + one entry a shard.
    refs = ghosts(sharded, 13 * SHARDS)
    entries = [sharded.quarantine.get(ref) for ref in refs]
    newest = [e.ref for e in sorted(entries, key=listing_order, reverse=True)]
    shown: list[str] = []
    href = "/quarantine?size=10"
    for _ in range(3):
        with bytes_sent(redis_url) as sent:
            page = await sharded_console.get(href)
        assert page.status_code == 200
        assert sent[0] <= read_bound(2 * (11 + SHARDS) + SHARDS), sent[0]
        shown += _REF.findall(page.text)
        href = "/quarantine" + html_lib.unescape(
            re.findall(r'href="(\?[^"]+)">Older', page.text)[0]
        )
    assert shown == newest[:30]  # every entry once, in the listing's order


async def test_a_status_filter_stops_at_its_budget_and_goes_on_from_there(
    redis_url: str, sharded: Settler, sharded_reader: AsyncSettler
) -> None:
    # status=resolved read `size + 1` entries from every shard per step and checked the
    # budget after each: 16 shards read 704 entries for a budget of 40. status=unresolved
    # was filtered in the script, which read every entry of every shard for one page.
    refs = ghosts(sharded, 13 * SHARDS)
    for ref in refs[::2]:
        sharded.quarantine.resolve(ref, note="harmless")
    for status, matching in (("resolved", refs[::2]), ("unresolved", refs[1::2])):
        flt = _query.Filter(status=status)
        found: list[str] = []
        scanned = 0
        after = None
        while True:
            with bytes_sent(redis_url) as sent:
                got = await _query.page(sharded_reader, flt, after=after, size=100, budget=40)
            assert got.scanned <= 40
            assert sent[0] <= read_bound(2 * (40 + SHARDS) + SHARDS), sent[0]
            found += [e.ref for e in got.entries]
            scanned += got.scanned
            if got.next is None:
                break
            assert got.partial  # it stopped at its budget, and says so
            after = got.next
        assert sorted(found) == sorted(matching)
        assert scanned == len(refs)  # every entry read once over the pages


async def test_a_page_that_read_every_entry_within_its_budget_is_the_last(
    sharded: Settler, sharded_reader: AsyncSettler
) -> None:
    # A status page that read the last entry just as its budget ran out said it stopped
    # early ("Read 40 entries to find these") and linked to an Older page that was empty:
    # it took a listing of exactly what it still could read for one with more to come.
    refs = ghosts(sharded, 40)
    for ref in refs[:3]:
        sharded.quarantine.resolve(ref, note="harmless")
    for status, matching in (("unresolved", refs[3:]), ("resolved", refs[:3])):
        for newest_first in (True, False):
            got = await _query.page(
                sharded_reader,
                _query.Filter(status=status),
                size=100,
                budget=40,
                newest_first=newest_first,
            )
            assert sorted(e.ref for e in got.entries) == sorted(matching)
            assert got.scanned == 40
            assert (got.next, got.partial) == (None, False)
    # One entry more than the budget: the page stops, and the next one holds the rest.
    extra = ghost(sharded, "extra")
    got = await _query.page(sharded_reader, _query.Filter(status="unresolved"), size=100, budget=40)
    assert got.partial
    assert got.next is not None
    rest = await _query.page(
        sharded_reader, _query.Filter(status="unresolved"), after=got.next, size=100, budget=40
    )
    assert sorted(e.ref for e in got.entries + rest.entries) == sorted([*refs[3:], extra])
    assert (rest.next, rest.partial) == (None, False)


async def test_the_overview_reads_its_limit_in_total_not_per_shard(
    redis_url: str, sharded: Settler, sharded_console: httpx.AsyncClient
) -> None:
    # overview_limit=20 read 20 entries from each of 16 shards (320) to count 20.
    ghosts(sharded, 13 * SHARDS)
    with bytes_sent(redis_url) as sent:
        page = await sharded_console.get("/?window=1h")
    assert page.status_code == 200
    assert "Counted the newest 20 entries of the window only." in page.text
    assert sent[0] <= read_bound(2 * 20 + SHARDS), sent[0]


BIG = 64 * 1024  # quarantine_payload_bytes' default: what a busy quarantine keeps per entry


async def test_the_overview_counts_headers_and_reads_no_payload(
    redis_url: str, sharded: Settler, sharded_reader: AsyncSettler
) -> None:
    # The overview listed up to overview_limit (10 000) entries WITH their payloads to count
    # kinds and times: 200 entries of 64 KiB sent 12.5 MiB for one page view, and 10 000
    # would have been 640 MiB built in Redis and decoded by the console. It reads headers.
    refs = [sharded.complete(ghost_of(f"big-{n}"), b"x" * BIG).quarantine_id for n in range(170)]
    refs += [conflicting(sharded, f"order-big-{n}", b"y" * BIG) for n in range(30)]
    for ref in refs[::3]:
        assert ref is not None
        sharded.quarantine.resolve(ref, note="checked")
    assert len({str(ref).split("/")[0] for ref in refs}) == SHARDS
    payloads = len(refs) * BIG
    async with client_for(create_app(sharded_reader)) as console:  # overview_limit 10 000
        with bytes_sent(redis_url) as sent:
            page = await console.get("/?window=1h")
    assert page.status_code == 200
    assert "Counted the newest" not in page.text  # every entry of the window counted
    assert sent[0] < payloads // 50, sent[0]  # headers: about 100 bytes an entry
    # The counts are those of a full listing, also when the limit cuts the window short.
    now = await _query.server_now(sharded_reader)
    for limit in (10_000, 50):
        data = await _query.overview(
            sharded_reader, window="1h", now=now, record_limit=10_000, entry_limit=limit
        )
        full = await sharded_reader.quarantine.list(since=data.since, limit=limit)
        assert data.sample == len(full) == min(limit, len(refs))
        by_kind = {k: {"unresolved": 0, "resolved": 0} for k in data.by_kind}
        for e in full:
            by_kind[e.kind.value]["resolved" if e.resolution else "unresolved"] += 1
        assert data.by_kind == by_kind
        assert by_kind["unknown_operation"]["resolved"] > 0
        assert by_kind["conflicting_settlement"]["unresolved"] > 0
        step = data.buckets[1][0] - data.buckets[0][0]
        times = [start for start, _ in data.buckets]
        counts = [0] * len(times)
        for e in full:
            counts[min(max(int((e.at - data.since) / step), 0), len(times) - 1)] += 1
        assert data.buckets == list(zip(times, counts, strict=True))
        assert sum(counts) == len(full)


async def test_quarantine_headers_are_the_listing_without_the_rest(
    sharded: Settler, sharded_reader: AsyncSettler
) -> None:
    # Headers list the entries `list` lists, with the same filters, order and limit.
    refs = ghosts(sharded, 2 * SHARDS)
    refs += [conflicting(sharded, f"order-h-{n}", b"late") for n in range(5)]
    for ref in refs[::4]:
        sharded.quarantine.resolve(ref, note="checked")
    for kw in (
        {},
        {"newest_first": False, "limit": 7},
        {"kind": "conflicting_settlement"},
        {"unresolved": True, "limit": 20},
        {"operation_id": "order-h-3"},
    ):
        listed = await sharded_reader.quarantine.list(**kw)  # type: ignore[arg-type]
        headers = await sharded_reader.quarantine.headers(**kw)  # type: ignore[arg-type]
        assert [(h.ref, h.kind, h.at, h.resolved) for h in headers] == [
            (e.ref, e.kind, e.at, e.resolution is not None) for e in listed
        ]
        assert not any(hasattr(h, "payload") for h in headers)


def _copies(settler: Settler, ref: str, times: list[tuple[int, int]]) -> list[str]:
    """Copies of entry ``ref`` on another shard (its stream empty), written by hand as
    settle writes an entry: each a stream id of ``ms`` and a server time of ``us`` (they
    differ where the server's clock stepped back: a stream's ids never go back). The
    original goes. Their refs."""
    shard, entry_id = ref.split("/")
    keys = settler._core.keys
    raw = settler.client
    ((_, fields),) = raw.xrange(keys.quarantine(int(shard)), entry_id, entry_id)
    raw.xdel(keys.quarantine(int(shard)), entry_id)
    other = (int(shard) + 1) % SHARDS
    refs = []
    for n, (ms, us) in enumerate(times):
        copy = {**fields, b"aid": f"w-copy-{n}".encode(), b"at": ms, b"us": us}
        added = raw.xadd(keys.quarantine(other), copy, id=f"{ms}-{n}")
        refs.append(f"{other}/{added.decode()}")
    return refs


async def test_the_overview_counts_the_window_by_each_entrys_server_time(
    sharded: Settler, sharded_reader: AsyncSettler
) -> None:
    # The window is by each entry's server time, and each header counted in the bucket of
    # it: an entry older than the window is not counted; one late in a 5-minute bucket
    # stays in it; one whose server time fell before the window (the clock stepped back,
    # its id did not) is not counted either.
    now = await _query.server_now(sharded_reader)
    since = now - timedelta(hours=1)
    ms = int(since.timestamp() * 1000)
    minute = 60_000
    refs = _copies(
        sharded,
        ghost(sharded, "timed"),
        [
            (ms - 60 * minute, (ms - 60 * minute) * 1000),  # an hour before the window
            (ms + 10 * minute, (ms - 10 * minute) * 1000),  # server time before the window
            (ms + 19 * minute, (ms + 19 * minute) * 1000 + 999),  # bucket 3, near its end
        ],
    )
    sharded.quarantine.resolve(refs[2], note="checked")
    headers = await sharded_reader.quarantine.headers(since=since)
    assert [h.ref for h in headers] == refs[:1:-1]
    # the server time to the microsecond (us), in a header as in the entry
    listed = await sharded_reader.quarantine.list(since=since)
    assert [h.at for h in headers] == [e.at for e in listed]
    assert headers[0].at.microsecond % 1000 == 999
    data = await _query.overview(
        sharded_reader, window="1h", now=now, record_limit=100, entry_limit=100
    )
    assert data.sample == 1
    assert data.by_kind["unknown_operation"] == {"unresolved": 0, "resolved": 1}
    assert [count for _, count in data.buckets] == [0, 0, 0, 1, *[0] * 8]


# -- links that say where the rest is --------------------------------------------------------


async def test_an_entry_page_says_when_the_operation_has_more_entries_than_it_lists(
    writer: Settler, read_only: httpx.AsyncClient
) -> None:
    # The other entries of the operation were cut at 20 without a word.
    refs = late_refs(writer, "order-many", 23)
    page = (await read_only.get(f"/entry/{refs[0]}")).text
    assert "Showing the newest 20; there are more" in page
    assert '<a href="/quarantine?operation=order-many">every entry of this operation</a>' in page
    # One more than shown is no longer silent, and fewer than the cut says nothing.
    page = (await read_only.get(f"/entry/{refs[-1]}")).text
    assert "there are more" in page
    few = conflicting(writer, "order-few")
    assert "there are more" not in (await read_only.get(f"/entry/{few}")).text


async def test_the_older_link_keeps_the_window_a_duration_ago_resolved_to(
    writer: Settler, reader: AsyncSettler, read_only: httpx.AsyncClient
) -> None:
    # since=6s was counted again from the server's clock on every page: following "Older"
    # a few seconds later showed another window than the first page's.
    first, older, params = await two_pages(writer, read_only, "since=1h")
    assert "1h" not in params["since"]
    pinned = datetime.fromisoformat(params["since"][0])
    now = await _query.server_now(reader)
    assert abs((now - timedelta(hours=1) - pinned).total_seconds()) < 30
    assert form_value(first.text, "since") == "1h"  # the form still says what was typed
    assert len(_REF.findall(first.text)) + len(_REF.findall(older.text)) == 12


async def test_an_entry_page_with_exactly_twenty_others_says_nothing_more(
    writer: Settler, read_only: httpx.AsyncClient
) -> None:
    refs = late_refs(writer, "order-21", 21)
    for ref in (refs[0], refs[-1]):  # the oldest and the newest: 20 others either way
        page = (await read_only.get(f"/entry/{ref}")).text
        assert len(re.findall(r'href="/entry/', page)) >= 20
        assert "there are more" not in page


async def test_the_older_link_keeps_an_until_a_duration_ago_too(
    writer: Settler, read_only: httpx.AsyncClient
) -> None:
    first, older, params = await two_pages(writer, read_only, "until=0s")
    assert datetime.fromisoformat(params["until"][0]).tzinfo is not None
    assert len(_REF.findall(first.text)) + len(_REF.findall(older.text)) == 12


def late_refs(writer: Settler, operation_id: str, count: int) -> list[str]:
    """``count`` late successes of one completed operation: its quarantine entries' refs."""
    r = writer.reserve(operation_id, {"amount": 990}, principal="tenant:acme", lease=5)
    assert isinstance(r, Reserved)
    writer.complete(r.reservation, {"charge_id": "ch_1"})
    refs = []
    for n in range(count):
        late = writer.complete(r.reservation, {"charge_id": f"ch_late_{n}"})
        assert late.quarantine_id is not None
        refs.append(late.quarantine_id)
    return refs


async def two_pages(
    writer: Settler, read_only: httpx.AsyncClient, query: str
) -> tuple[httpx.Response, httpx.Response, dict[str, list[str]]]:
    """12 entries listed 10 a page with filter ``query``: the first page, the one its
    Older link leads to, and that link's parameters."""
    for n in range(12):
        conflicting(writer, f"order-{query}-{n}")
    first = await read_only.get(f"/quarantine?{query}&size=10")
    links = re.findall(r'href="(\?[^"]+)">Older', first.text)
    assert len(links) == 1
    older = await read_only.get("/quarantine" + html_lib.unescape(links[0]))
    return first, older, parse_qs(urlparse(html_lib.unescape(links[0])).query)


def form_value(page: str, name: str) -> str:
    match = re.search(rf'name="{name}" value="([^"]*)"', page)
    assert match
    return html_lib.unescape(match.group(1))
