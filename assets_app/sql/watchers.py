"""The statement of queue watchers (`watchers`): a message's dedup row, inserted first in the
transaction that registers (or parks) the message."""

import json
from datetime import datetime
from typing import Any

from django.db import connection

from ..models import WatcherMessage


def insert_message(
    *,
    watcher_id: int,
    message_id: str,
    message_id_derived: bool,
    state: str,
    reason: str,
    detail: str,
    routing_key: str,
    headers: dict[str, Any],
    body: bytes | None,
    now: datetime,
) -> int | None:
    """Insert the (watcher, message_id) row; its id, or None when the row exists (a redelivery:
    the caller writes nothing else). In the caller's transaction.

    PostgreSQL: INSERT ... ON CONFLICT DO NOTHING RETURNING id, which waits for a concurrent
    insert of the same key (another consumer holding a redelivery) to commit or roll back and
    then says which one won, in one statement, without a savepoint. SQLite (writers
    serialized): look the key up, then the ORM's INSERT."""
    registered_at = now if state == "registered" else None
    if connection.vendor != "postgresql":
        if WatcherMessage.objects.filter(watcher_id=watcher_id, message_id=message_id).exists():
            return None
        return WatcherMessage.objects.create(
            watcher_id=watcher_id,
            message_id=message_id,
            message_id_derived=message_id_derived,
            state=state,
            reason=reason,
            detail=detail,
            routing_key=routing_key,
            headers=headers,
            body=body,
            received_at=now,
            registered_at=registered_at,
        ).pk
    table = WatcherMessage._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (watcher_id, message_id, message_id_derived, state, reason, "
            "detail, routing_key, headers, body, event_ids, received_at, registered_at, requeues) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, '[]'::jsonb, %s, %s, 0) "
            "ON CONFLICT (watcher_id, message_id) DO NOTHING RETURNING id",
            [
                watcher_id,
                message_id,
                message_id_derived,
                state,
                reason,
                detail,
                routing_key,
                json.dumps(headers),
                body,
                now,
                registered_at,
            ],
        )
        row = cursor.fetchone()
    return row[0] if row else None
