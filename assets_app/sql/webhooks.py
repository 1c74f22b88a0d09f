"""The statements of events out (`webhooks`, `webhook_delivery`): messages written by matching
subscriptions in the database, in the transaction of what they report, and the delivery claim.

Messages are matched in SQL (the subscription's `like_pattern`) so that writing the messages of
a batch is one INSERT ... SELECT whatever the number of events and subscriptions, and writes
nothing (at the cost of one index probe on an empty table) when no subscription matches.
"""

from collections.abc import Sequence
from datetime import datetime
from fnmatch import fnmatchcase
from typing import Any

from django.db import connection

from ..models import (
    Asset,
    AssetEvent,
    Dag,
    DagRun,
    DeliveryState,
    EndpointState,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookSubscription,
)
from . import wakeups

# The message id (the `webhook-id` header): msg_ and 32 hex digits, made by the database in
# the INSERT so one statement writes any number of messages.
_PG_MESSAGE_ID = "'msg_' || replace(gen_random_uuid()::text, '-', '')"

# An asset event's message body, built from the inserted event and its asset (the statement
# that inserts the events also writes their messages: `insert_events_with_messages`).
_PG_ASSET_EVENT_BODY = (
    "json_build_object('type', 'asset.event.registered', 'timestamp', "
    "to_char(e.timestamp AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), 'data', "
    "json_build_object('id', e.id, 'asset', json_build_object('id', a.id, 'name', a.name, "
    "'uri', a.uri, 'group', a.\"group\"), 'timestamp', "
    "to_char(e.timestamp AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), "
    "'source_dag_id', e.source_dag_id, 'source_run_id', e.source_run_id, 'source_task_id', "
    "e.source_task_id, 'source_map_index', e.source_map_index, 'extra', e.extra))::text"
)


def asset_event_messages_cte(*, events: str, now_param: str = "%s") -> str:
    """A data-modifying CTE (PostgreSQL) writing the `asset.event.registered` messages of the
    rows of CTE `events` (columns id, asset_id, timestamp, source_*, extra): one per (event,
    endpoint with a matching subscription), returning their ids. `registration_sql.insert_events`
    puts it beside its INSERT, so the messages cost no statement of their own; put in the same
    statement, `wakeups.wake_sql(WEBHOOKS, if_rows_in=<this CTE>)` wakes the delivery timer."""
    delivery = WebhookDelivery._meta.db_table
    subscription = WebhookSubscription._meta.db_table
    asset = Asset._meta.db_table
    return (
        f"INSERT INTO {delivery} (message_id, endpoint_id, event_type, body, created_at, state, "
        "attempts, next_attempt_at, last_error) "
        f"SELECT {_PG_MESSAGE_ID}, m.endpoint_id, 'asset.event.registered', m.body, "
        f"{now_param}, 'pending', 0, {now_param}, '' FROM ("
        f"SELECT DISTINCT ON (e.id, s.endpoint_id) e.id, s.endpoint_id, {_PG_ASSET_EVENT_BODY} "
        f"AS body FROM {events} e JOIN {asset} a ON a.id = e.asset_id "
        f"JOIN {subscription} s ON s.event_type = 'asset.event.registered' "
        "AND a.name LIKE s.like_pattern ESCAPE '\\' ORDER BY e.id, s.endpoint_id) m "
        "ORDER BY m.id, m.endpoint_id RETURNING id"
    )


def write_messages(*, event_type: str, items: Sequence[tuple[str, str]], now: datetime) -> int:
    """Write one message per (item, endpoint subscribed to `event_type` with a pattern matching
    the item's key): items are (key, body JSON text) in order. In the caller's transaction;
    returns the number written; the delivery timer is woken at commit when there is one.

    PostgreSQL: one INSERT ... SELECT FROM unnest(...) JOIN subscriptions (the ORM cannot
    insert from a select), the wake-up in the same statement. SQLite (the demo): the
    subscriptions read, matched in Python, then `bulk_create`."""
    if not items:
        return 0
    if connection.vendor != "postgresql":
        return _write_messages_python(event_type=event_type, items=items, now=now)
    delivery = WebhookDelivery._meta.db_table
    subscription = WebhookSubscription._meta.db_table
    keys, bodies = (list(column) for column in zip(*items, strict=True))
    text = (
        f"WITH written AS (INSERT INTO {delivery} (message_id, endpoint_id, event_type, body, "
        "created_at, state, attempts, next_attempt_at, last_error) "
        f"SELECT {_PG_MESSAGE_ID}, m.endpoint_id, %s, m.body, %s, 'pending', 0, %s, '' FROM ("
        "SELECT DISTINCT ON (u.n, s.endpoint_id) u.n, s.endpoint_id, u.body "
        "FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS u(key, body, n) "
        f"JOIN {subscription} s ON s.event_type = %s AND u.key LIKE s.like_pattern ESCAPE '\\' "
        "ORDER BY u.n, s.endpoint_id) m ORDER BY m.n, m.endpoint_id RETURNING id) "
        f"SELECT (SELECT count(*) FROM written), "
        f"{wakeups.wake_sql(wakeups.WEBHOOKS, if_rows_in='written')}"
    )
    with connection.cursor() as cursor:
        cursor.execute(text, [event_type, now, now, keys, bodies, event_type])
        return cursor.fetchone()[0]


def _write_messages_python(
    *, event_type: str, items: Sequence[tuple[str, str]], now: datetime
) -> int:
    import uuid

    subscriptions = list(
        WebhookSubscription.objects.filter(event_type=event_type).values_list(
            "endpoint_id", "pattern"
        )
    )
    rows: list[WebhookDelivery] = []
    for key, body in items:
        endpoints = sorted({e for e, pattern in subscriptions if fnmatchcase(key, pattern)})
        rows.extend(
            WebhookDelivery(
                message_id=f"msg_{uuid.uuid4().hex}",
                endpoint_id=endpoint_id,
                event_type=event_type,
                body=body,
                created_at=now,
                next_attempt_at=now,
            )
            for endpoint_id in endpoints
        )
    WebhookDelivery.objects.bulk_create(rows)
    return len(rows)


# A finished run's event type: dag_run.succeeded for state success, dag_run.failed for failed.
_PG_RUN_TYPE = "(CASE r.state WHEN 'success' THEN 'dag_run.succeeded' ELSE 'dag_run.failed' END)"


def write_asset_event_messages_python(events: Sequence[AssetEvent], *, now: datetime) -> int:
    """The SQLite path of `asset_event_messages_cte`: the same messages, built in Python."""
    import json

    if (
        not events
        or not WebhookSubscription.objects.filter(event_type="asset.event.registered").exists()
    ):
        return 0
    assets = Asset.objects.in_bulk({e.asset_id for e in events})

    def iso(value: datetime) -> str:
        return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    items = []
    for e in events:
        asset = assets[e.asset_id]
        data = {
            "id": e.pk,
            "asset": {"id": asset.pk, "name": asset.name, "uri": asset.uri, "group": asset.group},
            "timestamp": iso(e.timestamp),
            "source_dag_id": e.source_dag_id,
            "source_run_id": e.source_run_id,
            "source_task_id": e.source_task_id,
            "source_map_index": e.source_map_index,
            "extra": e.extra,
        }
        body = {"type": "asset.event.registered", "timestamp": iso(e.timestamp), "data": data}
        items.append((asset.name, json.dumps(body, separators=(",", ":"))))
    return _write_messages_python(event_type="asset.event.registered", items=items, now=now)


def write_run_finished_message(*, dag_run_id: int, now: datetime) -> int:
    """Write the `dag_run.succeeded` / `dag_run.failed` messages of one finished run, its state
    and fields read by the same statement, and wake the timers its finish concerns: the
    delivery timer when messages were written, the time scheduler when the run freed a slot
    it may be waiting for (a run of a Dag with a timetable, or of a backfill). In the caller's
    transaction (the finish's); one statement."""
    run = DagRun._meta.db_table
    if connection.vendor != "postgresql":
        import json

        found = (
            DagRun.objects.filter(id=dag_run_id)
            .values("dag_id", "run_id", "state", "run_type", "start_date", "end_date")
            .first()
        )
        if not found:
            return 0
        body = json.dumps(run_body(dict(found)), separators=(",", ":"))
        return _write_messages_python(
            event_type=run_body(dict(found))["type"], items=[(found["dag_id"], body)], now=now
        )
    delivery = WebhookDelivery._meta.db_table
    subscription = WebhookSubscription._meta.db_table
    iso = "to_char({} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"
    body = (
        f"json_build_object('type', {_PG_RUN_TYPE}, 'timestamp', "
        f"{iso.format('r.end_date')}, 'data', json_build_object('dag_id', r.dag_id, "
        "'dag_run_id', r.run_id, 'state', r.state, 'run_type', r.run_type, 'start_date', "
        f"{iso.format('r.start_date')}, 'end_date', {iso.format('r.end_date')}))::text"
    )
    slot_waiters = (
        f"(SELECT 1 FROM {run} r JOIN {Dag._meta.db_table} d ON d.dag_id = r.dag_id "
        "WHERE r.id = %s AND (d.timetable IS NOT NULL OR r.run_type = 'backfill'))"
    )
    text = (
        f"WITH written AS (INSERT INTO {delivery} (message_id, endpoint_id, event_type, body, "
        "created_at, state, attempts, next_attempt_at, last_error) "
        f"SELECT DISTINCT ON (s.endpoint_id) {_PG_MESSAGE_ID}, s.endpoint_id, "
        f"{_PG_RUN_TYPE}, {body}, %s, 'pending', 0, %s, '' FROM {run} r "
        f"JOIN {subscription} s ON s.event_type = {_PG_RUN_TYPE} "
        "AND r.dag_id LIKE s.like_pattern ESCAPE '\\' "
        "WHERE r.id = %s AND r.state IN ('success', 'failed') ORDER BY s.endpoint_id "
        "RETURNING id) "
        f"SELECT (SELECT count(*) FROM written), "
        f"{wakeups.wake_sql(wakeups.WEBHOOKS, if_rows_in='written')}, "
        f"{wakeups.wake_sql(wakeups.TIME, if_rows_in=slot_waiters + ' waiters')}"
    )
    with connection.cursor() as cursor:
        cursor.execute(text, [now, now, dag_run_id, dag_run_id])
        return cursor.fetchone()[0]


def run_body(run: dict[str, Any]) -> dict[str, Any]:
    """The message of a finished run (the SQLite path; PostgreSQL builds the same in SQL)."""

    def iso(value: datetime | None) -> str | None:
        return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ") if value else None

    state = run["state"]
    return {
        "type": "dag_run.succeeded" if state == "success" else "dag_run.failed",
        "timestamp": iso(run["end_date"]),
        "data": {
            "dag_id": run["dag_id"],
            "dag_run_id": run["run_id"],
            "state": state,
            "run_type": run["run_type"],
            "start_date": iso(run["start_date"]),
            "end_date": iso(run["end_date"]),
        },
    }


def claim_deliveries(
    *, endpoint_ids: Sequence[int], now: datetime, lease_until: datetime, default_limit: int
) -> list[int]:
    """Stamp `claimed_until = lease_until` on the due pending messages of these endpoints (whose
    rows the caller holds locked, `locks.claim_webhook_endpoints`), oldest due first, at most
    each endpoint's `max_in_flight` (`default_limit` when the endpoint's is unset) minus its
    attempts still in flight; returns their ids. One statement (PostgreSQL: an UPDATE from a
    window over the due rows, which the ORM cannot express); SQLite: a query per endpoint."""
    if not endpoint_ids:
        return []
    if connection.vendor != "postgresql":
        claimed: list[int] = []
        for endpoint in WebhookEndpoint.objects.filter(id__in=endpoint_ids):
            base = WebhookDelivery.objects.filter(endpoint=endpoint, state=DeliveryState.PENDING)
            busy = base.filter(claimed_until__gt=now).count()
            room = (endpoint.max_in_flight or default_limit) - busy
            if room <= 0:
                continue
            ids = list(
                base.filter(next_attempt_at__lte=now)
                .exclude(claimed_until__gt=now)
                .order_by("next_attempt_at", "id")
                .values_list("id", flat=True)[:room]
            )
            WebhookDelivery.objects.filter(id__in=ids).update(claimed_until=lease_until)
            claimed.extend(ids)
        return claimed
    delivery = WebhookDelivery._meta.db_table
    endpoint_table = WebhookEndpoint._meta.db_table
    text = (
        f"WITH busy AS (SELECT endpoint_id, count(*) AS n FROM {delivery} "
        "WHERE endpoint_id = ANY(%s) AND state = 'pending' AND claimed_until > %s "
        "GROUP BY endpoint_id), "
        f"due AS (SELECT d.id, d.endpoint_id, row_number() OVER (PARTITION BY d.endpoint_id "
        f"ORDER BY d.next_attempt_at, d.id) AS rank FROM {delivery} d "
        "WHERE d.endpoint_id = ANY(%s) AND d.state = 'pending' AND d.next_attempt_at <= %s "
        "AND (d.claimed_until IS NULL OR d.claimed_until <= %s)) "
        f"UPDATE {delivery} SET claimed_until = %s FROM due "
        f"JOIN {endpoint_table} e ON e.id = due.endpoint_id "
        "LEFT JOIN busy ON busy.endpoint_id = due.endpoint_id "
        f"WHERE {delivery}.id = due.id "
        "AND due.rank <= coalesce(nullif(e.max_in_flight, 0), %s) - coalesce(busy.n, 0) "
        f"RETURNING {delivery}.id"
    )
    ids = list(endpoint_ids)
    with connection.cursor() as cursor:
        cursor.execute(text, [ids, now, ids, now, now, lease_until, default_limit])
        return sorted(row[0] for row in cursor.fetchall())


def endpoints_with_due_messages(*, now: datetime, limit: int) -> list[int]:
    """Ids of active endpoints with a due pending message, at most `limit` (one statement)."""
    return list(
        WebhookEndpoint.objects.filter(state=EndpointState.ACTIVE)
        .filter(
            id__in=WebhookDelivery.objects.filter(
                state=DeliveryState.PENDING, next_attempt_at__lte=now
            ).values("endpoint_id")
        )
        .order_by("id")
        .values_list("id", flat=True)[:limit]
    )


def latest_event_times(asset_ids: Sequence[int]) -> dict[int, datetime]:
    """The newest event time of each of these assets (one aggregate statement)."""
    from django.db.models import Max

    return dict(
        AssetEvent.objects.filter(asset_id__in=asset_ids)
        .values("asset_id")
        .annotate(latest=Max("timestamp"))
        .values_list("asset_id", "latest")
    )


def update_freshness(
    *, rows: Sequence[tuple[int, str, datetime | None, datetime | None]], now: datetime
) -> None:
    """Store the evaluated (policy id, state, state_since, due_at) rows and stamp every one of
    them evaluated at `now`. One statement (PostgreSQL: UPDATE ... FROM unnest; the ORM's
    `bulk_update` is a CASE per column with a branch per row, quadratic in the batch: 4 s for
    1,000 rows). SQLite: `bulk_update`."""
    if not rows:
        return
    from ..models import FreshnessPolicy

    if connection.vendor != "postgresql":
        FreshnessPolicy.objects.bulk_update(
            [
                FreshnessPolicy(
                    id=i, state=st, state_since=since, due_at=due, last_evaluated_at=now
                )
                for i, st, since, due in rows
            ],
            ["state", "state_since", "due_at", "last_evaluated_at"],
        )
        return
    table = FreshnessPolicy._meta.db_table
    ids, states, sinces, dues = (list(column) for column in zip(*rows, strict=True))
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} p SET state = u.state, state_since = u.since, due_at = u.due, "
            "last_evaluated_at = %s FROM unnest(%s::bigint[], %s::text[], %s::timestamptz[], "
            "%s::timestamptz[]) AS u(id, state, since, due) WHERE p.id = u.id",
            [now, ids, states, sinces, dues],
        )
