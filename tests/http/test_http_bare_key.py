"""A bare ``Idempotency-Key`` is one token of visible ASCII without a quote, a comma, a
semicolon or a backslash (``keys._BARE``): every byte, in the middle of a key, is accepted or
refused as that says."""

from __future__ import annotations

import pytest

from settle.http.keys import MalformedKey, parse_key

_REFUSED_VISIBLE = frozenset(b'",;\\')


@pytest.mark.parametrize("byte", range(256), ids=hex)
def test_a_bare_key_takes_exactly_visible_ascii_without_quote_comma_semicolon_backslash(
    byte: int,
) -> None:
    value = b"k" + bytes([byte]) + b"1"
    if 0x21 <= byte <= 0x7E and byte not in _REFUSED_VISIBLE:
        assert parse_key([value], 64) == value.decode()
    else:
        with pytest.raises(MalformedKey):
            parse_key([value], 64)
