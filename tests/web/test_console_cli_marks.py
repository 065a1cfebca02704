"""The console and the CLI mark the same stored characters the same way (SPEC 8, docs/cli.md,
docs/console.md): one CLI branch changed the shared escape of a C1 control from ``\\x85`` to
``\\u0085`` (``\\x`` now also names a stored byte that is not UTF-8 text), and the console
shows stored text through the same rule. An operator comparing the page with
``settle quarantine show`` for the same entry reads the same marks."""

from __future__ import annotations

import httpx
import pytest

from settle import Settler
from tests.cli.conftest import settle
from tests.web.evidence import conflicting, legacy_note

pytestmark = pytest.mark.asyncio

#: A note an earlier version could store: a C1 control (NEL), ESC, a bidi override.
NOTE = "paid \u0085 twice \x1b[2J \u202e"
MARKS = ("\\u0085", "\\x1b", "\\u202e")


async def test_a_c1_control_is_marked_alike_on_the_page_and_in_the_cli(
    writer: Settler, read_only: httpx.AsyncClient, redis_url: str, namespace: str
) -> None:
    ref = conflicting(writer, "order-c1")
    legacy_note(writer, ref, NOTE)
    html = (await read_only.get(f"/entry/{ref}")).text
    shown = settle("quarantine", "show", ref, "--redis-url", redis_url, "--namespace", namespace)
    assert shown.returncode == 0, shown.stderr
    for mark in MARKS:
        assert f'title="control character">{mark}</span>' in html, mark
        assert mark in shown.stdout, mark
    for page in (html, shown.stdout):
        assert "\\x85" not in page  # a stored byte's escape, never a character's
        assert "\u0085" not in page
        assert "\u202e" not in page


async def test_the_footer_names_both_marks(read_only: httpx.AsyncClient) -> None:
    """Every page's footer said control characters appear as ``\\xNN``; a C1 control is
    ``\\u0085`` since the shared escape changed, and a bidi override was always ``\\u202e``."""
    html = (await read_only.get("/")).text
    assert '<span class="ctl">\\xNN</span> or <span class="ctl">\\uNNNN</span>' in html
