"""What one console request costs and shows, on a real redis-server: a payload view is the
stored text (JSON re-indented at most, never re-serialized) within a bounded size, and a
quarantine page reads about as many entries as it shows, however many shards there are."""

from __future__ import annotations

import html as html_lib
import re

import httpx
import pytest

from settle import Reserved, Settler
from settle.web._text import VIEW_LIMIT
from tests.web.evidence import conflicting

pytestmark = pytest.mark.asyncio

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
