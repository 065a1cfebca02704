"""The ``settle`` command line (SPEC 8): ``demo``, ``digest``, ``doctor``, ``inspect``,
``quarantine``, ``stats``, and the companion parts' ``cursor`` (SPEC 9) and ``progress`` (SPEC 10).

Each command lives in its own module; ``main`` is the click group they hang from, so
another group is attached with one line: ``main.add_command(group)``. Exit codes: 0 ok,
1 not found / the demo saw a duplicate effect, 2 usage, 3 Redis unreachable or the
namespace missing or misconfigured, 130 interrupted (see docs/cli.md).
"""

from __future__ import annotations

import click

from settle import __version__
from settle.cli._context import OutputGroup, configure_logging
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


@click.group(cls=OutputGroup, context_settings={"help_option_names": ["-h", "--help"]})
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
