"""``settle digest``: the log digest of an operation id, a principal, a delivery progress
emission id or a cursor event id.

settle's log lines never carry any of them itself (SPEC 12), only their keyed digests
(``operation_digest``, ``binding_digest``, ``emission_digest``, ``event_digest``:
HMAC-SHA256 under ``SETTLE_DIGEST_KEY``). To find the lines of one operation, emission or
event, compute its digest with the deployment's secret and search for it. Needs no Redis.
"""

from __future__ import annotations

import os

import click

from settle._exit import EXIT_USAGE
from settle._input import is_utf8
from settle._log import (
    DIGEST_KEY_ENV,
    binding_digest,
    emission_digest,
    event_digest,
    operation_digest,
)
from settle.cli._context import fail, json_option
from settle.cli._render import print_json

__all__ = ["digest"]


@click.command("digest")
@click.argument("operation_ids", nargs=-1)
@click.option(
    "--principal",
    "principals",
    multiple=True,
    help="A principal to digest as binding_digest (repeatable).",
)
@click.option(
    "--emission",
    "emissions",
    multiple=True,
    help="A delivery progress emission id to digest as emission_digest (repeatable).",
)
@click.option(
    "--event",
    "events",
    multiple=True,
    help="A cursor event id to digest as event_digest (repeatable).",
)
@json_option
def digest(
    operation_ids: tuple[str, ...],
    principals: tuple[str, ...],
    emissions: tuple[str, ...],
    events: tuple[str, ...],
    as_json: bool,
) -> None:
    """The operation_digest of each OPERATION_ID (and the binding_digest of each
    --principal, the emission_digest of each --emission, the event_digest of each --event)
    under SETTLE_DIGEST_KEY, as settle's log lines carry them."""
    if not os.environ.get(DIGEST_KEY_ENV):
        fail(
            f"{DIGEST_KEY_ENV} is not set: each process then draws a random secret and no "
            "digest can be reproduced; set it to the deployment's secret",
            EXIT_USAGE,
        )
    if not (operation_ids or principals or emissions or events):
        fail("give at least one operation id, --principal, --emission or --event", EXIT_USAGE)
    for name, values in (
        ("OPERATION_ID", operation_ids),
        ("--principal", principals),
        ("--emission", emissions),
        ("--event", events),
    ):
        for value in values:
            _check_text(name, value)
    rows = [("operation_digest", op, operation_digest(op)) for op in operation_ids]
    rows += [("binding_digest", p, binding_digest(p)) for p in principals]
    rows += [("emission_digest", e, emission_digest(e)) for e in emissions]
    rows += [("event_digest", e, event_digest(e)) for e in events]
    if as_json:
        print_json([{"field": f, "value": v, "digest": d} for f, v, d in rows])
        return
    for field, _value, value_digest in rows:
        click.echo(f"{field}={value_digest}")


def _check_text(name: str, value: str) -> None:
    """Refuse (exit 2) a value holding bytes that are not UTF-8 text (the shell passed them
    as they were; Python keeps them as lone surrogates): no id settle stores holds them, and
    its digest could not be computed (a UnicodeEncodeError traceback)."""
    if not is_utf8(value):
        fail(f"bad {name} {value!r}: it holds bytes that are not UTF-8 text", EXIT_USAGE)
