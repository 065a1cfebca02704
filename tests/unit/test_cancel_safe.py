"""A failed write on the Python 3.11 cancellation-safe send path is a ConnectionError,
whatever the ``OSError`` holds (settle/_runtime/cancel_safe.py).

The mapping unpacked ``exc.args[:2]``, so an ``OSError()`` without arguments became a
``ValueError`` that no retry and no ``BackendError`` caught. No real socket raises one on
demand, so the mapping is given real ``OSError`` instances directly.
"""

from __future__ import annotations

import pytest
from redis import exceptions as rx

from settle._runtime.cancel_safe import write_error
from settle._runtime.transient import backend_error, is_transient
from settle.errors import BackendError


@pytest.mark.parametrize(
    ("exc", "words"),
    [
        (OSError(), "Error UNKNOWN while writing to socket. OSError."),
        (ConnectionResetError("Connection lost"), "Error UNKNOWN while writing to socket. Co"),
        (BrokenPipeError(32, "Broken pipe"), "Error 32 while writing to socket. Broken pipe."),
        (OSError(104, "Connection reset by peer", "x"), "Error 104 while writing"),
    ],
    ids=["no-args", "one-arg", "errno", "three-args"],
)
def test_every_oserror_of_a_write_is_a_connection_error_the_runtime_retries(
    exc: OSError, words: str
) -> None:
    mapped = write_error(exc)
    assert type(mapped) is rx.ConnectionError
    assert str(mapped).startswith(words)
    assert is_transient(mapped)  # repeated by the runtime, then reported as:
    assert isinstance(backend_error(mapped, None), BackendError)
