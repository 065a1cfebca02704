"""The ``settle`` console script: the command line lives in ``settle.cli`` and needs the
``cli`` extra (click, rich); without it, say what to install instead of a traceback."""

from __future__ import annotations

import sys

__all__ = ["main"]

_CLI_MODULES = frozenset({"click", "rich"})


def main() -> None:
    try:
        from settle.cli import main as cli  # noqa: PLC0415 - only when the script runs
    except ModuleNotFoundError as exc:
        if exc.name not in _CLI_MODULES:
            raise
        sys.stderr.write(
            "settle: the command line needs the 'cli' extra: "
            "pip install 'settle-sdk[cli]' (or 'settle-sdk[demo]' for settle demo)\n"
        )
        raise SystemExit(2) from None
    cli()
