"""A demotion is seen behind the errors that carry it (settle._runtime.topology).

redis-py's Sentinel connection raises its own ConnectionError from the READONLY it met, and
the async pipelined lane hands each call of a batch a copy of the batch's error whose
``__cause__`` is that ConnectionError: the READONLY is two links away. Found by review: the
runner looked one link back only, so a pipelined call did not close the demoted node's
kept connections.
"""

from __future__ import annotations

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError, ResponseError

from settle._runtime.topology import demoted_behind


def _raised_from(error: BaseException, context: BaseException | None) -> BaseException:
    try:
        try:
            if context is not None:
                raise context
        finally:
            raise error
    except BaseException as caught:
        return caught


def test_a_sentinel_connection_error_from_readonly_is_a_demotion() -> None:
    error = _raised_from(RedisConnectionError("previous master is now a slave"), ReadOnlyError())
    assert demoted_behind(error)


def test_a_pipelined_copy_of_that_error_is_a_demotion() -> None:
    batch = _raised_from(RedisConnectionError("previous master is now a slave"), ReadOnlyError())
    copy = RedisConnectionError(*batch.args)
    copy.__cause__ = batch
    assert demoted_behind(copy)


def test_redis_6_scripts_readonly_behind_an_error_is_a_demotion() -> None:
    script = ResponseError("Error running script: -READONLY You can't write against a replica.")
    assert demoted_behind(_raised_from(RedisConnectionError("lost"), script))


def test_other_connection_errors_are_not() -> None:
    assert not demoted_behind(RedisConnectionError("Connection refused"))
    assert not demoted_behind(_raised_from(RedisConnectionError("reset"), OSError("EPIPE")))
    looped = RedisConnectionError("a")
    looped.__cause__ = looped
    assert not demoted_behind(looped)


def test_a_readonly_any_number_of_causes_behind_is_a_demotion() -> None:
    """Every link is followed, ``__cause__`` as ``__context__``: a copy of a copy."""
    inner = RedisConnectionError("previous master is now a slave")
    inner.__cause__ = ReadOnlyError("READONLY You can't write against a read only replica.")
    outer = RedisConnectionError(*inner.args)
    outer.__cause__ = inner
    assert demoted_behind(outer)
