"""Task logs (issue 27): workers ship each try's log file in chunks; the admin and the public
API (Airflow's `GET .../taskInstances/{task_id}/logs/{try_number}`) read them back.

A chunk is bytes [offset, offset + size) of the try's file, sent as text. Appending is
idempotent by (TI, try, offset): a retried chunk changes nothing; a chunk that starts anywhere
but at the end of what is stored is refused (409 `log_offset_gap`), so the stored log is always
a prefix of the file. Bounds: TASK_LOG_CHUNK_MAX_BYTES per chunk, TASK_LOG_MAX_BYTES per try
(413); an empty chunk is refused (422: stored, it would freeze the log). Rows carry `created_at`
(indexed); retention deletes a try's chunks with its TI.

Who may write: the shared worker key (`auth.worker_api_key`, held by the service's own workers,
never by a task), for any TI's tries up to its current one, also after the try ended (the
worker ships the end of the file after the task finished). A task token cannot write logs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from uuid import UUID

from django.conf import settings
from django.core import signing
from django.db import transaction
from django.db.models import Max, Sum

from assets_app.guards import exceptions
from assets_app.models import TaskInstance, TaskLogChunk

_TOKEN_SALT = "task-log-continuation"


@dataclass(frozen=True)
class Appended:
    stored_bytes: int  # the try's stored length after this call
    duplicate: bool


def _stored(ti_id: UUID, try_number: int) -> tuple[int, int]:
    agg = TaskLogChunk.objects.filter(ti_id=ti_id, try_number=try_number).aggregate(
        size=Sum("size"), last=Max("offset")
    )
    return agg["size"] or 0, agg["last"] if agg["last"] is not None else -1


def append_chunk(*, ti_id: UUID, try_number: int, offset: int, content: str) -> Appended:
    size = len(content.encode())
    if size > settings.TASK_LOG_CHUNK_MAX_BYTES:
        raise exceptions.TooLarge(
            f"a log chunk of {size} bytes is over TASK_LOG_CHUNK_MAX_BYTES "
            f"({settings.TASK_LOG_CHUNK_MAX_BYTES}): send it in smaller chunks",
            reason="log_chunk_too_large",
        )
    if offset < 0:
        raise exceptions.InvalidInput("offset must be 0 or more", reason="invalid_offset")
    if size == 0:
        # Stored, it would be taken for the real chunk at its offset ("duplicate") for good.
        raise exceptions.InvalidInput(
            "a log chunk holds at least one byte", reason="empty_log_chunk"
        )
    ti = TaskInstance.objects.filter(id=ti_id).values("try_number").first()
    if ti is None:
        raise exceptions.NotFound(f"task instance {ti_id} not found")
    if not 1 <= try_number <= ti["try_number"]:
        raise exceptions.InvalidInput(
            f"task instance {ti_id} has no try {try_number} (it is at try {ti['try_number']})",
            reason="invalid_try",
        )
    with transaction.atomic():
        existing = TaskLogChunk.objects.filter(
            ti_id=ti_id, try_number=try_number, offset=offset
        ).first()
        stored, _ = _stored(ti_id, try_number)
        if existing is not None:
            return Appended(stored_bytes=stored, duplicate=True)
        if offset != stored:
            raise exceptions.Conflict(
                f"this chunk starts at byte {offset} of try {try_number}'s log, but {stored} "
                "bytes are stored: send the chunk that starts there",
                reason="log_offset_gap",
                stored_bytes=stored,
            )
        if stored + size > settings.TASK_LOG_MAX_BYTES:
            raise exceptions.TooLarge(
                f"try {try_number}'s log would be {stored + size} bytes, over "
                f"TASK_LOG_MAX_BYTES ({settings.TASK_LOG_MAX_BYTES})",
                reason="log_too_large",
            )
        # Two deliveries of one chunk at once: the unique constraint keeps one.
        TaskLogChunk.objects.bulk_create(
            [
                TaskLogChunk(
                    ti_id=ti_id, try_number=try_number, offset=offset, size=size, content=content
                )
            ],
            ignore_conflicts=True,
        )
    return Appended(stored_bytes=stored + size, duplicate=False)


def read(*, ti_id: UUID, try_number: int, from_byte: int = 0) -> tuple[str, int]:
    """The stored log of one try from chunk offset `from_byte` on, and its stored length."""
    chunks = TaskLogChunk.objects.filter(
        ti_id=ti_id, try_number=try_number, offset__gte=from_byte
    ).values_list("content", "offset", "size")
    text, end = [], from_byte
    for content, offset, size in chunks:
        text.append(content)
        end = offset + size
    return "".join(text), end


def read_tries(*, ti_ids: list[UUID], up_to: int | None = None) -> dict[tuple[UUID, int], str]:
    """Every stored try's log of the TIs `ti_ids` (tries up to `up_to` if given), by (TI id,
    try number): one query whatever the number of TIs and tries."""
    chunks = TaskLogChunk.objects.filter(ti_id__in=ti_ids)
    if up_to is not None:
        chunks = chunks.filter(try_number__lte=up_to)
    logs: dict[tuple[UUID, int], list[str]] = {}
    for ti_id, try_number, content in chunks.order_by("ti_id", "try_number", "offset").values_list(
        "ti_id", "try_number", "content"
    ):
        logs.setdefault((ti_id, try_number), []).append(content)
    return {key: "".join(parts) for key, parts in logs.items()}


def structured(text: str) -> list[dict]:
    """Airflow's StructuredLogMessage list: each JSON line of the SDK's log as it is (`event`,
    `timestamp`, `level`, ...), a line that is not a JSON object as `{"event": line}`."""
    messages = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if not isinstance(message, dict) or "event" not in message:
            message = {"event": line}
        messages.append(message)
    return messages


def line_of(message: dict) -> str:
    """One message as a console line: time, level, event, then its other fields (an error's
    `error_detail` with the exception's type and value) as compact JSON."""
    rest = {k: v for k, v in message.items() if k not in ("timestamp", "level", "event")}
    parts = [str(message.get("timestamp") or ""), str(message.get("level") or ""), message["event"]]
    if rest:
        parts.append(json.dumps(rest, separators=(",", ":"), default=str))
    return " ".join(part for part in parts if part)


def continuation_token(end: int, *, end_of_log: bool) -> str:
    return signing.dumps({"log_pos": end, "end_of_log": end_of_log}, salt=_TOKEN_SALT)


def position_of(token: str) -> int:
    try:
        return int(signing.loads(token, salt=_TOKEN_SALT)["log_pos"])
    except (signing.BadSignature, KeyError, TypeError, ValueError):
        raise exceptions.BadRequest(
            "token is not a continuation token of this service", reason="invalid_token"
        ) from None
