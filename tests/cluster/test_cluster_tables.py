"""The core contract suite for SPEC 2 (every row of the reserve and settlement tables, and
renew), run unchanged against the Redis Cluster of ``conftest.py``: the test functions are
imported from ``tests/integration`` and this folder's fixtures connect them to the cluster."""

from __future__ import annotations

import pytest

from tests.integration.test_reserve_table import *  # noqa: F403
from tests.integration.test_settlement_table import *  # noqa: F403

pytestmark = [pytest.mark.asyncio, pytest.mark.cluster]
