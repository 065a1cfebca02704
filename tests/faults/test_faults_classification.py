"""Which Redis errors settle repeats (SPEC 11): the exception classes redis-py raises, with
the messages real servers send, sorted into transient (repeat the call) or not."""

from __future__ import annotations

import pytest
from redis import exceptions as rx

from settle import BackendError, ConfigurationError
from settle._core.engine import Call
from settle._runtime.transient import backend_error, is_transient

pytestmark = [pytest.mark.faults]

CALL = Call("complete", ("k",), (), operation_id="op-1", attempt_id="a-1")


@pytest.mark.parametrize(
    "exc",
    [
        rx.ConnectionError("Connection closed by server."),
        rx.TimeoutError("Timeout reading from socket"),
        rx.BusyLoadingError("Redis is loading the dataset in memory"),
        rx.TryAgainError("Multiple keys request during rehashing of slot"),
        rx.ClusterDownError("The cluster is down"),
        rx.MasterDownError("Link with MASTER is down and replica-serve-stale-data is set to 'no'"),
    ],
    ids=type,
)
def test_transient_failures_are_repeated(exc: rx.RedisError) -> None:
    assert is_transient(exc)
    error = backend_error(exc, CALL)
    assert isinstance(error, BackendError)
    assert "after 4 tries" in str(error)
    assert error.operation_id == "op-1"


@pytest.mark.parametrize(
    "exc",
    [
        rx.ResponseError("Error running script (call to f_abc): @user_script:1: oops"),
        rx.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
        rx.NoScriptError("No matching script. Please use EVAL."),
        rx.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
        rx.ReadOnlyError("You can't write against a read only replica."),
        rx.DataError("Invalid input of type: 'dict'"),
    ],
    ids=type,
)
def test_a_scripts_own_error_and_bad_data_are_not_repeated(exc: rx.RedisError) -> None:
    assert not is_transient(exc)
    error = backend_error(exc, CALL)
    assert isinstance(error, BackendError)
    assert "tries" not in str(error)


@pytest.mark.parametrize(
    "exc",
    [
        rx.AuthenticationError("invalid username-password pair or user is disabled."),
        rx.AuthenticationError("Authentication required."),
        rx.AuthorizationError("NOPERM this user has no permissions to run the 'evalsha' command"),
        rx.NoPermissionError("NOPERM this user has no permissions to access one of the keys"),
        rx.ResponseError("SELECT is not allowed in cluster mode"),
        rx.RedisClusterException("All slots are not covered after query all startup_nodes."),
    ],
    ids=lambda e: str(e)[:20],
)
def test_misconfiguration_is_a_configuration_error_and_never_repeated(
    exc: rx.RedisError,
) -> None:
    assert not is_transient(exc)
    assert isinstance(backend_error(exc, CALL), ConfigurationError)


@pytest.mark.parametrize(
    "text",
    [
        # a script's own error naming a refusal's code, not a refusal by the server
        "Error running script (call to f_1): @user_script:3: user_script:3: Script attempted "
        "to access nonexistent global variable 'OOM'",
        "Error running script (call to f_1): @user_script:3: bad argument NOREPLICAS",
    ],
)
def test_a_scripts_own_error_naming_a_refusal_code_is_no_refused_write(text: str) -> None:
    error = backend_error(rx.ResponseError(text), CALL)
    assert isinstance(error, BackendError)
    assert error.code == "ERR"
    assert "Nothing was written" not in str(error)
