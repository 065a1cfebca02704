"""The runnable examples of ``docs/http-endpoints.md``, by section."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).parents[2] / "docs" / "http-endpoints.md"


def section_blocks(heading: str) -> list[str]:
    """The ```python blocks of the ``## heading`` section (up to the next ``## ``)."""
    sections = re.split(r"^## ", DOC.read_text(), flags=re.MULTILINE)
    [section] = [s for s in sections if s.startswith(heading + "\n")]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
