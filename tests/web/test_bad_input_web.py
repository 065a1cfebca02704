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
