"""The scheduler's statements (`scheduling`, `runs`): the ADRQ rows of a pass locked and
grouped, deleted by one array, and the consumed-event links of the new runs."""

import json
from collections.abc import Sequence
from datetime import date, datetime
from typing import NamedTuple
from uuid import UUID

from django.db import connection
from django.db.models import (
    BooleanField,
    CharField,
    DateField,
    ForeignKey,
    IntegerField,
    JSONField,
    Model,
    TextField,
    UUIDField,
)
from django.db.models.fields import AutoFieldMixin
from django.utils import timezone

from ..models import (
    Asset,
    AssetDagRunQueue,
    AssetEvent,
    Backfill,
    BackfillDagRun,
    Dag,
    DagRun,
    DagRunAssetEvent,
)


class QueuedGroup(NamedTuple):
    """The ADRQ rows of one Dag and one asset that a scheduler pass locked."""

    dag_id: str
    asset_name: str
    latest: datetime  # the newest of their events' timestamps
    row_ids: list[int]
    event_ids: list[int]


def lock_queue_groups(dag_ids: Sequence[str]) -> list[QueuedGroup]:
    """Lock the ADRQ rows of these Dags FOR UPDATE SKIP LOCKED, in the global ADRQ order
    (target_dag_id, asset_event_id), and return them grouped by Dag and asset name (sorted by
    both). 1 statement, in the caller's transaction.

    PostgreSQL: raw, the locking SELECT in a MATERIALIZED CTE (locking only ADRQ rows) and the
    grouping around it, the ids coming back as two integer arrays per group. A Dag that waited
    through a backlog has a row per queued event: 118,500 per Dag in `bench/burst.py --calls
    2000`, where a (row id, dag id, event id, timestamp, asset name) tuple per row, the ORM's
    `values_list`, held ~300 bytes each and made its cluster worker the largest process of the
    run. SQLite: the ORM's `values_list`, grouped here."""
    if connection.vendor != "postgresql":
        groups: dict[tuple[str, str], QueuedGroup] = {}
        for row_id, dag_id, event_id, timestamp, name in (
            AssetDagRunQueue.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(target_dag_id__in=list(dag_ids))
            .order_by("target_dag_id", "asset_event_id")
            .values_list(
                "id", "target_dag_id", "asset_event_id", "asset_event__timestamp", "asset__name"
            )
        ):
            group = groups.setdefault((dag_id, name), QueuedGroup(dag_id, name, timestamp, [], []))
            if timestamp > group.latest:
                group = groups[(dag_id, name)] = group._replace(latest=timestamp)
            group.row_ids.append(row_id)
            group.event_ids.append(event_id)
        return [groups[key] for key in sorted(groups)]
    text = (
        "WITH locked AS MATERIALIZED (SELECT q.id, q.target_dag_id, q.asset_event_id, "
        f"q.asset_id FROM {AssetDagRunQueue._meta.db_table} q WHERE q.target_dag_id = ANY(%s) "
        "ORDER BY q.target_dag_id, q.asset_event_id FOR UPDATE SKIP LOCKED) "
        "SELECT l.target_dag_id, a.name, max(e.timestamp), array_agg(l.id), "
        f"array_agg(l.asset_event_id) FROM locked l JOIN {Asset._meta.db_table} a "
        f"ON a.id = l.asset_id JOIN {AssetEvent._meta.db_table} e ON e.id = l.asset_event_id "
        "GROUP BY l.target_dag_id, a.name ORDER BY l.target_dag_id, a.name"
    )
    with connection.cursor() as cursor:
        cursor.execute(text, [list(dag_ids)])
        return [QueuedGroup(*row) for row in cursor.fetchall()]


def delete_queue_rows(ids: Sequence[int]) -> None:
    """DELETE these ADRQ rows, in the caller's transaction: 1 statement. PostgreSQL: one
    array parameter (a pass may consume hundreds of thousands of rows; the ORM's `id__in`
    sends a placeholder each). SQLite: the ORM's fast delete (nothing cascades from ADRQ and
    no signals are connected to it)."""
    if not ids:
        return
    if connection.vendor != "postgresql":
        AssetDagRunQueue.objects.filter(id__in=list(ids)).delete()
        return
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {AssetDagRunQueue._meta.db_table} WHERE id = ANY(%s::bigint[])",
            [list(ids)],
        )


def insert_consumed_links(runs: Sequence[tuple[int, Sequence[int]]]) -> None:
    """Insert the consumed-event links of new runs, from (run id, event ids) pairs, the dag of
    each link copied from its run (the unique (dag, event) constraint is invariant 8's guard).
    1 statement whatever the number of runs and events, in the caller's transaction.

    PostgreSQL: raw, INSERT ... SELECT FROM unnest(...) joined to the runs: two array
    parameters, no Python object per link. A run of a Dag that waited through a backlog consumes
    every event queued for it (150,000 in `bench/burst.py --calls 2000`), and one
    `DagRunAssetEvent` instance per link held ~1 kB each until the statement was sent: the
    cluster worker that ran such a pass peaked at 670 MB (PSS). SQLite: `bulk_create`."""
    if connection.vendor != "postgresql":
        run_ids = [run_id for run_id, _ in runs]
        dag_of = dict(DagRun.objects.filter(pk__in=run_ids).values_list("pk", "dag_id"))
        DagRunAssetEvent.objects.bulk_create(
            [
                DagRunAssetEvent(dag_run_id=run_id, dag_id=dag_of[run_id], asset_event_id=event)
                for run_id, events in runs
                for event in events
            ]
        )
        return
    link_runs: list[int] = []
    event_ids: list[int] = []
    for run_id, events in runs:
        link_runs += [run_id] * len(events)
        event_ids += events
    if not event_ids:
        return
    text = (
        f"INSERT INTO {DagRunAssetEvent._meta.db_table} (dag_run_id, dag_id, asset_event_id) "
        "SELECT u.run_id, r.dag_id, u.event_id FROM unnest(%s::bigint[], %s::bigint[]) "
        f"WITH ORDINALITY AS u(run_id, event_id, n) JOIN {DagRun._meta.db_table} r "
        "ON r.id = u.run_id ORDER BY u.n"
    )
    with connection.cursor() as cursor:
        cursor.execute(text, [link_runs, event_ids])


# --- the time scheduler (`time_runs`) -----------------------------------------------------------

NEXT_RUN_COLUMNS = (
    "next_dagrun",
    "next_dagrun_data_interval_start",
    "next_dagrun_data_interval_end",
    "next_dagrun_create_after",
    "next_dagrun_computed_at",
)


def update_next_runs(dags: Sequence[Dag]) -> None:
    """Store the stored-next-run fields (`NEXT_RUN_COLUMNS`) of these Dags, as set on the
    instances. One statement, in the caller's transaction (the rows are the caller's, locked).

    PostgreSQL: UPDATE ... FROM jsonb_to_recordset (one JSON document, as `insert_rows`). The
    ORM's `bulk_update` builds a CASE with a branch per row for each of the five columns:
    resolving them was 3.2 s of a 6.3 s pass over 1,000 due Dags (issue 41's tick -> run).
    SQLite: `bulk_update`."""
    if not dags:
        return
    if connection.vendor != "postgresql":
        Dag.objects.bulk_update(dags, list(NEXT_RUN_COLUMNS))
        return
    rows = [
        {"dag_id": dag.dag_id, **{name: getattr(dag, name) for name in NEXT_RUN_COLUMNS}}
        for dag in dags
    ]
    sets = ", ".join(f"{name} = u.{name}" for name in NEXT_RUN_COLUMNS)
    types = ", ".join(f"{name} timestamptz" for name in NEXT_RUN_COLUMNS)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Dag._meta.db_table} d SET {sets} "
            f"FROM jsonb_to_recordset(%s::jsonb) AS u(dag_id text, {types}) "
            "WHERE d.dag_id = u.dag_id",
            [json.dumps(rows, default=_json_scalar)],
        )


class HeldDate(NamedTuple):
    """A logical date in a planned span that a run holds, or a backfill's date waiting for its
    run: the dates to compute the next run from (None data interval: a run without one)."""

    dag_id: str
    logical_date: datetime
    run_after: datetime
    data_interval_start: datetime | None
    data_interval_end: datetime | None


def held_dates(spans: Sequence[tuple[str, datetime, datetime]]) -> list[HeldDate]:
    """The runs of each (dag_id, first, last) span holding a logical date in [first, last], and
    the backfills' dates in it still waiting for their run (not started, no exception, no run).
    One statement (PostgreSQL: the spans joined from unnest arrays; an OR of a Q per Dag cost
    0.3 s of ORM per batch of 200 Dags). SQLite: the ORM, a query per span."""
    if not spans:
        return []
    if connection.vendor != "postgresql":
        found: list[HeldDate] = []
        columns = ("logical_date", "run_after", "data_interval_start", "data_interval_end")
        for dag_id, first, last in spans:
            dates = {"logical_date__gte": first, "logical_date__lte": last}
            found += [
                HeldDate(dag_id, *row)
                for row in DagRun.objects.filter(dag_id=dag_id, **dates).values_list(*columns)
            ]
            found += [
                HeldDate(dag_id, *row)
                for row in BackfillDagRun.objects.filter(
                    backfill__dag_id=dag_id,
                    started_at__isnull=True,
                    exception_reason__isnull=True,
                    dag_run__isnull=True,
                    **dates,
                ).values_list(*columns)
            ]
        return found
    dag_ids, firsts, lasts = (list(column) for column in zip(*spans, strict=True))
    run = DagRun._meta.db_table
    waiting = BackfillDagRun._meta.db_table
    backfill = Backfill._meta.db_table
    text = (
        "WITH s AS (SELECT * FROM unnest(%s::text[], %s::timestamptz[], %s::timestamptz[]) "
        "AS s(dag_id, first, last)) "
        "SELECT r.dag_id, r.logical_date, r.run_after, r.data_interval_start, "
        f"r.data_interval_end FROM s JOIN {run} r ON r.dag_id = s.dag_id "
        "AND r.logical_date BETWEEN s.first AND s.last "
        "UNION ALL "
        "SELECT b.dag_id, w.logical_date, w.run_after, w.data_interval_start, "
        f"w.data_interval_end FROM s JOIN {backfill} b ON b.dag_id = s.dag_id "
        f"JOIN {waiting} w ON w.backfill_id = b.id "
        "AND w.logical_date BETWEEN s.first AND s.last "
        "WHERE w.started_at IS NULL AND w.exception_reason IS NULL AND w.dag_run_id IS NULL"
    )
    with connection.cursor() as cursor:
        cursor.execute(text, [dag_ids, firsts, lasts])
        return [HeldDate(*row) for row in cursor.fetchall()]


def insert_rows(model: type[Model], objs: Sequence[Model]) -> None:
    """INSERT unsaved instances of `model` (every concrete field as set on them; an auto-set
    timestamp, `auto_now` or `auto_now_add`, stamped now; an auto primary key read back onto
    them, as `bulk_create` does). One statement, in the caller's transaction; no signals.

    PostgreSQL: INSERT ... SELECT FROM jsonb_populate_recordset, the rows as one JSON document
    (`json.dumps`, in C; the table's row type converts each value as its column's input does,
    and refuses a NUL in text as the column would). `bulk_create` prepared each of the 45,000
    values of 1,000 runs and 1,000 TIs through its field (`pre_save`, `get_db_prep_save`): 0.44
    s of a 1.0 s pass over 1,000 due Dags; one array parameter per column then cost psycopg
    0.37 s of quoting (issue 41: a tick -> run p99 under 2 s on a busy host). Only the field
    types `_JSON_SAFE` lists are written this way (another raises TypeError). SQLite:
    `bulk_create`."""
    if not objs:
        return
    if connection.vendor != "postgresql":
        model._default_manager.bulk_create(objs)
        return
    meta = model._meta
    auto_pk = meta.pk if isinstance(meta.pk, AutoFieldMixin) else None
    fields = [f for f in meta.concrete_fields if f is not auto_pk]
    now = timezone.now()
    for field in fields:
        if not isinstance(field, _JSON_SAFE):
            raise TypeError(f"insert_rows: {model.__name__}.{field.name} is a {type(field)}")
        if getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
            for obj in objs:
                setattr(obj, field.attname, now)
    names = [str(field.column) for field in fields]
    attnames = [field.attname for field in fields]
    encoded = [(str(f.column), f.encoder) for f in fields if isinstance(f, JSONField) and f.encoder]
    rows = []
    for obj in objs:
        row = {name: getattr(obj, attname) for name, attname in zip(names, attnames, strict=True)}
        for name, encoder in encoded:  # a JSON field's own encoder, as its column gets it
            if row[name] is not None:
                row[name] = json.loads(json.dumps(row[name], cls=encoder))
        rows.append(row)
    table = connection.ops.quote_name(meta.db_table)
    quoted = [connection.ops.quote_name(name) for name in names]
    # In the instances' order (WITH ORDINALITY), so the ids come back in it, as bulk_create's.
    text = (
        f"INSERT INTO {table} ({', '.join(quoted)}) "
        f"SELECT {', '.join('r.' + name for name in quoted)} "
        f"FROM jsonb_populate_recordset(NULL::{table}, %s::jsonb) WITH ORDINALITY AS r "
        "ORDER BY r.ordinality"
        + (f" RETURNING {connection.ops.quote_name(auto_pk.column)}" if auto_pk else "")
    )
    with connection.cursor() as cursor:
        cursor.execute(text, [json.dumps(rows, default=_json_scalar)])
        if auto_pk is not None:
            for obj, (pk,) in zip(objs, cursor.fetchall(), strict=True):
                setattr(obj, auto_pk.attname, pk)
                obj._state.adding = False
                obj._state.db = connection.alias
    if auto_pk is None:
        for obj in objs:
            obj._state.adding = False
            obj._state.db = connection.alias


# The field types `insert_rows` writes through JSON: each value's JSON form (`_json_scalar` for
# dates and UUIDs) is its column's input form. Another type (a DurationField: str(timedelta) is
# not an interval) would need a conversion of its own.
_JSON_SAFE = (
    AutoFieldMixin,
    BooleanField,
    CharField,
    DateField,  # DateTimeField too
    ForeignKey,
    IntegerField,  # and its positive and big forms
    JSONField,
    TextField,
    UUIDField,
)


def _json_scalar(value: object) -> str:
    """A value `json.dumps` has no form for, as its column's input text."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    raise TypeError(f"insert_rows: no JSON form for a {type(value).__name__}")
