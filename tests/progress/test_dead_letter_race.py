"""A delivery dead-lettered by one worker while another worker's effect for it runs: the
effect happened, so its emission counts as applied and is never run again (found in
review: the emission was left unapplied, so a replay of the dead letter re-ran it)."""

from __future__ import annotations

from typing import Any

import redis

from settle.embedded import EmbeddedRedis
from settle.progress import ProgressStore, StreamConsumer


def _worker(
    stream: EmbeddedRedis, progress: EmbeddedRedis, names: Any, name: str
) -> StreamConsumer:
    return StreamConsumer(
        redis.Redis.from_url(stream.url),
        ProgressStore.from_url(progress.url, consumer=names.consumer, namespace=names.namespace),
        stream=names.stream,
        group=names.group,
        worker=name,
        max_deliveries=1,
        claim_idle=0.001,
        block=0.01,
    )


def test_an_effect_that_ran_while_its_delivery_was_dead_lettered_is_not_run_again(
    stream_server: EmbeddedRedis,
    progress_server: EmbeddedRedis,
    stream_client: redis.Redis,
    names: Any,
) -> None:
    stream_client.xadd(names.stream, {"emission_id": "e1"})
    a = _worker(stream_server, progress_server, names, "a")
    b = _worker(stream_server, progress_server, names, "b")
    a.start()
    b.start()
    ran: list[tuple[str, str]] = []

    def effect_a(ctx: Any) -> None:
        # While A's effect runs, B reclaims the delivery past the limit and dead-letters it.
        b.poll(lambda c: ran.append(("b", c.emission.value)))
        ran.append(("a", ctx.emission.value))

    a.poll(effect_a)
    assert ran == [("a", "e1")]
    # The same emission published again (a replay of the dead letter): not applied twice.
    stream_client.xadd(names.stream, {"emission_id": "e1"})
    c = _worker(stream_server, progress_server, names, "c")
    c.start()
    c.poll(lambda ctx: ran.append(("c", ctx.emission.value)))
    assert ran == [("a", "e1")]
