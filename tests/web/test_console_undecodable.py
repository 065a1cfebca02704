"""An entry of the quarantine stream this settle version cannot decode (another version or
another program wrote it: a field missing, a kind it does not know, an operation id that is
no UTF-8) is a marked row of the console's list, not a 500 that hides every other entry; its
own page says what could be read and offers no resolve; filters, paging, the status count
and the export stay right around it. Real redis-server, the console app; the page in a real
headless Chromium against ``settle web``."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By

from settle import Settler
from settle._core.keys import Keys, shard_of
from tests.web.conftest import TOKEN
from tests.web.evidence import conflicting, stale_settlement
from tests.web.server import settle_web
from tests.web.test_browser import chromium, no_script_ran

__all__ = ["chromium"]


def _foreign(writer: Settler, shard: int, *fields: bytes | str) -> str:
    """XADD an entry to ``shard``'s quarantine stream as another program would; its ref."""
    keys = Keys(writer.config.namespace, writer.config.shards)
    it = iter(fields)
    entry_id = writer.client.xadd(keys.quarantine(shard), dict(zip(it, it, strict=True)))
    return f"{shard}/{entry_id.decode()}"


def _refs(html: str) -> list[str]:
    return re.findall(r'<td class="mono nowrap"><a href="/entry/([0-9]+/[0-9-]+)">', html)


@pytest.fixture
def mixed(writer: Settler) -> dict[str, str]:
    """Three good entries and three another program wrote, interleaved in time."""
    refs = {"good1": conflicting(writer, "order-1")}
    on_its_shard = shard_of("order-x", writer.config.shards)  # the operation filter's shard
    refs["nokind"] = _foreign(writer, on_its_shard, "op", "order-x", "action", "complete")
    refs["good2"] = stale_settlement(writer, "order-2")
    refs["notutf8"] = _foreign(writer, 1, "op", b"order-\xff\xfe", "kind", "misbound", "v", "9")
    refs["future"] = _foreign(writer, 2, "op", "order-f", "kind", "future_kind", "v", "2")
    refs["good3"] = conflicting(writer, "order-3")
    return refs


@pytest.mark.asyncio
async def test_the_list_shows_every_readable_entry_and_marks_the_others(
    read_only: httpx.AsyncClient, mixed: dict[str, str]
) -> None:
    page = await read_only.get("/quarantine")
    assert page.status_code == 200, page.text[-600:]
    shown = _refs(page.text)
    assert set(shown) == set(mixed.values())
    assert page.text.count('<tr class="undecodable">') == 3
    assert "cannot be decoded: no field &#39;kind&#39;" in page.text
    assert "future_kind" in page.text  # why: the kind this version does not know
    assert "order-x" in page.text  # the operation id of a mark, when readable


@pytest.mark.asyncio
async def test_paging_and_status_filter_keep_every_entry_once(
    read_only: httpx.AsyncClient, mixed: dict[str, str], writer: Settler
) -> None:
    more = [conflicting(writer, f"order-more-{i}") for i in range(6)]
    more.append(_foreign(writer, 3, "op", "order-last", "kind", "misbound"))
    seen: list[str] = []
    href: str | None = "/quarantine?size=10"
    while href is not None:  # the pages' own "Older" links
        page = await read_only.get(href.replace("&amp;", "&"))
        assert page.status_code == 200, page.text[-600:]
        seen += _refs(page.text)
        older = re.search(r'<a class="button secondary" href="([^"]+)">Older', page.text)
        href = None if older is None else "/quarantine" + older.group(1)
    assert sorted(seen) == sorted([*mixed.values(), *more])  # each once, none lost
    # One mark with a resolution stored (its other version resolved it): status counts it.
    shard, entry_id = more[-1].split("/")
    keys = Keys(writer.config.namespace, writer.config.shards)
    writer.client.hset(keys.resolutions(int(shard)), entry_id, '{"note": "ok", "at": 1}')
    unresolved = await read_only.get("/quarantine?status=unresolved&size=50")
    assert unresolved.status_code == 200
    assert sorted(_refs(unresolved.text)) == sorted([*mixed.values(), *more[:-1]])
    resolved = await read_only.get("/quarantine?status=resolved")
    assert resolved.status_code == 200
    assert _refs(resolved.text) == [more[-1]]
    by_op = await read_only.get("/quarantine?operation=order-x")
    assert by_op.status_code == 200
    assert _refs(by_op.text) == [mixed["nokind"]]
    by_kind = await read_only.get("/quarantine?kind=misbound")
    assert by_kind.status_code == 200
    assert _refs(by_kind.text) == [more[-1], mixed["notutf8"]]  # newest first


@pytest.mark.asyncio
async def test_export_marks_the_undecodable_lines_and_keeps_the_rest(
    read_only: httpx.AsyncClient, mixed: dict[str, str]
) -> None:
    got = await read_only.get("/quarantine.jsonl")
    assert got.status_code == 200, got.text[-600:]

    lines = [json.loads(line) for line in got.text.splitlines()]
    assert sorted(line["ref"] for line in lines) == sorted(mixed.values())
    marked = {line["ref"]: line for line in lines if "undecodable" in line}
    assert set(marked) == {mixed["nokind"], mixed["notutf8"], mixed["future"]}
    assert marked[mixed["notutf8"]]["operation_id"] is None


@pytest.mark.asyncio
async def test_an_undecodable_entry_page_says_what_was_read_and_cannot_be_resolved(
    guarded: httpx.AsyncClient, mixed: dict[str, str], writer: Settler
) -> None:
    ref = mixed["future"]
    page = await guarded.get(f"/entry/{ref}")
    assert page.status_code == 200, page.text[-600:]
    assert "cannot be decoded" in page.text
    assert "future_kind" in page.text
    assert "order-f" in page.text
    assert 'name="note"' not in page.text  # no resolve form
    signin = await guarded.get("/signin")
    csrf = re.search(r'name="csrf" value="([^"]+)"', signin.text)
    assert csrf is not None
    done = await guarded.post("/signin", data={"token": TOKEN, "csrf": csrf.group(1)})
    assert done.status_code == 303
    entry = await guarded.get(f"/entry/{ref}")
    assert 'name="note"' not in entry.text
    token = re.search(r'name="csrf" value="([^"]+)"', entry.text)
    assert token is not None
    refused = await guarded.post(
        f"/entry/{ref}/resolve", data={"note": "looks fine", "csrf": token.group(1)}
    )
    assert refused.status_code == 409
    assert "Nothing was resolved" in refused.text
    shard, entry_id = ref.split("/")
    keys = Keys(writer.config.namespace, writer.config.shards)
    assert writer.client.hget(keys.resolutions(int(shard)), entry_id) is None


def test_a_dispute_settler_sees_the_list_and_the_mark_in_a_real_browser(
    redis_url: str, writer: Settler, mixed: dict[str, str], chromium: webdriver.Chrome
) -> None:
    driver = chromium
    with settle_web("--redis-url", redis_url, "--namespace", writer.config.namespace) as url:
        driver.get(url + "/quarantine")
        rows = driver.find_elements(By.CSS_SELECTOR, "table.entries tbody tr")
        assert len(rows) == 6, driver.page_source[-800:]
        marks = driver.find_elements(By.CSS_SELECTOR, "tr.undecodable td.problem")
        assert len(marks) == 3
        assert any("no field 'kind'" in m.text for m in marks)
        driver.find_element(By.LINK_TEXT, mixed["notutf8"]).click()
        assert "cannot be decoded" in driver.find_element(By.CSS_SELECTOR, ".notice.error").text
        assert "(unreadable)" not in driver.page_source
        assert driver.find_elements(By.ID, "note") == []
        no_script_ran(driver)


@pytest.mark.asyncio
async def test_the_overview_counts_the_undecodable_entries_apart(
    read_only: httpx.AsyncClient, mixed: dict[str, str]
) -> None:
    page = await read_only.get("/")
    assert page.status_code == 200, page.text[-600:]
    assert "3 entries cannot be decoded" in page.text  # no time field, no kind, or unknown


@pytest.mark.asyncio
async def test_an_entry_page_lists_an_undecodable_entry_of_its_operation_as_marked(
    read_only: httpx.AsyncClient, writer: Settler
) -> None:
    """The entry page's "other entries of this operation" read them all: one of them that
    settle cannot decode made the readable entry's own page a 500."""
    ref = conflicting(writer, "order-9")
    shard = shard_of("order-9", writer.config.shards)
    foreign = _foreign(writer, shard, "op", "order-9", "kind", "future_kind")
    page = await read_only.get(f"/entry/{ref}")
    assert page.status_code == 200, page.text[-600:]
    assert f'href="/entry/{foreign}"' in page.text
    assert "cannot be decoded" in page.text


@pytest.mark.asyncio
async def test_an_undecodable_entry_with_a_huge_value_shows_its_first_bytes(
    read_only: httpx.AsyncClient, writer: Settler
) -> None:
    """Its page shows each stored value's first 512 bytes and the size (untested: a mutant
    that kept every byte lived); a 4 MiB response another program stored made a 4 MiB
    page. A byte that is no UTF-8 is shown as ``\\xNN``."""
    huge = b"\xff" + b"A" * (4 * 1024 * 1024)
    ref = _foreign(writer, 0, "op", "order-huge", "kind", "future_kind", "response", huge)
    page = await read_only.get(f"/entry/{ref}")
    assert page.status_code == 200, page.text[-600:]
    assert len(page.text) < 64 * 1024
    assert "\\xff" + "A" * 511 + f" ... ({len(huge)} bytes)" in page.text
    assert "A" * 512 not in page.text
    listing = await read_only.get("/quarantine")
    assert len(listing.text) < 64 * 1024
