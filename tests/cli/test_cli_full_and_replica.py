"""Two servers an operator meets at 3 a.m.: one full (``maxmemory`` reached, ``noeviction``:
every settle write refused with OOM), of which ``settle doctor`` said nothing (exit 0), and
a replica, refused by the read commands with the library's advice to "use from_sentinel", a
Python call the command line has no way to make."""

from __future__ import annotations

import json
import time

import pytest
import redis

from settle import Settler
from settle.embedded import EmbeddedRedis
from tests.cli.conftest import settle


def _fill(c: redis.Redis) -> None:
    """Write until the server refuses a write: its memory is full."""
    for i in range(100_000):
        try:
            c.set(f"fill{i}", "x" * 1000)
        except redis.exceptions.OutOfMemoryError:
            return
    pytest.fail("the server never refused a write")


def test_doctor_fails_a_node_whose_memory_is_full() -> None:
    with EmbeddedRedis(extra_args=["--maxmemory", "4mb"]) as server:
        with redis.Redis.from_url(server.url) as c:
            _fill(c)
        done = settle("doctor", "--redis-url", server.url, "--json")
        checks = {c["check"]: c for c in json.loads(done.stdout)["checks"]}
        assert checks["memory"]["status"] == "fail", checks["memory"]
        assert f"127.0.0.1:{server.port} uses" in checks["memory"]["detail"]
        assert "maxmemory" in checks["memory"]["fix"]
        assert done.returncode == 1


def test_doctor_passes_memory_with_room_or_no_limit() -> None:
    with EmbeddedRedis(extra_args=["--maxmemory", "512mb"]) as server:
        done = settle("doctor", "--redis-url", server.url, "--json")
        checks = {c["check"]: c for c in json.loads(done.stdout)["checks"]}
        assert checks["memory"]["status"] == "ok", checks["memory"]
        assert "of maxmemory 512 MiB" in checks["memory"]["detail"]


def test_a_replica_is_refused_in_command_line_terms() -> None:
    with EmbeddedRedis() as primary:
        with Settler.from_url(primary.url, namespace="rep", shards=2) as s:
            s.check()
        args = ["--replicaof", "127.0.0.1", str(primary.port)]
        with EmbeddedRedis(extra_args=args) as replica:
            time.sleep(0.5)
            for command in (("stats",), ("quarantine", "ls"), ("inspect", "x")):
                done = settle(*command, "--redis-url", replica.url, "--namespace", "rep")
                assert done.returncode == 3, done.stderr
                assert f"replica of 127.0.0.1:{primary.port}" in done.stderr
                assert "from_sentinel" not in done.stderr
                assert "redis+sentinel://" in done.stderr


def test_doctor_on_a_replica_says_what_to_pass_in_command_line_terms() -> None:
    """doctor's own replicas row told an operator to "use from_sentinel", a Python call, as
    the read commands did before: it names the primary's URL or a redis+sentinel:// URL."""
    with EmbeddedRedis() as primary:
        args = ["--replicaof", "127.0.0.1", str(primary.port)]
        with EmbeddedRedis(extra_args=args) as replica:
            time.sleep(0.5)
            done = settle("doctor", "--redis-url", replica.url, "--json")
    row = {c["check"]: c for c in json.loads(done.stdout)["checks"]}["replicas"]
    assert row["status"] == "fail", row
    assert "redis+sentinel://" in row["fix"]
    assert "use from_sentinel" not in row["fix"]
    assert done.returncode == 1
