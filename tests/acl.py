"""A Redis user of the tests' own: every key and channel, the commands a test allows."""

from __future__ import annotations

import redis

from settle.embedded import EmbeddedRedis


def app_user(server: EmbeddedRedis, *commands: str, name: str = "app") -> str:
    """Create (or replace the rules of) user ``name``, password ``pw``, allowed every key
    and channel and ``commands`` (ACL rules such as ``+@all``, ``-exists``); its URL."""
    with redis.Redis.from_url(server.url) as raw:
        raw.acl_setuser(
            name,
            enabled=True,
            passwords=["+pw"],
            keys=["*"],
            channels=["*"],
            commands=list(commands),
        )
    return f"redis://{name}:pw@127.0.0.1:{server.port}/0"
