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
