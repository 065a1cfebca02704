"""The console answers a bad query parameter with 400, never 500.

A page size of thousands of digits let int()'s ValueError out of the page handler: a 500
("Internal Server Error") for what is a malformed link.
"""

from __future__ import annotations

import httpx
import pytest


@pytest.mark.asyncio
async def test_a_page_size_of_many_digits_is_a_400(read_only: httpx.AsyncClient) -> None:
    response = await read_only.get(f"/quarantine?size={'9' * 5000}")
    assert response.status_code == 400
    assert "size must be one of" in response.text


@pytest.mark.asyncio
async def test_a_page_cursor_with_a_trailing_line_feed_is_a_400(
    read_only: httpx.AsyncClient,
) -> None:
    """The cursor pattern's ``$`` matched before a final newline, so ``...-0%0A`` was read
    as a page cursor: a malformed link must say so, as any other one does."""
    response = await read_only.get("/quarantine?after=1764000000000000:0/1764000000000-0%0A")
    assert response.status_code == 400
    assert "is not a page cursor" in response.text


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "size", ["\u00b2", "\u00b9\u2070\u2070", "\u0665\u0660", "\u096b\u0966", "\uff15\uff10"]
)
async def test_a_page_size_in_other_digits_is_a_400(
    read_only: httpx.AsyncClient, size: str
) -> None:
    r"""``str.isdigit()`` is true of superscripts and of every script's digits:
    ``size=\u00b2`` passed the check and int() refused it (a 500), and ``size=\u0665\u0660``
    (Arabic-Indic) was read as 50. A page size is ASCII digits, as the page's own links
    write it."""
    response = await read_only.get("/quarantine", params={"size": size})
    assert response.status_code == 400
    assert "size must be one of" in response.text
