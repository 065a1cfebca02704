"""The CLI on a server whose ``maxmemory-policy`` evicts (issue 20, SPEC 4: refused "before
the first write"): the read commands read, the writing ones are refused. The read commands
were refused too ("...or pass allow_eviction=True", an option the CLI does not have), so the
evidence the policy puts at risk could not be exported until the policy was changed, and
``settle doctor``'s quarantine rows said "could not be read"."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import redis

from settle import Settler
from settle._core.keys import Keys, shard_of
from settle.cursor import CursorStore
from settle.embedded import EmbeddedRedis
from tests.cli.conftest import SETTLE, cli_env, settle
from tests.cli.helpers import stale_settlement


def test_read_commands_read_an_evicting_server_and_writing_ones_are_refused() -> None:
    with EmbeddedRedis(extra_args=["--maxmemory-policy", "allkeys-lru"]) as server:
        with Settler.from_url(server.url, namespace="ev", shards=2, allow_eviction=True) as writer:
            ref = stale_settlement(writer, "order-1")
        where = ("--redis-url", server.url, "--namespace", "ev")
        listed = settle("quarantine", "ls", *where, "--json")
        assert listed.returncode == 0, listed.stderr
        assert [e["ref"] for e in json.loads(listed.stdout)] == [ref]
        for args in (
            ("quarantine", "show", ref, "--json"),
            ("quarantine", "export"),
            ("inspect", "order-1", "--json"),
        ):
            done = settle(*args, *where)
            assert done.returncode == 0, (args, done.stderr)
            assert ref in done.stdout, args
        counted = settle("stats", *where, "--json")
        assert counted.returncode == 0, counted.stderr
        assert json.loads(counted.stdout)["quarantine"]["total"] == 1
        with redis.Redis.from_url(server.url) as client:
            before = {k: client.dump(k) for k in client.keys("*")}
            for args in (
                ("quarantine", "resolve", ref, "--note", "refunded"),
                ("quarantine", "trim", "--resolved"),
            ):
                done = settle(*args, *where)
                assert done.returncode != 0, args
                assert "allkeys-lru" in done.stderr, (args, done.stderr)
            assert {k: client.dump(k) for k in client.keys("*")} == before
        doctor = settle("doctor", *where, "--json")
        checks = {c["check"]: c for c in json.loads(doctor.stdout)["checks"]}
        assert checks["eviction"]["status"] == "fail"
        assert checks["quarantine"]["status"] == "ok", checks["quarantine"]
        assert checks["quarantine age"]["detail"].startswith("1 unresolved")


def test_the_read_commands_write_nothing_where_a_shard_state_was_evicted() -> None:
    """The read commands opened a settler that claims every shard before its first call, so
    where the policy had evicted a shard's state, ``quarantine ls`` (or ``show``, ``export``,
    ``inspect``, ``stats``) made it again: a write on the server they are let read because
    they write nothing, and it hid the loss from the application's next write on that shard,
    which says it (``settle.namespace.state_lost``) only when it finds the state gone."""
    with EmbeddedRedis(extra_args=["--maxmemory-policy", "allkeys-lru"]) as server:
        with Settler.from_url(server.url, namespace="ev", shards=2, allow_eviction=True) as writer:
            ref = stale_settlement(writer, "order-1")
        where = ("--redis-url", server.url, "--namespace", "ev")
        with redis.Redis.from_url(server.url) as client:
            # The shard that does not hold order-1's record lost its state (evicted).
            assert client.delete(Keys("ev", 2).generation(1 - shard_of("order-1", 2))) == 1
            before = {k: client.dump(k) for k in client.keys("*")}
            for args in (
                ("quarantine", "ls", "--json"),
                ("quarantine", "show", ref, "--json"),
                ("quarantine", "export"),
                ("inspect", "order-1", "--json"),
                ("stats", "--json"),
            ):
                done = settle(*args, *where)
                assert done.returncode == 0, (args, done.stderr)
                assert {k: client.dump(k) for k in client.keys("*")} == before, args


def test_a_read_command_checks_the_shard_states_count_without_claiming() -> None:
    """Read without claiming, the shards' states are still checked: metadata made again with
    4 shards over states made for 16 is refused (exit 3) by every read command, which writes
    nothing, rather than reading 4 shards' keys of a 16-shard namespace."""
    with EmbeddedRedis() as server:
        with Settler.from_url(server.url, namespace="re", shards=16) as writer:
            writer.reserve("op-1", {"i": 1}, principal="p")
        where = ("--redis-url", server.url, "--namespace", "re")
        with redis.Redis.from_url(server.url) as client:
            client.hset(Keys("re", 16).meta, "shards", 4)
            before = {k: client.dump(k) for k in client.keys("*")}
            for args in (("quarantine", "ls", "--json"), ("inspect", "op-1"), ("stats",)):
                done = settle(*args, *where)
                assert done.returncode == 3, (args, done.stdout, done.stderr)
                assert "created for 16 shards" in done.stderr, (args, done.stderr)
                assert "settle doctor" in done.stderr, (args, done.stderr)
            assert {k: client.dump(k) for k in client.keys("*")} == before


def test_the_companions_read_commands_read_an_evicting_server() -> None:
    """The other parts' read commands (``cursor show``, ``cursor witnesses``, ``progress
    show``) were still refused there (exit 3, "Set maxmemory-policy noeviction"), as the
    quarantine's were: they read, and write nothing."""
    with EmbeddedRedis(extra_args=["--maxmemory-policy", "allkeys-lru"]) as server:
        with CursorStore.from_url(server.url, namespace="ev", allow_eviction=True) as store:
            store.start("orders", b"cursor-0", boundary=7)
        where = ("--redis-url", server.url, "--namespace", "ev")
        with redis.Redis.from_url(server.url) as client:
            before = {k: client.dump(k) for k in client.keys("*")}
            shown = settle("cursor", "show", "orders", "--json", *where)
            assert shown.returncode == 0, shown.stderr
            assert json.loads(shown.stdout)["boundary"] == 7
            listed = settle("cursor", "witnesses", "orders", "--json", *where)
            assert listed.returncode == 0, listed.stderr
            progress = settle("progress", "show", "billing", *where)
            assert progress.returncode == 1, progress.stderr  # none recorded, not refused
            assert "no progress recorded" in progress.stderr
            assert {k: client.dump(k) for k in client.keys("*")} == before


def test_quarantine_tail_follows_an_evicting_server() -> None:
    """``quarantine tail`` is one of the read commands let read there (it was refused)."""
    with EmbeddedRedis(extra_args=["--maxmemory-policy", "allkeys-lru"]) as server:
        with Settler.from_url(server.url, namespace="ev", shards=2, allow_eviction=True) as writer:
            ref = stale_settlement(writer, "order-1")
        proc = subprocess.Popen(
            [str(SETTLE), "quarantine", "tail", "--since", "1h", "--json", "--interval", "0.1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(SETTLE_REDIS_URL=server.url, SETTLE_NAMESPACE="ev"),
        )
        try:
            assert proc.stderr is not None
            ready = proc.stderr.readline()
            assert ready.startswith("following the quarantine of ev"), ready
            time.sleep(1)  # a few polls
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            out, said = proc.communicate(timeout=30)
        assert proc.returncode == 0, said
        assert [json.loads(line)["ref"] for line in out.splitlines()] == [ref]
