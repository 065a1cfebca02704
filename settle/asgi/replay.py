"""Answering from a completed record: the stored response, byte for byte, or a 410."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from settle.asgi._types import Send
from settle.asgi.problems import Problem, ProblemKind, send_response
from settle.asgi.stored import StoredResponse
from settle.errors import CorruptRecord
from settle.models import OperationRecord

__all__ = ["send_replay", "stored_response"]


def stored_response(record: OperationRecord) -> StoredResponse:
    """The response stored in a completed record (CorruptRecord if it holds something else)."""
    try:
        return record.value(StoredResponse)
    except (ValueError, ValidationError) as exc:
        raise CorruptRecord(
            f"operation {record.operation_id!r} is {record.state} but does not hold a stored "
            "HTTP response; another writer uses this operation id",
            operation_id=record.operation_id,
        ) from exc


async def send_replay(send: Send, record: OperationRecord, type_base: str, log: Any) -> None:
    """Replay the record's response, or a 410 problem if it was too large to store."""
    stored = stored_response(record)
    if stored.body is None:
        log.info("settle.http.not_replayable", status=stored.status, size=stored.size)
        await Problem(
            ProblemKind.RESPONSE_NOT_STORED,
            f"the request was processed (status {stored.status}) but its {stored.size}-byte "
            "response was too large to store; it will not run again for this key. Fetch the "
            "result through the API, or send a new request with a new key.",
        ).send(send, type_base)
        return
    log.info("settle.http.replayed", status=stored.status, size=stored.size)
    await send_response(send, stored.status, stored.replay_headers(), stored.body)
