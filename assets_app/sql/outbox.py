"""The outbox row's statement (`outbox.enqueue`): its INSERT and the enqueued counter in one."""

import functools
import json
from typing import Any

import orjson
from django.db import connection
from django.utils import timezone

from ..models import AssetEventQueue, MetricCounter
from .connection import prepared_cursor

# --- the outbox row (outbox.enqueue) -----------------------------------------------------------


def json_text(value: Any) -> str:
    """`value` as JSON text for a `::jsonb` parameter: orjson (several times faster than the
    ORM's encoder on a 300-outlet payload), the standard library for what orjson refuses."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # an integer beyond 64 bits in an event's extra: the stdlib has no limit
        return json.dumps(value)


@functools.cache
def _enqueue_statement() -> tuple[str, list[Any]]:
    """INSERT of every concrete column (defaults filled in by the model instance, so a column
    added later needs no change here) plus the counter upsert, as one statement."""
    fields = [f for f in AssetEventQueue._meta.concrete_fields if not f.primary_key]
    table = AssetEventQueue._meta.db_table
    counters = MetricCounter._meta.db_table
    columns = ", ".join(f'"{f.column}"' for f in fields)
    values = ", ".join("%s::jsonb" if f.attname == "payload" else "%s" for f in fields)
    text = (
        f'WITH row AS (INSERT INTO "{table}" ({columns}) VALUES ({values}) RETURNING id), '
        f'counted AS (INSERT INTO "{counters}" (name, shard, value) SELECT %s, %s, 1 FROM row '
        f'ON CONFLICT (name, shard) DO UPDATE SET value = "{counters}".value + excluded.value) '
        "SELECT id FROM row"
    )
    return text, fields


def insert_outbox_row(row: AssetEventQueue, *, counter: str, shard: int) -> bool:
    """INSERT the unsaved outbox `row` (its id is set), in the caller's transaction. Returns
    whether the same statement also added 1 to the counter `counter` (shard `shard`); when it
    did not, the caller counts the row itself.

    PostgreSQL: raw, one statement for both (a data-modifying CTE), the payload encoded once by
    `json_text` and passed as jsonb text, the statement built once per process: the ORM's JSON
    encoding, its query building and a separate counter upsert after commit were a third of a
    success's cost (bench/success_breakdown.py). SQLite (the demo): the ORM's INSERT, no count."""
    if connection.vendor != "postgresql":
        row.save(force_insert=True)
        return False
    text, fields = _enqueue_statement()
    now = timezone.now()
    row.created_at = row.updated_at = row.next_attempt_at = now
    params = [
        json_text(row.payload)
        if f.attname == "payload"
        else f.get_db_prep_save(getattr(row, f.attname), connection)
        for f in fields
    ]
    with prepared_cursor() as cursor:
        cursor.execute(text, [*params, counter, shard])
        row.id = cursor.fetchone()[0]
    return True
