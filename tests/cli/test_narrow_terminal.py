"""In a terminal 80 or 60 columns wide, every id, operation id, generation, attempt id and
digest a user copies into the next command is printed whole, on one line, and no other line
is wider than the terminal (docs/cli.md, "Narrow terminals"). Real operations settled
through a real Settler, read by the ``settle`` command in a real pseudo-terminal."""

from __future__ import annotations

import os
import re
import sys
import uuid
from collections.abc import Iterable
from datetime import UTC

import pytest
from rich.cells import cell_len

from settle import Reserved, Settler
from settle.models import OperationRecord, QuarantineEntry
from settle.progress import DeliveryId, EmissionId, ProgressStore, ProviderScope
from tests.cli.conftest import cli_env, settle
from tests.cli.helpers import in_terminal, stale_settlement

CLI = [sys.executable, "-c", "from settle.cli import main; main()"]
#: An operation id with spaces, too long to stand beside its label at 60 columns: it must
#: not be wrapped at its spaces.
SPACED = "refund: invoice 2026-12-0077 of merchant m5, line 3"

WIDTHS = pytest.mark.parametrize("columns", [80, 60, 40])


def assert_whole(out: str, columns: int, values: Iterable[str]) -> None:
    """Each value is on one line, nothing is ellipsized, and every line fits the terminal
    but one that holds a single value wider than the room it has (a 64-digit digest at 60
    columns), which settle leaves whole for the terminal to wrap."""
    whole = set(values)
    lines = out.splitlines()
    assert "…" not in out, out
    for value in whole:
        assert any(value in line for line in lines), f"{value!r} not whole on a line:\n{out}"
    for line in lines:
        assert len(line) <= columns or line.strip() in whole, f"{line!r} is too wide:\n{out}"


@pytest.fixture
def env(redis_url: str, namespace: str) -> dict[str, str]:
    return {**os.environ, "SETTLE_REDIS_URL": redis_url, "SETTLE_NAMESPACE": namespace}


@pytest.fixture
def entries(cli_settler: Settler) -> list[QuarantineEntry]:
    """Two late responses after a takeover, each quarantined; 16-digit generations."""
    refs = [stale_settlement(cli_settler, op) for op in ("charge:26e120-0032", SPACED)]
    return [cli_settler.quarantine.get(ref) for ref in refs]


def _record_values(record: OperationRecord) -> list[str]:
    assert record.result_digest is not None
    assert record.attempt_id is not None
    return [
        f"{record.fingerprint} (v{record.fingerprint_version})",
        record.binding,
        str(record.generation),
        record.attempt_id,
        record.result_digest,
    ]


def _entry_values(e: QuarantineEntry) -> list[str]:
    assert e.current is not None
    return [
        e.ref,
        e.operation_id,
        str(e.presented.generation),
        f"{e.current.state.value} gen {e.current.generation} v{e.current.version}",
    ]


@WIDTHS
def test_inspect_keeps_generations_attempt_ids_and_digests_whole(
    cli_settler: Settler, entries: list[QuarantineEntry], env: dict[str, str], columns: int
) -> None:
    """At 80 columns the attempt log showed ``17964793…`` for each generation and
    ``757859a04909ec3857427059…`` for each attempt id, and folded the fingerprint and the
    result sha256 over two table rows."""
    for e in entries:
        record = cli_settler.get(e.operation_id)
        assert record is not None
        assert len(str(record.generation)) == 16
        attempts = cli_settler.attempts(e.operation_id)
        out = in_terminal([*CLI, "inspect", e.operation_id], env, columns)
        values = [*_record_values(record), *_entry_values(e)]
        values += [str(a.generation) for a in attempts] + [a.attempt_id for a in attempts]
        assert_whole(out, columns, values)
        assert "lease_expired" in out, out
        assert "stale_generation" in out, out


@WIDTHS
def test_quarantine_ls_keeps_ids_operations_and_generations_whole(
    entries: list[QuarantineEntry], env: dict[str, str], columns: int
) -> None:
    """The id, operation and generation columns alone need more than 80 columns: rich cut
    the id to ``4/1796…``, the operation to ``charge…`` and the generation to ``17964…``
    (and dropped the action column), nothing ``quarantine show`` could be given."""
    out = in_terminal([*CLI, "quarantine", "ls"], env, columns)
    assert_whole(out, columns, [v for e in entries for v in _entry_values(e)])
    assert out.count("stale_generation") == len(entries), out
    assert out.count("complete\n") == len(entries), out  # the action, in each block


@WIDTHS
def test_quarantine_show_and_resolve_keep_the_evidence_whole(
    entries: list[QuarantineEntry], env: dict[str, str], columns: int
) -> None:
    """``show`` folded the presented fingerprint and the payload's sha256 over two rows."""
    note = "late receipt names the committed charge ch_new; nothing to refund " * 3
    for e in entries:
        values = [
            *_entry_values(e),
            e.attempt_id,
            e.presented.binding,
            f"{e.presented.fingerprint} (v{e.presented.fingerprint_version})",
            e.payload.sha256,
        ]
        shown = in_terminal([*CLI, "quarantine", "show", e.ref], env, columns)
        assert_whole(shown, columns, values)
        resolved = in_terminal([*CLI, "quarantine", "resolve", e.ref, "--note", note], env, columns)
        assert_whole(resolved, columns, values)
        # the note wraps at its spaces, every word of it there
        assert note.split() == resolved.split("resolution:", 1)[1].split()[1:], resolved


@WIDTHS
def test_stats_keeps_the_namespace_whole(redis_url: str, columns: int) -> None:
    """A namespace may be 64 characters: the title ``quarantine of <namespace>`` was folded
    at the table's width, the name cut in two."""
    namespace = f"settlements-eu-west-1-production-{uuid.uuid4().hex}"[:64]
    with Settler.from_url(redis_url, namespace=namespace, shards=2) as settler:
        settler.check()
        done = settler.reserve("charge:1", {"amount": 1}, principal="tenant:acme")
        assert isinstance(done, Reserved)
        settler.complete(done.reservation, {"charge_id": "ch_1"})
    env = {**os.environ, "SETTLE_REDIS_URL": redis_url, "SETTLE_NAMESPACE": namespace}
    out = in_terminal([*CLI, "stats"], env, columns)
    assert_whole(out, columns, [namespace, "conflicting_settlement"])
    assert "completed" in out, out


@WIDTHS
def test_progress_show_keeps_the_incarnation_and_floor_whole(
    redis_url: str, env: dict[str, str], columns: int
) -> None:
    """The value column was what was left of 80 columns beside ``dead-lettered above
    floor``: a 50-character incarnation was folded over two rows."""
    consumer = f"billing-{uuid.uuid4().hex[:8]}"
    incarnation = f"orders-eu-west-1@{uuid.uuid4().hex}"
    scope = ProviderScope("orders", "billing", incarnation)
    store = ProgressStore.from_url(redis_url, consumer=consumer, namespace="progress")
    try:
        ids = [DeliveryId(f"1796479646423-{n}") for n in range(1, 6)]
        for n in (0, 2, 3):
            store.apply(scope, ids[n], EmissionId(f"e{n}"), lambda ctx: None)
        store.observe(scope, None, ids, last_delivered=ids[-1], oldest_pending=ids[1], pending=1)
    finally:
        store.close()
    out = in_terminal([*CLI, "progress", "show", consumer, "--namespace", "progress"], env, columns)
    assert_whole(out, columns, [incarnation, ids[0].value, ids[2].value, ids[3].value])
    assert f"{consumer} @ orders/billing" in out, out


def test_an_operation_id_wider_than_the_terminal_is_written_whole(
    cli_settler: Settler, env: dict[str, str], redis_url: str, namespace: str
) -> None:
    """Operation ids may be 256 characters: wider than any terminal here, and wider than
    the 200 columns piped output had, where rich cut it (and the id beside it) with ``…``.
    In a terminal it is a line of its own, for the terminal to wrap; piped, the table is as
    wide as the id, one row per entry still."""
    operation_id = "charge:" + "order-2026-12-0077/" * 13
    operation_id += "x" * (256 - len(operation_id))
    ref = stale_settlement(cli_settler, operation_id)
    out = in_terminal([*CLI, "quarantine", "ls"], env, 80)
    assert_whole(out, 80, [operation_id, ref])
    assert operation_id in [line.strip() for line in out.splitlines()], out
    piped = settle("quarantine", "ls", "--redis-url", redis_url, "--namespace", namespace)
    assert piped.returncode == 0, piped.stderr
    assert "…" not in piped.stdout, piped.stdout
    assert any(ref in line and operation_id in line for line in piped.stdout.splitlines())


#: An operation id with spaces, wider than 80 columns beside ``operation``.
LONG_SPACED = "refund: invoice 2026-12-0077 of merchant m5, lines 3 and 4 of 7 (EUR 1,250.00)"


@WIDTHS
def test_inspect_keeps_an_operation_id_with_spaces_whole_in_its_titles(
    cli_settler: Settler, env: dict[str, str], columns: int
) -> None:
    """The record's operation id is printed in titles and messages only (``operation ...``,
    ``no quarantine entries for ...``), which were wrapped at its spaces: half the id on
    one line, half on the next. Now it is whole on a line, as every value a user copies."""
    done = cli_settler.reserve(LONG_SPACED, {"amount": 1250}, principal="tenant:acme")
    assert isinstance(done, Reserved)
    cli_settler.complete(done.reservation, {"charge_id": "ch_1"})
    record = cli_settler.get(LONG_SPACED)
    assert record is not None
    out = in_terminal([*CLI, "inspect", LONG_SPACED], env, columns)
    assert_whole(out, columns, [LONG_SPACED, *_record_values(record)])
    assert out.count(LONG_SPACED) == 2, out  # the record's title and the last message
    # a response for an operation that has no record: a message and a quarantine entry
    seed = cli_settler.reserve("charge:seed", {"amount": 1}, principal="tenant:acme")
    assert isinstance(seed, Reserved)
    stray = seed.reservation.model_copy(update={"operation_id": f"{LONG_SPACED} (stray)"})
    late = cli_settler.complete(stray, {"charge_id": "ch_stray"})
    assert late.quarantine_id is not None
    out = in_terminal([*CLI, "inspect", stray.operation_id], env, columns)
    assert_whole(out, columns, [stray.operation_id, late.quarantine_id])
    assert out.count(stray.operation_id) == 3, out  # no record, the entries' title, the entry
    assert "no record" in out, out


@WIDTHS
def test_progress_show_keeps_a_consumer_with_spaces_whole_in_its_title(
    redis_url: str, env: dict[str, str], columns: int
) -> None:
    """The consumer is named in the title only (``<consumer> @ <stream>/<group>``), which was
    wrapped at the name's spaces: ``progress show`` could not be given it back. A name wider
    than the terminal is on a line of its own, for the terminal to wrap."""
    consumer = "billing workers of merchant m5 in eu-west-1 and eu-central-1, refunds and payouts"
    consumer += f" {uuid.uuid4().hex[:8]}"
    scope = ProviderScope("orders", "billing", "orders@1")
    store = ProgressStore.from_url(redis_url, consumer=consumer, namespace="progress")
    try:
        store.apply(scope, DeliveryId("1796479646423-1"), EmissionId("e1"), lambda ctx: None)
    finally:
        store.close()
    out = in_terminal([*CLI, "progress", "show", consumer, "--namespace", "progress"], env, columns)
    assert_whole(out, columns, [consumer, "1796479646423-1"])
    assert "orders/billing" in out, out


def _strip_styles(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


@pytest.mark.parametrize("variable", ["FORCE_COLOR", "TTY_COMPATIBLE"])
def test_piped_output_is_a_table_when_colours_are_forced(
    cli_settler: Settler, redis_url: str, namespace: str, variable: str
) -> None:
    """``FORCE_COLOR=1`` (set in many CI jobs for coloured logs) or ``TTY_COMPATIBLE=1``
    made rich call a pipe a terminal, and the table of a 256-character operation id was
    printed as blocks (no longer one row per entry) in a pipe, where docs/cli.md promises a
    table always. Colours are what they ask for, and what they get."""
    operation_id = "charge:" + "order-2026-12-0077/" * 13
    operation_id += "x" * (256 - len(operation_id))
    ref = stale_settlement(cli_settler, operation_id)
    env = cli_env(**{variable: "1"})
    piped = settle("quarantine", "ls", "--redis-url", redis_url, "--namespace", namespace, env=env)
    assert piped.returncode == 0, piped.stderr
    lines = _strip_styles(piped.stdout).splitlines()
    assert any(ref in line and operation_id in line for line in lines), piped.stdout
    assert not any(line.startswith("id:") for line in lines), piped.stdout


@WIDTHS
def test_a_terminal_gets_the_terminal_layout_when_rich_is_told_otherwise(
    entries: list[QuarantineEntry], env: dict[str, str], columns: int
) -> None:
    """``TTY_COMPATIBLE=0`` or an empty ``FORCE_COLOR`` made rich call the terminal a pipe:
    ``quarantine ls`` was printed as a table as wide as a pipe's, wider than the terminal,
    which wrapped each row of it over the next lines."""
    for variable, value in (("TTY_COMPATIBLE", "0"), ("FORCE_COLOR", "")):
        out = in_terminal([*CLI, "quarantine", "ls"], {**env, variable: value}, columns)
        assert_whole(out, columns, [v for e in entries for v in _entry_values(e)])


@WIDTHS
def test_the_width_is_the_terminals_under_term_dumb_without_columns(
    entries: list[QuarantineEntry], env: dict[str, str], columns: int
) -> None:
    """Under ``TERM=dumb`` rich takes 80 columns whatever the terminal, when ``COLUMNS`` is
    not set (a shell sets it, but does not export it): settle asks the terminal."""
    out = in_terminal([*CLI, "quarantine", "ls"], env, columns, unset_columns=True)
    assert_whole(out, columns, [v for e in entries for v in _entry_values(e)])
    wide = in_terminal([*CLI, "quarantine", "ls"], env, 200, unset_columns=True)
    assert "┃ id" in wide, wide  # a table, 200 columns wide


def test_columns_is_the_width_when_set(entries: list[QuarantineEntry], env: dict[str, str]) -> None:
    """``COLUMNS=60 settle ...`` lays the output out for 60 columns in a wider terminal (a
    pane beside the one it runs in, a screenshot for a runbook), as rich does."""
    out = in_terminal([*CLI, "quarantine", "ls"], env, 200, env_columns=60)
    assert_whole(out, 60, [v for e in entries for v in _entry_values(e)])
    assert "id:" in out, out


def test_piped_output_is_one_line_per_entry_at_least_200_columns_wide(
    entries: list[QuarantineEntry], redis_url: str, namespace: str
) -> None:
    """A script reading ``quarantine ls | ...`` gets one line per entry, every cell of it
    whole (the time too, which wraps at its space in a narrower table), whatever the width
    of the terminal it ran in: piped output is at least 200 columns wide."""
    env = {k: v for k, v in cli_env().items() if k not in ("COLUMNS", "LINES")}
    piped = settle("quarantine", "ls", "--redis-url", redis_url, "--namespace", namespace, env=env)
    assert piped.returncode == 0, piped.stderr
    lines = piped.stdout.splitlines()
    for e in entries:
        cells = [*_entry_values(e), e.at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]]
        assert any(all(cell in line for cell in cells) for line in lines), piped.stdout


def test_blocks_align_values_and_indent_a_value_too_wide_for_its_label(
    entries: list[QuarantineEntry], cli_settler: Settler, env: dict[str, str]
) -> None:
    """The block layout docs/cli.md shows: values aligned two columns after the longest
    label, a value too wide for the room beside its label on the next line indented two
    columns, a blank line after each block."""
    e = entries[0]
    record = cli_settler.get(e.operation_id)
    assert record is not None
    out = in_terminal([*CLI, "inspect", e.operation_id], env, 80)
    lines = out.splitlines()
    assert f"generation:    {record.generation}" in lines, out  # "result sha256" + 2
    fingerprint = f"{record.fingerprint} (v{record.fingerprint_version})"  # 69 > 80 - 15
    assert lines[lines.index("fingerprint:") + 1] == f"  {fingerprint}", out
    listed = in_terminal([*CLI, "quarantine", "ls"], env, 80)
    assert listed.count("resolved:      no\n\nid:") == len(entries) - 1, listed


@pytest.mark.parametrize("columns", [180, 200])
def test_wide_characters_are_measured_as_the_terminal_shows_them(
    cli_settler: Settler, env: dict[str, str], columns: int
) -> None:
    """An operation id in CJK takes two columns a character: measured by its length, the
    table of ``quarantine ls`` seemed to fit 180 columns and the id was folded in it."""
    operation_id = "返金:請求書-2026-12-0077-加盟店m5-明細3"
    ref = stale_settlement(cli_settler, operation_id)
    out = in_terminal([*CLI, "quarantine", "ls"], env, columns)
    assert any(operation_id in line for line in out.splitlines()), out
    assert any(ref in line for line in out.splitlines()), out
    assert all(cell_len(line) <= columns for line in out.splitlines()), out


def test_a_lines_of_a_superscript_digit_is_the_terminals_own(
    entries: list[QuarantineEntry], env: dict[str, str]
) -> None:
    r"""``LINES`` (and ``COLUMNS``) were read when ``str.isdigit()``, which is true of
    superscripts: ``LINES=\u00b2`` made every command that prints to a terminal end in
    int()'s ValueError (a traceback, exit 1). Only ASCII digits are a size; else the
    terminal's own."""
    out = in_terminal([*CLI, "quarantine", "ls"], {**env, "LINES": "\u00b2"}, 60)
    assert_whole(out, 60, [v for e in entries for v in _entry_values(e)])
