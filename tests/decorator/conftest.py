from __future__ import annotations

from collections.abc import Iterator

import pytest
import tenacity

from tests.decorator.provider import Provider


@pytest.fixture
def provider() -> Iterator[Provider]:
    with Provider() as p:
        yield p


@pytest.fixture
def fast_retry() -> tenacity.Retrying:
    """Three attempts, 50 ms apart: the default policy's shape, with test-sized waits."""
    return tenacity.Retrying(
        stop=tenacity.stop_after_attempt(3),
        wait=tenacity.wait_fixed(0.05),
        retry=tenacity.retry_if_exception_type(Exception),
    )


@pytest.fixture
def patient_retry() -> tenacity.Retrying:
    """Five attempts, 50 ms apart: for tests whose attempts time out on purpose."""
    return tenacity.Retrying(
        stop=tenacity.stop_after_attempt(5),
        wait=tenacity.wait_fixed(0.05),
        retry=tenacity.retry_if_exception_type(Exception),
    )
