"""``settle demo``: a payment workload with injected faults, through ``@settler.operation``,
on an embedded throwaway redis-server unless ``--redis-url`` is given."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from types import FrameType
from urllib.parse import parse_qs, urlsplit

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from settle._runtime._sync import client_from_url
from settle._runtime.urls import redacted
from settle.cli._context import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_UNAVAILABLE,
    EXIT_WHEN_READER_STOPS,
    Connection,
    connection_options_for,
    errors_as_exit_codes,
    fail,
    json_option,
    open_settler,
    settings,
)
from settle.cli._params import FiniteRange
from settle.cli._render import console, print_json, visible_message
from settle.demo import DemoError, DemoOptions, DemoReport, Fault, run_demo
from settle.demo.plan import MIN_OPS
from settle.embedded import EmbeddedRedis

__all__ = ["demo"]

_WHAT_SETTLE_DID = {
    Fault.TIMEOUT_AFTER_SUCCESS: "provisional, retried (new generation, same key): deduplicated",
    Fault.PROVIDER_UNAVAILABLE: "provisional, retried, charged once",
    Fault.DECLINED: "stored with fail, replayed as OperationFailed",
    Fault.CRASHED_WORKER: "lease expired, another worker took over",
    Fault.LATE_STALE_RESPONSE: "late result quarantined (stale_generation), StaleAttempt",
    Fault.DUPLICATE_DELIVERY: "replayed the stored outcome, nothing ran",
    Fault.CONCURRENT_DUPLICATE: "one ran, the other waited and got the same answer",
    Fault.CHANGED_PAYLOAD: "FingerprintMismatch, nothing ran",
    Fault.CHANGED_PRINCIPAL: "BindingMismatch, nothing ran",
}


def _terminate(signum: int, frame: FrameType | None) -> None:
    del frame
    raise SystemExit(128 + signum)


@click.command("demo")
@click.option(
    "--ops",
    type=click.IntRange(MIN_OPS, 100_000),
    default=200,
    show_default=True,
    help="Operations (orders) in the workload.",
)
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    default=8,
    show_default=True,
    help="Worker threads in this process.",
)
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of the workload.")
@click.option(
    "--lease",
    type=FiniteRange(0.2, 30),
    default=1.0,
    show_default=True,
    help="Lease in seconds: how soon a crashed or frozen worker is taken over.",
)
@connection_options_for(
    "demo",
    url_help="Run on this Redis (env SETTLE_REDIS_URL) and keep the data; without it an "
    "embedded throwaway redis-server is started and stopped.",
)
@json_option
def demo(conn: Connection, ops: int, workers: int, seed: int, lease: float, as_json: bool) -> None:
    """Charge a payment workload with injected faults (timeouts after success, crashed and
    frozen workers, late stale responses, duplicate deliveries, reused keys with changed
    payloads or principals) through @settler.operation, and report what happened.

    Exit 0 when every check holds (0 duplicate downstream effects among them), 1 otherwise.
    """
    # Ctrl-C must stop the demo (and its embedded server) even when the shell started us
    # with SIGINT ignored; SIGTERM and SIGHUP (the terminal closed: redis-server ignores it,
    # and outlived the demo with parent 1) unwind the same way. A handler already there
    # stays: the group's remembers a Ctrl-C Python loses in a finalizer, which the demo ran
    # on past, to exit 0 (docs/cli.md).
    if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL, None):
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    with errors_as_exit_codes():
        settings({"namespace": conn.namespace})  # before starting anything
    embedded: EmbeddedRedis | None = None
    try:
        if conn.redis_url is None:
            with errors_as_exit_codes():
                embedded = EmbeddedRedis()
                embedded.start()
            assert embedded.process is not None
            click.echo(
                f"settle demo: embedded redis-server (pid {embedded.process.pid}) "
                f"on {embedded.url}",
                err=True,
            )
            conn = Connection(embedded.url, conn.namespace, conn.shards, conn.redis_timeout)
        # A clear error if Redis is unreachable; an existing namespace keeps its shards.
        with open_settler(conn, create=True) as settler:
            shards = settler.config.shards
        options = DemoOptions(
            redis_url=_bounded_url(conn.url, conn.redis_timeout),
            namespace=conn.namespace,
            shards=shards,
            ops=ops,
            workers=workers,
            seed=seed,
            lease=lease,
        )
        report = _run(
            options, lambda: _stopped(embedded) or _unreachable(options.redis_url, conn.url)
        )
    except KeyboardInterrupt:
        fail("interrupted; the embedded redis-server was stopped", EXIT_INTERRUPTED)
    finally:
        if embedded is not None:
            embedded.close()
    if not report.ok:  # also when the reader of the report stops early (| head)
        click.get_current_context().meta[EXIT_WHEN_READER_STOPS] = EXIT_FAILED
    if as_json:
        print_json(report.model_dump(mode="json"))
    else:
        _print(report)
    if not report.ok:
        sys.exit(EXIT_FAILED)


def _stopped(embedded: EmbeddedRedis | None) -> str | None:
    """What ended the embedded redis-server, if it is no longer running."""
    process = None if embedded is None else embedded.process
    if process is None or process.poll() is None:
        return None
    code = process.returncode
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
    return f"the embedded redis-server (pid {process.pid}) stopped during the run ({how})"


def _bounded_url(url: str, seconds: float) -> str:
    """``url`` waiting at most ``seconds`` for a connection and for each reply, in this
    process and in the worker processes (``--redis-timeout``, as every command: the
    library's 30 s socket timeout held the demo minutes against a paused server). A
    ``socket_timeout`` or ``socket_connect_timeout`` already in the URL wins."""
    given = parse_qs(urlsplit(url).query)
    added = "&".join(
        f"{name}={seconds}"
        for name in ("socket_timeout", "socket_connect_timeout")
        if name not in given
    )
    if not added:
        return url
    # Added as text, not rebuilt by urlunsplit, which writes unix:///path as unix:/path. The
    # URL passed urls.check: its password holds no unencoded "?" or "#".
    head, hash_, fragment = url.partition("#")
    sep = "" if head.endswith(("?", "&")) else "&" if "?" in head else "?"
    return f"{head}{sep}{added}{hash_}{fragment}"


def _unreachable(url: str, shown: str) -> str | None:
    """Why Redis at ``url`` (the user's ``shown``) does not answer a PING now, if it does
    not."""
    try:
        client = client_from_url(url)
    except Exception:  # noqa: BLE001 - the URL was checked before the run
        return None
    try:
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure to answer is the answer
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())
        return f"cannot reach Redis at {redacted(shown)} during the run ({detail})"
    finally:
        client.close()
    return None


def _run(options: DemoOptions, stopped: Callable[[], str | None]) -> DemoReport:
    progress = Progress(
        TextColumn("[bold]settle demo"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("operations"),
        TimeElapsedColumn(),
        console=console(stderr=True),
        transient=True,
        disable=not sys.stderr.isatty(),  # a bar only where someone watches it
    )
    with progress, errors_as_exit_codes():
        task = progress.add_task("operations", total=options.ops)
        try:
            return run_demo(options, advance=lambda n: progress.advance(task, n))
        except Exception as exc:
            # The server gone mid-run fails whichever part met it first (a worker process,
            # a thread's Redis call): say what happened to it, not what it broke.
            if (why := stopped()) is not None:
                fail(f"{why}: the demo cannot go on", EXIT_UNAVAILABLE)
            if isinstance(exc, DemoError):
                fail(str(exc), EXIT_FAILED)
            raise


def _print(report: DemoReport) -> None:
    out = console()
    out.print(
        f"settle demo: {report.operations} operations, seed {report.seed}, "
        f"{report.workers} workers, {report.elapsed_seconds:.1f} s "
        f"(namespace {report.namespace}, run {report.run})"
    )
    summary = Table(show_header=False)
    summary.add_column("what", style="bold")
    summary.add_column("count", justify="right")
    states = report.states
    rows = [
        ("operations", report.operations),
        ("  completed", states["completed"]),
        ("  failed (declined, replayed)", states["failed"]),
        ("  not settled", states["pending"] + states["provisional"]),
        ("calls of the decorated function", report.calls),
        ("attempts (reservations)", report.attempts),
        ("takeovers after a lease expired", report.takeovers["after_lease_expiry"]),
        ("takeovers after a provisional outcome", report.takeovers["after_provisional"]),
        ("replays (stored outcome, nothing ran)", report.replays),
    ]
    rows += [(f"quarantined: {k}", v) for k, v in report.quarantined.items()]
    rows += [
        ("provider requests", report.provider["requests"]),
        ("provider charges (effects)", report.provider["effects"]),
        ("provider deduplicated (same Idempotency-Key)", report.provider["deduplicated"]),
    ]
    for name, value in rows:
        summary.add_row(name, str(value))
    colour = "green" if report.duplicate_effects == 0 else "red"
    summary.add_row(
        "duplicate downstream effects",
        Text(str(report.duplicate_effects), style=f"bold {colour}"),
        style="bold",
    )
    out.print(summary)
    faults = Table(title="injected faults", title_justify="left")
    for column in ("fault", "injected", "observed", "what settle did"):
        faults.add_column(column, justify="right" if column in ("injected", "observed") else "left")
    for fault in Fault:
        f = report.faults[fault.value]
        faults.add_row(fault.value, str(f.injected), str(f.observed), _WHAT_SETTLE_DID[fault])
    out.print(faults)
    for check in report.checks:
        mark = ("ok  ", "green") if check.ok else ("FAIL", "red")
        out.print(Text.assemble(mark, f" {check.name} ({visible_message(check.detail)})"))
