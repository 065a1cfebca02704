"""``settle progress``: inspect delivery progress. Runnable alone as
``python -m settle.cli.progress show CONSUMER``; the main ``settle`` CLI attaches ``progress``.
"""

from __future__ import annotations

import json

import click

from settle._exit import EXIT_FAILED
from settle.cli._context import (
    Connection,
    EnvOption,
    OutputGroup,
    checked_namespace,
    companion_client,
    errors_as_exit_codes,
    fail,
    redis_timeout_option,
)
from settle.cli._render import Listing, Whole, console, fields_table, print_table
from settle.progress._sync import ProgressStore
from settle.progress.identity import DeliveryId
from settle.progress.models import Progress

__all__ = ["progress"]


def _ids(ids: tuple[DeliveryId, ...], limit: int = 12) -> str:
    if not ids:
        return "-"
    shown = ", ".join(d.value for d in ids[:limit])
    return shown + (f" (+{len(ids) - limit} more)" if len(ids) > limit else "")


def _table(p: Progress) -> Listing:
    pf = p.provider_floor
    rows = [
        ("incarnation", p.scope.incarnation),
        ("floor", p.floor.value if p.floor else "- (nothing applied in order yet)"),
        ("applied above floor", _ids(p.applied_above_floor)),
        ("dead-lettered above floor", _ids(p.dead_lettered_above_floor)),
        ("gaps", _ids(p.gaps)),
        (
            "provider floor",
            "not observed yet"
            if pf is None
            else (
                f"last delivered {pf.last_delivered or '-'}, oldest pending "
                f"{pf.oldest_pending or '-'}, {pf.pending} pending "
                f"(observed {pf.observed_at.isoformat(timespec='seconds')})"
            ),
        ),
        ("replay from", f"after {p.replay_from.after}" if p.replay_from.after else "the start"),
        ("open settle intents", _ids(tuple(i.delivery for i in p.intents))),
        ("deferred", _ids(tuple(d.delivery for d in p.deferred))),
        ("version", str(p.version)),
    ]
    whole = ("incarnation", "floor", "version")
    title = (Whole(p.consumer), " @ ", Whole(f"{p.scope.stream}/{p.scope.group}"))
    return fields_table(title, rows, whole)


@click.group(name="progress", cls=OutputGroup)
def progress() -> None:
    """Delivery progress of broker consumers (SPEC §10)."""


@progress.command("show")
@click.argument("consumer")
@click.option(
    "--redis-url",
    envvar=["SETTLE_PROGRESS_REDIS_URL", "SETTLE_REDIS_URL"],
    cls=EnvOption,
    default="redis://localhost:6379/0",
    show_default=True,
    help="The Redis that holds progress (env SETTLE_PROGRESS_REDIS_URL or SETTLE_REDIS_URL).",
)
@click.option(
    "--namespace",
    envvar="SETTLE_NAMESPACE",
    cls=EnvOption,
    default="default",
    show_default=True,
)
@redis_timeout_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def show(
    consumer: str, redis_url: str, namespace: str, redis_timeout: float, as_json: bool
) -> None:
    """Floor, applied above floor, gaps and provider floor of CONSUMER, per provider scope."""
    # 2 for bad input, 3 for Redis, as every command
    task = f"read the progress of consumer {consumer!r}"
    conn = Connection(redis_url, namespace, None, redis_timeout)
    with errors_as_exit_codes(conn, task):
        store = ProgressStore(
            companion_client(conn),
            consumer=consumer,
            namespace=checked_namespace(namespace),
            allow_eviction=True,  # it only reads, as the quarantine's read commands
        )
        try:
            scopes = store.show()
        finally:
            store.close()
    if not scopes:
        fail(f"no progress recorded for consumer {consumer!r} in {namespace!r}", EXIT_FAILED)
    if as_json:
        click.echo(json.dumps([p.to_json() for p in scopes], indent=2))
        return
    out = console()
    for p in scopes:
        print_table(out, _table(p))


if __name__ == "__main__":
    progress()
