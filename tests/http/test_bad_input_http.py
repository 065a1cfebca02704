"""Options of the HTTP guards (ASGI, WSGI, Django, Flask: one IdempotencyPolicy) of the
wrong type are a ConfigurationError when the guard is made.

A str where a number belongs, None where names belong, or a header of another type let a
TypeError / AttributeError out; a NaN (or fractional) size or Retry-After was accepted and
then compared False with every size: a NaN ``max_request_bytes`` read bodies of any size
(no 413), a NaN ``max_response_bytes`` stored no response, a NaN ``retry_after`` was sent
as ``Retry-After: nan``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from settle.errors import ConfigurationError
from settle.http import IdempotencyPolicy


@pytest.mark.parametrize(
    "options",
    [
        {"max_request_bytes": math.nan},
        {"max_response_bytes": math.nan},
        {"retry_after": math.nan},
        {"retry_after": 1.5},
        {"max_request_bytes": "1048576"},
        {"max_key_length": "200"},
        {"max_key_length": True},
        {"lease": "30"},
        {"header": 5},
        {"operation_prefix": None},
        {"problem_type_base": None},
        {"methods": None},
        {"methods": [1]},
        {"replay_headers": None},
        {"replay_headers": [1]},
        {"require_key": None},
    ],
    ids=lambda options: "-".join(f"{k}={v!r}" for k, v in options.items()),
)
def test_an_option_of_the_wrong_type_is_a_configuration_error(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        IdempotencyPolicy.configure(principal=lambda request: "tenant:a", **options)
