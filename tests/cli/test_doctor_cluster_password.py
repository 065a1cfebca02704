"""``settle doctor`` on a Redis Cluster whose password (or ACL user name) holds characters a
URL must percent-encode (``@ / # :``): the namespace check reads the namespace with the
credentials the URL gave, and no part of the password is ever printed."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest

from settle import Settler
from tests.cli.conftest import settle
from tests.cluster.cluster_support import LocalCluster

PASSWORD = "Kq@zhost/9#x:Tw"


@pytest.mark.parametrize("user", ["", "ops/eu#1"], ids=["password", "user"])
def test_doctor_reads_the_namespace_of_a_cluster_whose_credentials_need_encoding(
    user: str,
) -> None:
    cluster = LocalCluster(primaries=3).start()
    try:
        for i in range(3):
            with cluster.client(i) as c:
                if user:
                    c.acl_setuser(
                        user,
                        enabled=True,
                        passwords=[f"+{PASSWORD}"],
                        keys=["*"],
                        channels=["*"],
                        commands=["+@all"],
                    )
                else:
                    c.config_set("requirepass", PASSWORD)
        port = cluster.nodes[0].port
        creds = f"{quote(user, safe='')}:{quote(PASSWORD, safe='')}"
        url = f"redis://{creds}@127.0.0.1:{port}/0"
        with Settler.from_url(url, namespace="payments", shards=4) as s:
            s.check()
        done = settle("doctor", "--redis-url", url, "--namespace", "payments", "--json")
        # The cluster client was built from a URL with the credentials put back unencoded:
        # "'payments' could not be read (... Error -2 connecting to zhost:6379 ...)", a
        # part of the password printed as a host name (a user "ops/eu#1": host "ops").
        for part in ("zhost", "Kq", "Tw", PASSWORD):
            assert part not in done.stdout + done.stderr
        checks = {c["check"]: c for c in json.loads(done.stdout)["checks"]}
        assert checks["namespace"]["status"] == "ok", checks["namespace"]
        assert "4 shards" in checks["namespace"]["detail"], checks["namespace"]
    finally:
        cluster.close()
