"""The parts of a multipart body, read for its fingerprint (RFC 2046 5.1.1, RFC 7578).

A client makes a new boundary each time it builds a multipart body, and a retry builds it
again: the fingerprint covers the parts, not their framing. Only a body every parser frames
alike is read so; any other is compared byte for byte by :mod:`settle.http.request`.
"""

from __future__ import annotations

import hashlib

__all__ = ["multipart_digest"]


def multipart_digest(body: bytes, boundary: bytes) -> str | None:
    """The SHA-256 (hex) of the parts of ``body`` framed by ``boundary``, in order, each its
    header lines (names lowercased, values stripped) and its content, every item
    length-prefixed; None when the boundary does not frame the body alone (see
    :func:`settle.http.request.fingerprint_request`)."""
    delimiter = b"--" + boundary
    if body.startswith(delimiter):
        at = len(delimiter)
    else:
        first = body.find(b"\r\n" + delimiter)  # after a preamble
        if first < 0:
            return None
        at = first + 2 + len(delimiter)
    view = memoryview(body)
    digest = hashlib.sha256()
    parts = 0
    while True:
        if body.startswith(b"--", at):  # the close delimiter: what follows is the epilogue
            # Its delimiter nowhere else: Werkzeug and Django find one without its line
            # break (in a preamble, in a part's content), and Django reads past the close.
            framed = parts > 0 and body.count(delimiter) == parts + 1
            return digest.hexdigest() if framed else None
        line_end = body.find(b"\r\n", at)
        if line_end < 0 or body[at:line_end].strip(b" \t"):
            return None  # a delimiter is followed by padding and a line break, nothing else
        start = line_end + 2
        end = body.find(b"\r\n" + delimiter, start)
        if end < 0:
            return None  # never closed: a body cut short, or not this boundary's
        if body.startswith(b"\r\n", start):  # no header lines
            lines: list[bytes] = []
            content = start + 2
        else:
            blank = body.find(b"\r\n\r\n", start, end)
            if blank < 0:
                return None
            lines = body[start:blank].split(b"\r\n")
            content = blank + 4
        digest.update(b"part %d\n" % len(lines))
        for line in lines:
            name, colon, value = line.partition(b":")
            if not colon or not name or name != name.strip(b" \t") or b" " in name:
                return None  # not a header line (or a folded one)
            if b"\r" in line or b"\n" in line:
                return None  # a bare line end, one to Werkzeug and Django: not ours to read
            name, value = name.lower(), value.strip(b" \t")
            digest.update(b"%d:%b%d:%b" % (len(name), name, len(value), value))
        digest.update(b"%d:" % (end - content))
        digest.update(view[content:end])
        parts += 1
        if parts > _MAX_PARTS:
            return None  # compared byte for byte: a form of this size is no client's retry
        at = end + 2 + len(delimiter)


#: Parts past which a multipart body is compared byte for byte (Django's own limit on the
#: fields of a form, DATA_UPLOAD_MAX_NUMBER_FIELDS): a crafted body of a million empty parts
#: cost half a second to walk, a raw one a millisecond.
_MAX_PARTS = 1000
