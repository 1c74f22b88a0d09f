"""Registration's statements (`registration`, the public API's events): what a registration
announces before it writes events (fences, a freshness wake-up), events inserted with their
idempotency keys, their ADRQ rows in the global lock order, and the constraint mode of the
registering transaction."""

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import connection

from ..models import AssetDagRunQueue, AssetEvent
from . import fences, wakeups
from .webhooks import asset_event_messages_cte, write_asset_event_messages_python

# --- registration (registration.register_payloads, the public API's events) --------------------


def set_constraints_immediate() -> None:
    """Check foreign keys per statement for the rest of the current transaction (see
    `registration.check_constraints_immediately` for why). PostgreSQL: `SET CONSTRAINTS ALL
    IMMEDIATE`, which the ORM has no form of (Django creates its foreign keys DEFERRABLE
    INITIALLY DEFERRED). SQLite: nothing; its foreign keys are checked per statement already."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")


# (source TI, its try, asset, ordinal): an event's identity; external events have no source TI.
EventKey = tuple[UUID | None, int | None, int, int]


def announce_events(*, asset_ids: Iterable[int], alias_ids: Iterable[int] = ()) -> None:
    """What a registration does before it inserts events of these assets (through these
    aliases), in one statement of the caller's transaction: take the registration fences of
    the bounded Dags scheduled on them (`fences.shared_fences_sql`, invariant 16: their passes
    wait for these events) and wake the freshness timer at commit if a late policy watches one
    of the assets (`wakeups.late_assets_wake_sql`). Nothing on SQLite (writers are serialized,
    no NOTIFY)."""
    assets, aliases = sorted(set(asset_ids)), sorted(set(alias_ids))
    if connection.vendor != "postgresql" or not (assets or aliases):
        return
    text = f"SELECT {fences.shared_fences_sql()}, {wakeups.late_assets_wake_sql()}"
    with connection.cursor() as cursor:
        cursor.execute(text, [assets, aliases, assets])


def insert_events(rows: list[tuple[Any, ...]], *, now: datetime) -> dict[EventKey, int]:
    """Insert events from (asset_id, extra JSON text, dag_id, run_id, task_id, map_index, ti_id,
    try_number, ordinal) rows, skipping those whose idempotency key exists; returns
    {idempotency key: id} for the rows actually inserted. In the caller's transaction.

    PostgreSQL: raw, one INSERT ... SELECT FROM unnest(...) ON CONFLICT DO NOTHING RETURNING,
    safe against concurrent writers and one statement whatever the row count; the ORM's
    `bulk_create(ignore_conflicts=True)` returns no ids and names no conflict target (this one
    is a partial unique index). SQLite (the demo, where writers are serialized by IMMEDIATE
    transactions): read the existing keys, then bulk-insert the missing rows."""
    if connection.vendor != "postgresql":
        return _insert_events_sqlite(rows, now=now)
    table = AssetEvent._meta.db_table
    columns = list(zip(*rows, strict=True))
    text = (
        f"INSERT INTO {table} (asset_id, extra, timestamp, source_dag_id, source_run_id, "
        "source_task_id, source_map_index, source_ti_id, source_try_number, source_ordinal) "
        "SELECT u.asset_id, u.extra::jsonb, %s, u.dag_id, u.run_id, u.task_id, u.map_index, "
        "u.ti_id, u.try_number, u.ordinal FROM unnest(%s::bigint[], %s::text[], %s::text[], "
        "%s::text[], %s::text[], %s::int[], %s::uuid[], %s::int[], %s::int[]) WITH ORDINALITY "
        "AS u(asset_id, extra, dag_id, run_id, task_id, map_index, ti_id, try_number, ordinal, n) "
        "ORDER BY u.n "
        "ON CONFLICT (source_ti_id, source_try_number, asset_id, source_ordinal) "
        "WHERE source_ti_id IS NOT NULL DO NOTHING "
        "RETURNING id, source_ti_id, source_try_number, asset_id, source_ordinal, timestamp, "
        "source_dag_id, source_run_id, source_task_id, source_map_index, extra"
    )
    # The events' webhook messages (issue 29) are written by the same statement, a second
    # data-modifying CTE over the inserted rows: in the events' transaction, and no statement
    # more than before, with or without subscriptions.
    text = (
        f"WITH ins AS ({text}), messages AS "
        f"({asset_event_messages_cte(events='ins')}) "
        "SELECT id, source_ti_id, source_try_number, asset_id, source_ordinal, "
        f"{wakeups.wake_sql(wakeups.WEBHOOKS, if_rows_in='messages')} FROM ins"
    )
    with connection.cursor() as cursor:
        cursor.execute(text, [now, *[list(column) for column in columns], now, now])
        return {(ti, tn, asset, ordinal): pk for pk, ti, tn, asset, ordinal, _ in cursor.fetchall()}


def _insert_events_sqlite(rows: list[tuple[Any, ...]], *, now: datetime) -> dict[EventKey, int]:
    existing = {
        (ti, tn, asset, ordinal)
        for ti, tn, asset, ordinal in AssetEvent.objects.filter(
            source_ti_id__in={row[6] for row in rows}
        ).values_list("source_ti_id", "source_try_number", "asset_id", "source_ordinal")
    }
    events = [
        AssetEvent(
            asset_id=asset_id,
            extra=json.loads(extra),
            timestamp=now,
            source_dag_id=dag_id,
            source_run_id=run_id,
            source_task_id=task_id,
            source_map_index=map_index,
            source_ti_id=ti_id,
            source_try_number=try_number,
            source_ordinal=ordinal,
        )
        for asset_id, extra, dag_id, run_id, task_id, map_index, ti_id, try_number, ordinal in rows
        if (ti_id, try_number, asset_id, ordinal) not in existing
    ]
    AssetEvent.objects.bulk_create(events)
    write_asset_event_messages_python(events, now=now)
    return {
        (e.source_ti_id, e.source_try_number, e.asset_id, e.source_ordinal): e.pk for e in events
    }


def insert_queue_rows(rows: list[tuple[str, int, int]], *, now: datetime) -> int:
    """Insert ADRQ rows (target_dag_id, asset_event_id, asset_id) in the given (sorted: the
    global lock order) order, conflicts ignored; returns the number inserted (SQLite: the
    number given, which is the same since callers only queue new events). 1 statement, in the
    caller's transaction.

    PostgreSQL: raw, INSERT ... SELECT FROM unnest(...) WITH ORDINALITY ORDER BY: the rows are
    inserted (and their keys locked) in exactly the given order (invariant 7), with one
    parameter per column whatever the row count, and the inserted count comes back, which
    `bulk_create(ignore_conflicts=True)` does not give. SQLite: `bulk_create`."""
    if connection.vendor != "postgresql":
        AssetDagRunQueue.objects.bulk_create(
            [
                AssetDagRunQueue(
                    target_dag_id=dag_id, asset_event_id=event_id, asset_id=asset_id, created_at=now
                )
                for dag_id, event_id, asset_id in rows
            ],
            ignore_conflicts=True,
        )
        return len(rows)
    table = AssetDagRunQueue._meta.db_table
    dag_ids, event_ids, asset_ids = (list(column) for column in zip(*rows, strict=True))
    text = (
        f"INSERT INTO {table} (target_dag_id, asset_event_id, asset_id, created_at) "
        "SELECT u.dag_id, u.event_id, u.asset_id, %s FROM unnest(%s::text[], %s::bigint[], "
        "%s::bigint[]) WITH ORDINALITY AS u(dag_id, event_id, asset_id, n) ORDER BY u.n "
        "ON CONFLICT (target_dag_id, asset_event_id) DO NOTHING"
    )
    with connection.cursor() as cursor:
        cursor.execute(text, [now, dag_ids, event_ids, asset_ids])
        return cursor.rowcount


def insert_external_event(
    *,
    asset_id: int,
    extra: dict[str, Any],
    key: str | None,
    scope: str,
    body_hash: str,
    now: datetime,
) -> int | None:
    """Insert an event without a source TI (the public API's), with the caller's idempotency
    `key` in `scope` when given; returns its id, or None when that key is taken (a retry). In
    the caller's transaction.

    PostgreSQL: raw, INSERT ... ON CONFLICT DO NOTHING RETURNING id, which waits for a
    concurrent insert of the same key to commit or roll back and then says which one won, in
    one statement; the ORM's `create` would raise IntegrityError and need a savepoint around
    it. SQLite (writers serialized): look the key up, then the ORM's INSERT."""
    if connection.vendor != "postgresql":
        if (
            key is not None
            and AssetEvent.objects.select_related("asset")
            .filter(external_key_scope=scope, external_key=key)
            .first()
            is not None
        ):
            return None
        event = AssetEvent.objects.create(
            asset_id=asset_id,
            extra=extra,
            timestamp=now,
            external_key=key,
            external_key_scope=scope,
            request_hash=body_hash,
        )
        write_asset_event_messages_python([event], now=now)
        return event.pk
    table = AssetEvent._meta.db_table
    with connection.cursor() as cursor:
        # ON CONFLICT waits for a concurrent insert of the same key to commit or roll back.
        # With its webhook messages (issue 29) in the same statement, as `insert_events`.
        cursor.execute(
            f"WITH ins AS (INSERT INTO {table} (asset_id, extra, timestamp, source_map_index, "
            "source_ordinal, external_key, external_key_scope, request_hash) "
            "VALUES (%s, %s::jsonb, %s, -1, 0, %s, %s, %s) "
            "ON CONFLICT DO NOTHING RETURNING id, asset_id, timestamp, source_dag_id, "
            "source_run_id, source_task_id, source_map_index, extra), "
            f"messages AS ({asset_event_messages_cte(events='ins')}) "
            f"SELECT id, {wakeups.wake_sql(wakeups.WEBHOOKS, if_rows_in='messages')} FROM ins",
            [asset_id, json.dumps(extra), now, key, scope, body_hash, now, now],
        )
        row = cursor.fetchone()
    return row[0] if row else None
