"""``settle doctor`` through the installed console script, against real servers started with
each bad setting: an evicting policy, no persistence, too few replicas, unserved cluster
slots, a user that may not load scripts; and a deployment that passes every check."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from settle import Settler
from settle._runtime.topology import has_functions
from settle._sessions import SCRIPTS as CONSOLE_SCRIPTS
from settle.embedded import EmbeddedRedis, find_redis_server
from tests.acl import app_user
from tests.cli.conftest import cli_env, settle
from tests.cluster.cluster_support import LocalCluster
from tests.faults.servers import acks


def _doctor(url: str, *args: str) -> tuple[int, dict[str, Any]]:
    done = settle("doctor", "--redis-url", url, *args, "--json")
    assert done.stderr == ""
    report = json.loads(done.stdout)
    return done.returncode, {c["check"]: c for c in report["checks"]}


def _wait_replica(primary: EmbeddedRedis) -> None:
    with redis.Redis.from_url(primary.url) as c:
        deadline = time.monotonic() + 10
        while acks(c) < 1:
            assert time.monotonic() < deadline, "the replica never synced"


@pytest.fixture(scope="module")
def safe() -> Iterator[EmbeddedRedis]:
    """AOF, one replica, noeviction, and a namespace in use: what docs/operations.md asks.
    The replica has AOF too: a failover makes it the primary, with the persistence it has."""
    primary = EmbeddedRedis(extra_args=["--appendonly", "yes"]).start()
    replica_args = ["--appendonly", "yes", "--replicaof", "127.0.0.1", str(primary.port)]
    replica = EmbeddedRedis(extra_args=replica_args).start()
    try:
        _wait_replica(primary)
        with Settler.from_url(primary.url, namespace="payments", shards=8, min_replicas=1) as s:
            s.check()
        yield primary
    finally:
        replica.close()
        primary.close()


def test_a_safe_deployment_passes_every_check_even_strict(safe: EmbeddedRedis) -> None:
    code, checks = _doctor(safe.url, "--namespace", "payments", "--min-replicas", "1", "--strict")
    assert {name: c["status"] for name, c in checks.items()} == {
        "version": "ok",
        "eviction": "ok",
        "memory": "ok",
        "persistence": "ok",
        "replicas": "ok",
        "cluster slots": "ok",
        "namespace": "ok",
        "quarantine": "ok",
        "quarantine age": "ok",
        "quarantine maxlen": "ok",
        "scripts": "ok",
        "clocks": "ok",
    }
    assert code == 0
    kind = "Valkey" if "valkey" in Path(find_redis_server()).name else "Redis"
    assert checks["version"]["detail"].startswith(kind)
    assert "8 shards" in checks["namespace"]["detail"]
    assert "1 on" in checks["replicas"]["detail"]


def test_the_table_names_each_check_and_what_to_change() -> None:
    with EmbeddedRedis() as server:
        done = settle("doctor", "--redis-url", server.url)
    assert done.returncode == 0  # warnings only
    for words in ("version", "eviction", "persistence", "warn", "appendonly yes"):
        assert words in done.stdout
    # The status is styled, not shown as markup (the console interprets none).
    assert "│ warn " in done.stdout
    assert "[/]" not in done.stdout


def test_an_evicting_policy_fails() -> None:
    with EmbeddedRedis(extra_args=["--maxmemory-policy", "allkeys-lru"]) as server:
        code, checks = _doctor(server.url)
    assert code == 1
    assert checks["eviction"]["status"] == "fail"
    assert "allkeys-lru" in checks["eviction"]["detail"]
    assert "noeviction" in checks["eviction"]["fix"]


def test_an_evicting_replica_fails_by_name() -> None:
    # A failover makes the replica the primary, with the policy it has.
    with EmbeddedRedis() as primary:
        replica_args = ["--maxmemory-policy", "volatile-lru", "--replicaof", "127.0.0.1"]
        with EmbeddedRedis(extra_args=[*replica_args, str(primary.port)]) as replica:
            _wait_replica(primary)
            code, checks = _doctor(primary.url)
    assert code == 1
    assert checks["eviction"]["status"] == "fail"
    assert f"volatile-lru on 127.0.0.1:{replica.port}" in checks["eviction"]["detail"]


def test_no_persistence_warns_and_strict_makes_it_fail() -> None:
    with EmbeddedRedis() as server:  # --save "" --appendonly no
        code, checks = _doctor(server.url)
        strict, _ = _doctor(server.url, "--strict")
    assert checks["persistence"]["status"] == "warn"
    assert "appendonly yes" in checks["persistence"]["fix"]
    assert (code, strict) == (0, 1)


def test_rdb_snapshots_only_warn() -> None:
    with EmbeddedRedis(extra_args=["--save", "60", "1"]) as server:
        _, checks = _doctor(server.url)
    assert checks["persistence"]["status"] == "warn"
    assert "RDB snapshots only" in checks["persistence"]["detail"]


def test_a_replica_without_persistence_warns_by_name() -> None:
    # A failover makes the replica the primary, with the persistence it has: its next restart
    # would lose every record, and doctor is the place to hear it before the failover.
    with EmbeddedRedis(extra_args=["--appendonly", "yes"]) as primary:
        replica_args = ["--replicaof", "127.0.0.1", str(primary.port)]
        with EmbeddedRedis(extra_args=replica_args) as replica:  # --save "" --appendonly no
            _wait_replica(primary)
            code, checks = _doctor(primary.url)
            strict, _ = _doctor(primary.url, "--strict")
    assert checks["persistence"]["status"] == "warn"
    assert f"127.0.0.1:{replica.port}" in checks["persistence"]["detail"]
    assert "failover" in checks["persistence"]["detail"]
    assert "appendonly yes" in checks["persistence"]["fix"]
    assert (code, strict) == (0, 1)


def test_a_replica_with_rdb_snapshots_only_warns_by_name() -> None:
    with EmbeddedRedis(extra_args=["--appendonly", "yes"]) as primary:
        replica_args = ["--save", "60", "1", "--replicaof", "127.0.0.1", str(primary.port)]
        with EmbeddedRedis(extra_args=replica_args) as replica:
            _wait_replica(primary)
            _, checks = _doctor(primary.url)
    assert checks["persistence"]["status"] == "warn"
    assert (
        f"RDB snapshots only on replica 127.0.0.1:{replica.port}"
        in (checks["persistence"]["detail"])
    )


def test_a_shard_count_other_than_the_namespaces_fails(safe: EmbeddedRedis) -> None:
    code, checks = _doctor(safe.url, "--namespace", "payments", "--shards", "4")
    assert code == 1
    assert checks["namespace"]["status"] == "fail"
    assert "shards=8" in checks["namespace"]["fix"]


def test_fewer_replicas_than_min_replicas_fails(safe: EmbeddedRedis) -> None:
    code, checks = _doctor(safe.url, "--namespace", "payments", "--min-replicas", "2")
    assert code == 1
    assert checks["replicas"]["status"] == "fail"
    assert "min_replicas is 2" in checks["replicas"]["detail"]


def test_a_user_that_may_not_load_scripts_fails() -> None:
    with EmbeddedRedis() as server:
        code, checks = _doctor(app_user(server, "+@all", "-@scripting"))
    assert code == 1
    assert checks["scripts"]["status"] == "fail"
    assert "+@scripting" in checks["scripts"]["fix"]


def test_a_user_that_may_not_load_function_libraries_warns() -> None:
    """On Redis 7+ and Valkey settle runs its scripts as FUNCTION libraries; a user denied
    FUNCTION LOAD still works (the runner keeps EVALSHA), so the check warns. On 6.2 there
    is nothing to load: the check passes."""
    with EmbeddedRedis() as server:
        with redis.Redis.from_url(server.url) as raw:
            functions = has_functions(raw.info("server"))
        url = app_user(server, "+@all", *(["-function"] if functions else []))
        code, checks = _doctor(url)
        strict, _ = _doctor(url, "--strict")
    assert code == 0  # warnings only
    if functions:
        assert checks["scripts"]["status"] == "warn"
        assert "FUNCTION LOAD was refused" in checks["scripts"]["detail"]
        assert "+function|load" in checks["scripts"]["fix"]
        assert strict == 1
    else:
        assert checks["scripts"]["status"] == "ok"
        assert checks["scripts"]["detail"] == "every settle script loads"


def test_a_cluster_with_unserved_slots_fails() -> None:
    cluster = LocalCluster(primaries=3).start()
    try:
        code, checks = _doctor(cluster.url)
        assert checks["cluster slots"]["status"] == "ok"
        assert "3 nodes" in checks["cluster slots"]["detail"]
        assert "oldest of 3 nodes" in checks["version"]["detail"]
        assert code == 0
        with cluster.client(2) as c:
            c.execute_command("CLUSTER DELSLOTS", *range(16000, 16384))
        deadline = time.monotonic() + 10
        while True:
            code, checks = _doctor(cluster.url)
            if checks["cluster slots"]["status"] == "fail" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert code == 1
        assert "16000-16383" in checks["cluster slots"]["detail"]
    finally:
        cluster.close()


def test_an_unreachable_server_exits_3() -> None:
    done = settle("doctor", "--redis-url", "redis://127.0.0.1:1/0")
    assert done.returncode == 3
    assert "cannot reach Redis" in done.stderr


def test_corrupt_namespace_metadata_is_a_failed_check_not_a_traceback() -> None:
    """Found in review: a stored shard count that is not a number crashed doctor."""
    with EmbeddedRedis() as server:
        with redis.Redis.from_url(server.url) as raw:
            raw.hset("settle:{payments}:meta", "shards", "zz")
        code, checks = _doctor(server.url, "--namespace", "payments")
    assert code == 1
    assert checks["namespace"]["status"] == "fail"
    assert "corrupt" in checks["namespace"]["detail"]


def test_aof_with_appendfsync_no_warns() -> None:
    """Found in review: AOF with appendfsync no passed as safe as appendfsync always."""
    for fsync, status in (("always", "ok"), ("no", "warn")):
        with EmbeddedRedis(extra_args=["--appendonly", "yes", "--appendfsync", fsync]) as server:
            _, checks = _doctor(server.url)
        assert checks["persistence"]["status"] == status, fsync
    assert "appendfsync no" in checks["persistence"]["detail"]
    assert "crash" in checks["persistence"]["detail"]
    assert "everysec" in checks["persistence"]["fix"]


def test_shard_states_lost_under_surviving_metadata_warn() -> None:
    """Hunt: the states of some shards gone while the metadata survived (one cluster node
    restarted without persistence, a DEL) took their records with them; doctor said ok."""
    with EmbeddedRedis() as server:
        with Settler.from_url(server.url, namespace="payments", shards=4) as s:
            s.check()
        with redis.Redis.from_url(server.url) as raw:
            seconds, _ = raw.time()  # first used 10 minutes ago
            raw.hset("settle:{payments}:meta", "created", seconds * 1000 - 600_000)
            raw.delete("settle:{payments:1}:gen", "settle:{payments:3}:gen")
            code, checks = _doctor(server.url, "--namespace", "payments")
            assert (code, checks["namespace"]["status"]) == (0, "warn")
            assert "2 without state (shards 1, 3)" in checks["namespace"]["detail"]
            assert "lost them" in checks["namespace"]["detail"]
            # A namespace made moments ago may still be claiming its shards: nothing said.
            raw.hset("settle:{payments}:meta", "created", seconds * 1000)
            _, checks = _doctor(server.url, "--namespace", "payments")
            assert checks["namespace"]["status"] == "ok"


def test_metadata_that_disagrees_with_the_shard_states_fails() -> None:
    """Found in review: metadata lost, then re-created with another count, locks out every
    settler; doctor compared it with --shards only and reported it ok."""
    with EmbeddedRedis() as server:
        with Settler.from_url(server.url, namespace="payments", shards=4) as s:
            s.check()
        with redis.Redis.from_url(server.url) as raw:
            raw.hset("settle:{payments}:meta", "shards", "2")
            code, checks = _doctor(server.url, "--namespace", "payments")
            assert code == 1
            assert checks["namespace"]["status"] == "fail"
            assert "metadata says 2 shards" in checks["namespace"]["detail"]
            assert "shard states say 4 (shards 0, 1)" in checks["namespace"]["detail"]
            assert "HSET" in checks["namespace"]["fix"]

            raw.delete("settle:{payments}:meta")  # lost: the shard states still say 4
            code, checks = _doctor(server.url, "--namespace", "payments")
            assert checks["namespace"]["status"] == "warn"
            assert "shard states say 4 shards" in checks["namespace"]["detail"]
            assert "shards=4" in checks["namespace"]["fix"]


def test_a_shard_state_of_another_type_fails_naming_the_key() -> None:
    """Found in review: a shard state that is not a hash was read as a shard count named
    '(not a hash)' (a warning to configure shards=(not a hash), or a fix to the metadata),
    where every settler call on that shard is refused."""
    with EmbeddedRedis() as server:
        with Settler.from_url(server.url, namespace="payments", shards=4) as s:
            s.check()
        with redis.Redis.from_url(server.url) as raw:
            state = "settle:{payments:1}:gen"
            raw.delete(state)
            raw.set(state, "oops")
            for lost_metadata in (False, True):
                if lost_metadata:
                    raw.delete("settle:{payments}:meta")
                code, checks = _doctor(server.url, "--namespace", "payments")
                assert code == 1
                assert checks["namespace"]["status"] == "fail"
                assert state in checks["namespace"]["detail"]
                assert "not a hash" in checks["namespace"]["detail"]
                assert "HSET settle:{<ns>}:meta" not in checks["namespace"]["fix"]


def test_a_password_in_the_url_query_is_shown_as_stars() -> None:
    # redis-py reads ?password= as it reads the userinfo's; doctor printed it in clear in
    # its title and in --json "url".
    with EmbeddedRedis() as server:
        with redis.Redis.from_url(server.url) as raw:
            raw.acl_setuser(
                "ops",
                enabled=True,
                passwords=["+pw-secret-42"],
                keys=["*"],
                channels=["*"],
                commands=["+@all"],
            )
        url = f"redis://127.0.0.1:{server.port}/0?username=ops&password=pw-secret-42"
        done = settle("doctor", "--redis-url", url, "--json")
        table = settle("doctor", "--redis-url", url)
    assert "pw-secret-42" not in done.stdout + done.stderr + table.stdout + table.stderr
    report = json.loads(done.stdout)
    assert report["url"] == f"redis://127.0.0.1:{server.port}/0?username=ops&password=***"
    assert "password=***" in table.stdout


def test_doctor_loads_the_consoles_scripts_and_library(valkey: EmbeddedRedis) -> None:
    """Doctor loads every settle script and library, the console's sessions' too: an admin
    who runs it leaves them on the server for a user that may not load them (docs/cli.md).
    It listed the core's, the cursor's and progress's only."""
    code, checks = _doctor(valkey.url)
    assert code == 0
    assert checks["scripts"]["status"] == "ok"
    with redis.Redis.from_url(valkey.url) as raw:
        libraries = {entry[1].decode() for entry in raw.function_list()}
        shas = [raw.script_load(CONSOLE_SCRIPTS.source(n)) for n in CONSOLE_SCRIPTS.names]
        raw.script_flush()
        assert CONSOLE_SCRIPTS.library_name in libraries
        _doctor(valkey.url)
        assert raw.script_exists(*shas) == [True] * len(shas)


def test_a_user_that_may_not_load_functions_is_told_the_consoles_library_too(
    valkey: EmbeddedRedis,
) -> None:
    """A refused FUNCTION LOAD names every library that is not loaded, the console's too:
    the console's sessions run as FCALL of a library of their own."""
    code, checks = _doctor(app_user(valkey, "+@all", "-function"))
    assert code == 0  # a warning
    assert checks["scripts"]["status"] == "warn"
    assert f"{CONSOLE_SCRIPTS.library_name}@" in checks["scripts"]["detail"]


def test_doctor_runs_without_the_web_extra(valkey: EmbeddedRedis) -> None:
    """The console's scripts are checked without importing ``settle.web``, which needs the
    ``web`` extra (starlette, jinja2): doctor works where only the ``cli`` extra is."""
    without_web = (
        "import sys\n"
        "sys.modules.update(starlette=None, jinja2=None)  # what import finds without them\n"
        "from settle.cli import main\n"
        "main(['doctor', '--redis-url', sys.argv[1], '--json'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", without_web, valkey.url],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    checks = {c["check"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["scripts"]["status"] == "ok"
    with redis.Redis.from_url(valkey.url) as raw:
        libraries = {entry[1].decode() for entry in raw.function_list()}
    assert CONSOLE_SCRIPTS.library_name in libraries


@pytest.mark.parametrize("namespace", ["a b", "", "x" * 65, "pay{ments}"])
def test_a_namespace_settle_cannot_use_is_refused_before_anything_is_checked(
    safe: EmbeddedRedis, namespace: str
) -> None:
    """doctor warned "'a b' has no metadata yet" for a namespace every settler refuses: a
    deployment check that passes with a namespace the services cannot be started with."""
    done = settle("doctor", "--redis-url", safe.url, "--namespace", namespace, "--json")
    assert done.returncode == 2
    assert done.stdout == ""
    assert "bad --namespace: must be 1 to 64 characters" in done.stderr


def test_shard_states_lost_on_one_cluster_node_warn() -> None:
    """Found in review: the lost-state warning was tried on a single server only; on a
    cluster the metadata and the shard states live on other nodes, and the metadata's age is
    read with a TIME routed to the metadata's node."""
    cluster = LocalCluster(primaries=3).start()
    try:
        with Settler.from_cluster(cluster.url, namespace="payments", shards=4) as s:
            s.check()
        with redis.RedisCluster.from_url(cluster.url) as raw:
            _, checks = _doctor(cluster.url, "--namespace", "payments")
            assert checks["namespace"]["status"] == "ok", checks["namespace"]
            seconds, _ = raw.time(target_nodes=raw.get_node_from_key("settle:{payments}:meta"))
            raw.hset("settle:{payments}:meta", "created", seconds * 1000 - 600_000)
            raw.delete("settle:{payments:2}:gen")
            code, checks = _doctor(cluster.url, "--namespace", "payments")
    finally:
        cluster.close()
    assert (code, checks["namespace"]["status"]) == (0, "warn"), checks["namespace"]
    assert "1 without state (shard 2)" in checks["namespace"]["detail"]
