"""The ``settle`` command line (SPEC 8): ``demo``, ``digest``, ``doctor``, ``inspect``,
``quarantine``, ``stats``, and the companion parts' ``cursor`` (SPEC 9) and ``progress`` (SPEC 10).

Each command lives in its own module; ``main`` is the click group they hang from, so
another group is attached with one line: ``main.add_command(group)``. Exit codes: 0 ok,
1 not found / the demo saw a duplicate effect, 2 usage, 3 Redis unreachable or the
namespace missing or misconfigured, 130 interrupted (see docs/cli.md).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from settle import __version__
from settle._exit import EXIT_OK
from settle.cli._context import EXIT_WHEN_READER_STOPS, configure_logging
from settle.cli.cursor import cursor
from settle.cli.demo import demo
from settle.cli.digest import digest
from settle.cli.doctor import doctor
from settle.cli.inspect import inspect
from settle.cli.progress import progress
from settle.cli.quarantine import quarantine
from settle.cli.stats import stats
from settle.cli.web import web

__all__ = ["main"]


class _Settle(click.Group):
    """The ``settle`` group: output read by a program that stopped reading (``settle
    inspect ... | head -3``, ``export | head -1``) ends the command quietly with exit 0, as
    ``git log | head`` does, in every command. click's own handling exits 1, the code the
    docs give to "not found", and a script under ``set -o pipefail`` took it for that."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            # What is still buffered goes nowhere, and the flush at exit does not fail.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(ctx.meta.get(EXIT_WHEN_READER_STOPS, EXIT_OK))


@click.group(cls=_Settle, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="settle")
@click.option(
    "-v",
    "--verbose",
    count=True,
    help="Show settle's log events on stderr: -v warnings, -vv info, -vvv debug.",
)
def main(verbose: int) -> None:
    """settle: retried operations, settled once.

    Connection options (--redis-url, --namespace, --shards) go after the command and
    default to SETTLE_REDIS_URL / SETTLE_NAMESPACE / SETTLE_SHARDS.
    """
    configure_logging(verbose)


main.add_command(demo)
main.add_command(digest)
main.add_command(doctor)
main.add_command(inspect)
main.add_command(quarantine)
main.add_command(stats)
main.add_command(cursor)
main.add_command(progress)
main.add_command(web)
