"""``settle cursor show STREAM`` and ``settle cursor witnesses STREAM``.

A ``click`` group, attached to the main ``settle`` CLI as ``cursor`` and runnable on its own
as ``python -m settle.cli.cursor``. Cursors and successors are shown only as digests (and
their length): they are credentials of a kind, and never printed in clear.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

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
from settle.cli._render import Whole, add_row, console, new_table, print_table
from settle.cursor._sync import CursorStore
from settle.cursor.models import Checkpoint, Witness

__all__ = ["checkpoint_json", "cursor", "witness_json"]


def checkpoint_json(ck: Checkpoint) -> dict[str, Any]:
    return {
        "stream": ck.stream,
        "cursor_digest": ck.cursor_digest,
        "cursor_bytes": len(ck.cursor),
        "generation": ck.generation,
        "boundary": ck.boundary,
        "promoted_witness": ck.promoted_witness,
        "created_at": ck.created_at.isoformat(),
        "updated_at": ck.updated_at.isoformat(),
    }


def witness_json(w: Witness) -> dict[str, Any]:
    return {
        "attempt_id": w.attempt_id,
        "generation": w.generation,
        "input_digest": w.input_digest,
        "successor_digest": w.successor_digest,
        "successor_bytes": len(w.successor),
        "events": [[e.id, e.position, e.digest] for e in w.events],
        "snapshot": w.snapshot,
        "coverage": list(w.coverage) if w.coverage else None,
        "classification": w.classification.value,
        "next_boundary": w.next_boundary,
        "disposition": w.disposition.value,
        "reason": w.reason,
        "created_at": w.created_at.isoformat(),
        "updated_at": w.updated_at.isoformat(),
    }


EXIT_NOT_FOUND = EXIT_FAILED

F = TypeVar("F", bound=Callable[..., Any])


def _connection(fn: F) -> F:
    fn = click.option(
        "--namespace",
        envvar="SETTLE_NAMESPACE",
        cls=EnvOption,
        default="default",
        show_default=True,
        help="settle namespace (or SETTLE_NAMESPACE).",
    )(fn)
    fn = redis_timeout_option(fn)
    return click.option(
        "--redis-url",
        envvar="SETTLE_REDIS_URL",
        cls=EnvOption,
        default="redis://localhost:6379/0",
        show_default=True,
        help="Redis URL (or SETTLE_REDIS_URL).",
    )(fn)


@contextlib.contextmanager
def _store(redis_url: str, namespace: str, task: str, timeout: float) -> Iterator[CursorStore]:
    """A store on ``redis_url``; a settle error is one line and the exit code every command
    gives it (2 for bad input, 3 for Redis: :func:`~settle.cli._context.exit_code_of`),
    a Redis failure naming ``task``, what the user asked for."""
    conn = Connection(redis_url, namespace, None, timeout)
    with errors_as_exit_codes(conn, task):
        # Its commands only read: an evicting server is read, as the quarantine's read
        # commands read it (docs/cli.md); settle doctor fails the policy by name.
        store = CursorStore(
            companion_client(conn), namespace=checked_namespace(namespace), allow_eviction=True
        )
        try:
            yield store
        finally:
            store.close()


@click.group("cursor", cls=OutputGroup)
def cursor() -> None:
    """Cursor checkpoints: the checkpoint of a stream and its response witnesses."""


@cursor.command("show")
@click.argument("stream")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@_connection
def show(stream: str, as_json: bool, redis_url: str, namespace: str, redis_timeout: float) -> None:
    """The checkpoint of STREAM: cursor digest, generation, applied boundary."""
    task = f"read the checkpoint of stream {stream!r}"
    with _store(redis_url, namespace, task, redis_timeout) as store:
        ck = store.checkpoint(stream)
    if ck is None:
        fail(f"stream {stream!r} has no checkpoint in namespace {namespace!r}", EXIT_NOT_FOUND)
    data = checkpoint_json(ck)
    if as_json:
        click.echo(json.dumps(data))
        return
    whole = ("stream", "cursor_digest", "generation", "boundary", "promoted_witness")
    table = new_table(("checkpoint of ", Whole(stream)), whole=whole, show_header=False)
    table.add_column("field")
    table.add_column("value")
    for key, value in data.items():
        add_row(table, key, "" if value is None else value)
    print_table(console(), table)


@cursor.command("witnesses")
@click.argument("stream")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of a table.")
@_connection
def witnesses(
    stream: str, limit: int, as_json: bool, redis_url: str, namespace: str, redis_timeout: float
) -> None:
    """The newest response witnesses of STREAM, newest generation first."""
    task = f"read the witnesses of stream {stream!r}"
    with _store(redis_url, namespace, task, redis_timeout) as store:
        found = store.witnesses(stream, limit=limit)
    if as_json:
        for w in found:
            click.echo(json.dumps(witness_json(w)))
        return
    table = new_table(("witnesses of ", Whole(stream)), whole=("gen", "attempt", "successor"))
    for column in (
        "gen",
        "attempt",
        "class",
        "events",
        "positions",
        "successor",
        "boundary",
        "disposition",
        "reason",
    ):
        table.add_column(column)
    for w in found:
        positions = f"{w.events[0].position}..{w.events[-1].position}" if w.events else "-"
        add_row(
            table,
            w.generation,
            w.attempt_id[:12],
            w.classification.value,
            str(len(w.events)),
            positions,
            w.successor_digest[:16],
            str(w.next_boundary),
            w.disposition.value,
            w.reason,
        )
    print_table(console(), table)


if __name__ == "__main__":
    cursor()
