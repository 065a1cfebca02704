"""``settle doctor`` run as a user the ACL denies ``TIME``: the clocks check says it could not
read them (a warning), and every other check still runs. The namespace check, which reads the
metadata's age on the server clock (a shard without state under metadata older than 5
minutes), made a denied ``TIME`` end doctor as "cannot reach Redis" (exit 3)."""

from __future__ import annotations

import json

from settle import Settler
from settle.embedded import EmbeddedRedis
from tests.acl import app_user
from tests.cli.conftest import settle
from tests.cli.helpers import stale_settlement


def test_a_user_denied_time_gets_every_check_and_no_cannot_reach() -> None:
    with EmbeddedRedis() as server:
        with Settler.from_url(server.url, namespace="payments", shards=4) as s:
            s.check()
        url = app_user(server, "+@all", "-time")
        done = settle("doctor", "--redis-url", url, "--namespace", "payments", "--json")
    assert "cannot reach" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr
    checks = {c["check"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["namespace"]["status"] == "ok", checks["namespace"]
    assert "4 shards" in checks["namespace"]["detail"]
    assert checks["clocks"]["status"] == "warn", checks["clocks"]


def test_a_user_denied_time_gets_the_quarantine_rows_as_not_read() -> None:
    """Every settle script reads the server's clock, so a user denied ``TIME`` reads no
    quarantine entry: the age row says it could not read them and points at the rows above
    (the clocks row names ``TIME``), rather than dating the entry by this machine's clock."""
    with EmbeddedRedis() as server:
        with Settler.from_url(server.url, namespace="payments", shards=2) as s:
            stale_settlement(s, "order-1")
        url = app_user(server, "+@all", "-time")
        done = settle("doctor", "--redis-url", url, "--namespace", "payments", "--json")
    checks = {c["check"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["clocks"]["status"] == "warn", checks["clocks"]
    age = checks["quarantine age"]
    assert age["status"] == "warn", age
    assert age["detail"].startswith("could not be read"), age
    assert "see the rows above" in age["fix"], age
