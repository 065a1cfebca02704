"""The ``Idempotency-Key`` header and the operation id it becomes: :mod:`settle.http.keys`,
under its former ASGI name."""

from settle.http.keys import KeyScope, MalformedKey, operation_id, operation_id_overhead, parse_key

__all__ = ["KeyScope", "MalformedKey", "operation_id", "operation_id_overhead", "parse_key"]
