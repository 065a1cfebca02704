"""Every log event settle can emit is listed in docs/observability.md ("Log events"), at its
level, and every event listed there is emitted somewhere: read from the source with ``ast``
both ways, names built from parts included. A real run through every transition and every
rejection of SPEC 2 and 3 then checks each event it emits against the list, level too."""

from __future__ import annotations

import ast
import functools
import re
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import tenacity
from structlog.testing import capture_logs

from settle import (
    Attempt,
    BindingMismatch,
    FingerprintMismatch,
    OperationFailed,
    Settler,
    Verdict,
)
from settle.progress.models import ApplyStatus

ROOT = Path(__file__).resolve().parents[2]
SETTLE = ROOT / "settle"
DOC = ROOT / "docs" / "observability.md"

LEVELS = {"debug", "info", "warning", "error", "critical", "exception"}

#: The event names built from parts (an f-string), each with every name it can make. A new
#: one fails the scan until it is added here (and its names to the doc).
BUILT = {
    # The quarantined verdict is its own WARNING event, logged in the branch before this one.
    "settle.settlement.{verdict.value}": [
        f"settle.settlement.{v.value}" for v in Verdict if v is not Verdict.QUARANTINED
    ],
    "settle.progress.{status.value}": [f"settle.progress.{s.value}" for s in ApplyStatus],
}

_EVENT = re.compile(r"settle\.[a-z_]+\.[a-z_]+")


def _name(node: ast.expr, where: str) -> list[str] | None:
    """The event names a first argument can be; None when it is no settle event name."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value] if node.value.startswith("settle.") else None
    if isinstance(node, ast.JoinedStr):
        text = ast.unparse(node)[2:-1]  # f'...' -> ...
        if not text.startswith("settle."):
            return None
        assert text in BUILT, f"{where}: an event name built from parts, {text!r}: add it"
        return BUILT[text]
    return None


def _level_of(call: ast.Call, params: dict[str, Any]) -> list[str] | None:
    """The levels a call logs at: ``x.info(...)``, or ``getattr(x, level)(...)`` where
    ``level`` is a parameter of the enclosing function (its default and every value passed
    for it, gathered in ``params``)."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in LEVELS:
        return [func.attr]
    if (
        isinstance(func, ast.Call)
        and isinstance(func.func, ast.Name)
        and func.func.id == "getattr"
        and len(func.args) == 2
        and isinstance(func.args[1], ast.Name)
    ):
        levels = params.get(func.args[1].id)
        assert levels, f"getattr(logger, {func.args[1].id}) with no level known"
        return sorted(levels)
    return None


@functools.cache
def _functions() -> list[tuple[Path, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function of settle's source (methods and nested ones too)."""
    found = []
    for path in sorted(SETTLE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found.append((path, node))
    return found


def _level_params() -> dict[str, dict[str, set[str]]]:
    """For each function with a ``level`` parameter (it picks a logger method): its default
    and every constant passed for it by keyword anywhere in settle."""
    found: dict[str, dict[str, set[str]]] = {}
    for _path, fn in _functions():
        positional = fn.args.args[len(fn.args.args) - len(fn.args.defaults) :]
        pairs = [*zip(positional, fn.args.defaults, strict=True)]
        pairs += [(a, d) for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True)]
        for arg, default in pairs:
            if arg.arg == "level" and isinstance(default, ast.Constant):
                found[fn.name] = {"level": {str(default.value)}}
    for _path, fn in _functions():
        for node in ast.walk(fn):
            callee = isinstance(node, ast.Call) and getattr(node.func, "attr", None)
            if not (isinstance(node, ast.Call) and callee in found):
                continue
            for keyword in node.keywords:
                if keyword.arg == "level" and isinstance(keyword.value, ast.Constant):
                    found[str(callee)]["level"].add(str(keyword.value.value))
    return found


@functools.cache
def emitted() -> dict[str, set[str]]:
    """Every event name settle's source can log, with the levels it is logged at.

    A logger method called with a name (or an f-string of :data:`BUILT`); a helper that
    passes its own parameter to a logger method (``_info(event, ...)``, ``_warn``), called
    with a name in its module; ``getattr(logger, level)(name)`` at each level its callers
    pass. Any other expression as an event name fails: the scan could not list it."""
    level_params = _level_params()
    # A helper: a function that passes one of its parameters to a logger method as the
    # event; the position its callers (in its module) give the event at, ``self`` aside.
    helpers: dict[tuple[Path, str], tuple[str, int]] = {}
    for path, fn in _functions():
        params = [a.arg for a in fn.args.args if a.arg not in ("self", "cls")]
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Name):
                levels = _level_of(node, {})
                if node.args[0].id in params and levels and len(levels) == 1:
                    helpers[path, fn.name] = (levels[0], params.index(node.args[0].id))
    found: dict[str, set[str]] = defaultdict(set)
    for path, fn in _functions():
        for node in ast.walk(fn):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            levels = _level_of(node, level_params.get(fn.name, {}))
            at = 0
            callee = getattr(node.func, "attr", getattr(node.func, "id", None))
            if levels is None and (path, callee) in helpers:
                level, at = helpers[path, callee]
                levels = [level]
            if levels is None or at >= len(node.args):
                continue  # a span, an instrument, a scope key...: not a log event
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            first = node.args[at]
            if not isinstance(first, ast.Constant | ast.JoinedStr):
                # A helper's own parameter is read at its callers; any other expression
                # (a constant's name, a computed name) is a name this scan cannot list.
                params = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
                unread = f"{where}: an event name this scan cannot read: {ast.unparse(first)}"
                assert isinstance(first, ast.Name), unread
                assert first.id in params, unread
            names = _name(first, where)
            if names is None:
                continue  # client.info("memory"): a Redis command, not an event
            for name in names:
                assert _EVENT.fullmatch(name), f"{where}: {name!r} is not settle.<part>.<event>"
                found[name].update(level.upper() for level in levels)
    return dict(found)


def listed() -> dict[str, set[str]]:
    """The "Log events" section's tables: each row's event name and its levels."""
    doc = DOC.read_text(encoding="utf-8")
    section = doc.split("\n## Log events\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, set[str]] = {}
    for line in section.splitlines():
        match = re.match(r"\| `(settle\.[a-z_.]+)` \| ([A-Z, ]+) \|", line)
        if match:
            assert match[1] not in rows, f"{match[1]} is listed twice"
            rows[match[1]] = {level.strip() for level in match[2].split(",")}
    return rows


def test_the_scan_reads_every_form_an_event_is_logged_in() -> None:
    found = emitted()
    assert found["settle.reserve.reserved"] == {"INFO"}  # logger.info("...")
    assert found["settle.settlement.absorbed"] == {"INFO"}  # an f-string
    assert found["settle.progress.duplicate"] == {"INFO"}
    assert found["settle.http.started"] == {"INFO"}  # the guard's _info helper
    assert found["settle.http.rejected"] == {"INFO", "WARNING"}  # getattr(log, level)
    assert found["settle.operation.heartbeat_failed"] == {"WARNING"}  # sync _warn helper
    assert found["settle.renew.renewed"] == {"DEBUG"}  # a bound logger
    assert len(found) >= 100, len(found)


def test_every_event_the_source_can_emit_is_listed_at_its_level() -> None:
    found, rows = emitted(), listed()
    assert sorted(set(found) - set(rows)) == [], "emitted, not listed"
    wrong = {name: (rows[name], levels) for name, levels in found.items() if rows[name] != levels}
    assert wrong == {}, "listed at another level (doc, source)"


def test_every_listed_event_is_emitted_somewhere() -> None:
    assert sorted(set(listed()) - set(emitted())) == [], "listed, never emitted"


# -- a real run ------------------------------------------------------------------------------

REQUEST = {"amount": 100}
WHO = "tenant:a"


def _check(logs: list[dict[str, Any]]) -> set[str]:
    """Every captured event is listed, at the level the doc gives it; the names."""
    rows = listed()
    names = set()
    for entry in logs:
        name, level = entry["event"], entry["log_level"].upper()
        assert name in rows, f"{name} emitted, not listed"
        assert level in rows[name], f"{name} at {level}, listed at {rows[name]}"
        names.add(name)
    return names


def test_every_transition_and_rejection_of_a_real_run_is_a_listed_event(
    settler: Settler,
) -> None:
    with capture_logs() as logs:
        # reserve: new, replay (completed and failed), in progress, both mismatches
        done = settler.reserve("done", REQUEST, principal=WHO, lease=30)
        settler.complete(done.reservation, {"ok": 1})  # accepted
        settler.complete(done.reservation, {"ok": 1})  # absorbed
        settler.mark_provisional(done.reservation, reason="timeout")  # absorbed
        settler.reserve("done", REQUEST, principal=WHO)  # replayed
        declined = settler.reserve("declined", REQUEST, principal=WHO)
        settler.fail(declined.reservation, KeyError("declined"))
        settler.reserve("declined", REQUEST, principal=WHO)  # replayed (failed)
        held = settler.reserve("held", REQUEST, principal=WHO, lease=30)
        settler.reserve("held", REQUEST, principal=WHO)  # in progress
        settler.renew(held.reservation)  # renewed
        with pytest.raises(FingerprintMismatch):
            settler.reserve("held", {"amount": 999}, principal=WHO)
        with pytest.raises(BindingMismatch):
            settler.reserve("held", REQUEST, principal="tenant:b")
        # takeovers: a provisional record, then a lease that passed
        settler.mark_provisional(held.reservation, reason="timeout")  # accepted
        second = settler.reserve("held", REQUEST, principal=WHO, lease=0.05)  # provisional
        time.sleep(0.1)
        settler.renew(second.reservation)  # lost: lease_expired
        third = settler.reserve("held", REQUEST, principal=WHO)  # lease_expired
        settler.renew(second.reservation)  # lost: stale_generation
        # each quarantine kind
        settler.complete(second.reservation, {"late": 1})  # stale_generation
        forged = third.reservation.model_copy(update={"binding": "tenant:other"})
        settler.complete(forged, {"x": 1})  # misbound
        settler.complete(third.reservation, {"v": 1}, expected_version=1)  # version_conflict
        settler.complete(third.reservation, {"v": 2})  # accepted
        last = settler.complete(third.reservation, {"v": 3})  # conflicting_settlement
        ghost = third.reservation.model_copy(update={"operation_id": "ghost"})
        settler.complete(ghost, {"late": True})  # unknown_operation
        # the quarantine: resolved, again, trimmed
        assert last.quarantine_id is not None
        settler.quarantine.resolve(last.quarantine_id, note="checked")
        settler.quarantine.resolve(last.quarantine_id, note="again")
        settler.quarantine.trim()
    names = _check(logs)
    kinds = {e["kind"] for e in logs if e["event"] == "settle.settlement.quarantined"}
    assert kinds == {
        "stale_generation",
        "misbound",
        "version_conflict",
        "conflicting_settlement",
        "unknown_operation",
    }
    takeovers = {e["takeover"] for e in logs if e["event"] == "settle.reserve.reserved"}
    assert takeovers == {None, "provisional", "lease_expired"}
    rejected = {e["reason"] for e in logs if e["event"] == "settle.reserve.rejected"}
    assert rejected == {"fingerprint_mismatch", "binding_mismatch"}
    lost = {e["reason"] for e in logs if e["event"] == "settle.renew.lost"}
    assert lost == {"lease_expired", "stale_generation"}
    assert {
        "settle.reserve.replayed",
        "settle.reserve.in_progress",
        "settle.settlement.accepted",
        "settle.settlement.absorbed",
        "settle.renew.renewed",
        "settle.quarantine.resolved",
        "settle.quarantine.trimmed",
    } <= names


def test_a_decorated_operation_logs_listed_events(settler: Settler) -> None:
    once = tenacity.Retrying(stop=tenacity.stop_after_attempt(2), wait=tenacity.wait_none())

    @settler.operation(key="charge:{order}", principal=WHO, retry=once, terminal=KeyError)
    def charge(order: str, attempt: Attempt = Attempt.INJECTED) -> int:
        if order == "declined":
            raise KeyError(order)
        if order == "flaky" or attempt.number == 1:
            raise ConnectionError("reset")
        return attempt.generation

    with capture_logs() as logs:
        assert charge("o-1") == charge("o-1")  # retry scheduled, then replayed
        with pytest.raises(OperationFailed):
            charge("declined")
        with pytest.raises(ConnectionError):
            charge("flaky")  # gave up
    names = _check(logs)
    assert {
        "settle.operation.retry_scheduled",
        "settle.operation.replayed",
        "settle.operation.gave_up",
    } <= names
