"""Every hand-written SQL statement and every database-dialect branch of the service.

Each function here runs one statement (or answers one dialect question) that the ORM does not
write as well; the comment above it gives the reason (a PostgreSQL feature, a measured cost, a
lock order) and its SQLite branch sits next to it. Domain modules call these functions by name
and never open a cursor, write `.raw(` / `RawSQL` or look at a connection's vendor themselves
(`tests/test_sql_boundary.py` fails on one that does).

This module imports Django, the models, orjson and (for the LISTEN connection) psycopg, never a
domain module: the statements are the domain's, their callers own the transactions and locks
(each function says whether it runs in the caller's transaction).
"""

import functools
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, NamedTuple, cast
from uuid import UUID

import orjson
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper
from django.db.models import QuerySet
from django.db.models.sql import UpdateQuery
from django.utils import timezone

from .models import (
    Asset,
    AssetDagRunQueue,
    AssetEvent,
    AssetEventQueue,
    DagRun,
    DagRunAssetEvent,
    MetricCounter,
    Task,
    TaskInstance,
    TaskUpstream,
    TIState,
    TriggerRule,
)
from .models.runs import TI_FINISHED_STATES

# --- dialect questions ----------------------------------------------------------------------


def supports_listen(using: str = DEFAULT_DB_ALIAS) -> bool:
    """Whether the database `using` has LISTEN/NOTIFY (`notify`, `open_listener`): PostgreSQL
    does; SQLite has nothing like it, so its callers poll."""
    return connections[using].vendor == "postgresql"


def ilike_operator(db: BaseDatabaseWrapper) -> str:
    """The case-insensitive LIKE of `db`, for a lookup's `as_sql`: PostgreSQL's ILIKE; SQLite's
    LIKE is case-insensitive for ASCII already (and has no ILIKE)."""
    return "ILIKE" if db.vendor == "postgresql" else "LIKE"


# --- prepared statements (the success path's fixed statements) ---------------------------------
#
# Django's PostgreSQL cursors bind parameters on the client: each statement goes to the server as
# text with its values inlined, and PostgreSQL parses and plans it again every time. For the
# statements of the success path (TI read, outbox INSERT, TI UPDATE, downstream evaluation, run
# UPDATE, nudge read) the planning was most of the backend's CPU: 5.3 ms per 300-outlet success,
# 1.7 ms with these statements prepared (`bench/success_breakdown.py`; the downstream evaluation's
# long CASE alone took about 2 ms to plan; issue 14).
#
# `prepared_cursor()` gives a Django cursor (query logging, execute wrappers and error translation
# as usual) over a psycopg server-side-binding cursor: psycopg prepares a statement on its
# connection after `prepare_threshold` executions of it (the connection's setting,
# DATABASE_PREPARE_THRESHOLD, default 2) and then sends only its name and parameters. Only these
# statements use it: the others keep Django's client-side binding, which has no 65,535-parameter
# limit (the drain and the scheduler send statements with more parameters than that).
# DATABASE_PREPARED_STATEMENTS=False turns it off (a transaction-pooling PgBouncer cannot keep
# prepared statements); on SQLite it is the plain cursor.


class _LoggedCursor(CursorDebugWrapper):
    """Query logging (DEBUG, tests' query counts) of a prepared statement: psycopg sends it by
    name, so Django's "last executed query" is empty; log the statement's text instead."""

    def execute(self, sql, params=None):
        with self.debug_sql(sql, params):
            return CursorWrapper.execute(self, sql, params)


@contextmanager
def prepared_cursor() -> Iterator[CursorWrapper]:
    """A cursor whose statements psycopg prepares on the connection after a few executions."""
    if connection.vendor != "postgresql" or not settings.DATABASE_PREPARED_STATEMENTS:
        with connection.cursor() as plain:
            yield plain
        return
    from django.db.backends.postgresql import base

    # Typed as Any: django-stubs types this psycopg 3 cursor class without its constructor.
    server_binding_cursor: Any = base.ServerBindingCursor
    connection.ensure_connection()
    connection.validate_thread_sharing()
    raw = server_binding_cursor(connection.connection)
    wrapped = (
        _LoggedCursor(raw, connection) if connection.queries_logged else connection.make_cursor(raw)
    )
    with wrapped:
        yield wrapped


# --- health -----------------------------------------------------------------------------------


def select_one() -> bool:
    """`SELECT 1` on the default database: whether it answers (raises when it cannot be reached).

    Raw because it must not touch a table: /healthz asks whether the server answers, before any
    question about the schema."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        return cursor.fetchone() == (1,)


# --- counters (metrics) -----------------------------------------------------------------------


def add_to_counter(*, name: str, shard: int, amount: int) -> None:
    """Add `amount` to one counter shard, creating the row at its first increment: one statement,
    autocommit or in the caller's transaction.

    Raw because the ORM has no upsert with an increment: `update_or_create` is a savepoint, a
    locking SELECT and an UPDATE or INSERT, and two processes creating the same shard race into
    an IntegrityError. `INSERT ... ON CONFLICT DO UPDATE` is one statement on
    PostgreSQL and on SQLite (3.24+) alike."""
    table = MetricCounter._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (name, shard, value) VALUES (%s, %s, %s) "
            f"ON CONFLICT (name, shard) DO UPDATE SET value = {table}.value + excluded.value",
            [name, shard, amount],
        )


# --- locks ------------------------------------------------------------------------------------


def advisory_xact_lock(key: int) -> None:
    """Take PostgreSQL's transaction-scoped advisory lock `key`, waiting for its holder; in the
    caller's transaction (released by its commit or rollback).

    Raw because advisory locks are a PostgreSQL function the ORM does not wrap. SQLite: nothing,
    since it serializes writers itself (IMMEDIATE transactions)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])


# --- broker wake-ups (LISTEN / NOTIFY) ----------------------------------------------------------


def notify(channel: str, *, using: str) -> None:
    """NOTIFY `channel` on the database `using`, delivered when the current transaction commits
    (at once in autocommit). PostgreSQL only (`is_postgresql`): there is no ORM form of it."""
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, '')", [channel])


def open_listener(channel: str, *, using: str) -> Any:
    """A new psycopg connection (autocommit, Django's settings for the database `using`) that
    LISTENs on `channel`. PostgreSQL only; psycopg's own connection, never Django's, because
    Django's is closed and reopened between a broker's calls, which would drop the LISTEN."""
    import psycopg

    params = connections[using].get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    conn = psycopg.connect(**params, autocommit=True)
    conn.execute(f'LISTEN "{channel}"')
    return conn


# --- task dependencies (dependencies.evaluate) --------------------------------------------------
#
# Raw because one statement decides and writes every waiting TI downstream of the finished
# tasks whatever their number (the module docstring of `dependencies`): per waiting TI the
# counts of its upstream TIs' states, the trigger rule as one CASE over them and a conditional
# UPDATE ... FROM ... RETURNING. The ORM would need a query per TI or per rule, and has no
# UPDATE ... FROM. The finished task ids come as one JSON array parameter, one statement text
# for any number of them: PostgreSQL unnests it with jsonb_array_elements_text, SQLite with
# json_each.


def _q(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _decision_sql() -> str:
    """The trigger rules as one SQL CASE over the counts (n upstream, s success, k skipped,
    f failed, uf upstream_failed, r removed, d done). A task with no upstream is ready."""
    R = TriggerRule
    Q, UF, SK = _q(TIState.QUEUED), _q(TIState.UPSTREAM_FAILED), _q(TIState.SKIPPED)
    ud = "d >= n"
    rules = {
        # (outcome when the rule can no longer be met, ...), then the condition to run.
        R.ALL_SUCCESS: [("f + uf > 0", UF), ("k > 0", SK), ("s + r >= n", Q)],
        R.ALL_FAILED: [("s + k > 0", SK), ("f + uf + r >= n", Q)],
        R.ALL_DONE: [(ud, Q)],
        R.ALL_SKIPPED: [("s + f + uf > 0", SK), ("k >= n", Q)],
        R.ONE_SUCCESS: [(f"{ud} AND d = k", SK), (f"{ud} AND s = 0", UF), ("s > 0", Q)],
        R.ONE_FAILED: [(f"{ud} AND f + uf = 0", SK), ("f + uf > 0", Q)],
        R.ONE_DONE: [(f"{ud} AND s + f = 0", SK), ("s + f > 0", Q)],
        R.NONE_FAILED: [("f + uf > 0", UF), ("s + k + r >= n", Q)],
        R.NONE_FAILED_MIN_ONE_SUCCESS: [
            ("f + uf > 0", UF),
            ("k = n", SK),
            (f"{ud} AND s = 0", UF),
            ("s + k + r >= n AND s > 0", Q),
        ],
        R.NONE_SKIPPED: [("k > 0", SK), (ud, Q)],
        R.ALWAYS: [("1 = 1", Q)],
    }
    assert set(rules) == set(TriggerRule), "every trigger rule is evaluated"
    whens = ["WHEN n = 0 THEN " + Q]
    for rule, branches in rules.items():
        for condition, outcome in branches:
            whens.append(f"WHEN rule = {_q(rule)} AND ({condition}) THEN {outcome}")
    return "CASE " + " ".join(whens) + " ELSE NULL END"


def _evaluate_sql(*, from_tasks: bool) -> str:
    ti, task, link = TaskInstance._meta.db_table, Task._meta.db_table, TaskUpstream._meta.db_table
    waiting = _q(TIState.SCHEDULED)
    finished = ", ".join(_q(s) for s in sorted(TI_FINISHED_STATES))

    def count(state: str) -> str:
        return f"SUM(CASE WHEN ut.state = {_q(state)} THEN 1 ELSE 0 END)"

    run = DagRun._meta.db_table
    # The waiting TIs to look at: downstream of the given tasks (found from them through the
    # indexes: task by (dag, task_id), links by upstream, TI by (run, task_id)), or (the sweep)
    # every waiting TI of the run.
    cand = (
        f"""SELECT DISTINCT w.id AS ti_id, t.id AS task_pk, t.trigger_rule AS rule
    FROM {task} u0
    JOIN {link} l0 ON l0.upstream_id = u0.id
    JOIN {task} t ON t.id = l0.task_id
    JOIN {ti} w ON w.dag_run_id = %s AND w.dag_id = t.dag_id AND w.task_id = t.task_id
    WHERE u0.dag_id = (SELECT dag_id FROM {run} WHERE id = %s)
      AND u0.task_id IN (SELECT value FROM given) AND w.state = {waiting}"""
        if from_tasks
        else f"""SELECT w.id AS ti_id, t.id AS task_pk, t.trigger_rule AS rule
    FROM {ti} w
    JOIN {task} t ON t.dag_id = w.dag_id AND t.task_id = w.task_id
    WHERE w.dag_run_id = %s AND w.state = {waiting}"""
    )
    given = (
        (
            "given(value) AS (SELECT jsonb_array_elements_text(%s::jsonb)), "
            if connection.vendor == "postgresql"
            else "given(value) AS (SELECT value FROM json_each(%s)), "
        )
        if from_tasks
        else ""
    )
    return f"""
WITH {given}cand AS (
    {cand}
),
counts AS (
    SELECT c.ti_id, c.rule,
        COUNT(u.id) AS n,
        {count(TIState.SUCCESS)} AS s,
        {count(TIState.SKIPPED)} AS k,
        {count(TIState.FAILED)} AS f,
        {count(TIState.UPSTREAM_FAILED)} AS uf,
        {count(TIState.REMOVED)} AS r,
        SUM(CASE WHEN ut.state IN ({finished}) THEN 1 ELSE 0 END) AS d
    FROM cand c
    LEFT JOIN {link} l ON l.task_id = c.task_pk
    LEFT JOIN {task} u ON u.id = l.upstream_id
    LEFT JOIN {ti} ut ON ut.dag_run_id = %s AND ut.task_id = u.task_id
    GROUP BY c.ti_id, c.rule
),
decided AS (
    SELECT ti_id, {_decision_sql()} AS new_state FROM counts
)
UPDATE {ti} SET
    state = decided.new_state,
    queued_at = CASE WHEN decided.new_state = {_q(TIState.QUEUED)} THEN %s ELSE queued_at END,
    end_date = CASE WHEN decided.new_state = {_q(TIState.QUEUED)} THEN end_date ELSE %s END,
    updated_at = %s
FROM decided
WHERE {ti}.id = decided.ti_id AND {ti}.state = {waiting} AND decided.new_state IS NOT NULL
RETURNING {ti}.task_id, {ti}.state
"""


_EVALUATE_SQL: dict[tuple[str, bool], str] = {}


def _evaluate_statement(*, from_tasks: bool) -> str:
    key = (connection.vendor, from_tasks)
    if key not in _EVALUATE_SQL:
        _EVALUATE_SQL[key] = _evaluate_sql(from_tasks=from_tasks)
    return _EVALUATE_SQL[key]


def evaluate_waiting_task_instances(
    *, dag_run_id: int, finished_task_ids: Sequence[str] | None, now: datetime
) -> list[tuple[str, str]]:
    """Decide the run's waiting TIs downstream of `finished_task_ids` (None: every waiting TI of
    the run) and write the decided ones: one statement, autocommit or in the caller's
    transaction. Returns (task_id, new state) of the TIs it changed."""
    at = connection.ops.adapt_datetimefield_value(now)
    with prepared_cursor() as cursor:
        if finished_task_ids is None:
            params = [dag_run_id, dag_run_id, at, at, at]
            cursor.execute(_evaluate_statement(from_tasks=False), params)
        else:
            given = json.dumps(list(finished_task_ids))
            params = [given, dag_run_id, dag_run_id, dag_run_id, at, at, at]
            cursor.execute(_evaluate_statement(from_tasks=True), params)
        return list(cursor.fetchall())


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
        "RETURNING id, source_ti_id, source_try_number, asset_id, source_ordinal"
    )
    with connection.cursor() as cursor:
        cursor.execute(text, [now, *[list(column) for column in columns]])
        return {(ti, tn, asset, ordinal): pk for pk, ti, tn, asset, ordinal in cursor.fetchall()}


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
        return event.pk
    table = AssetEvent._meta.db_table
    with connection.cursor() as cursor:
        # ON CONFLICT waits for a concurrent insert of the same key to commit or roll back.
        cursor.execute(
            f"INSERT INTO {table} (asset_id, extra, timestamp, source_map_index, "
            "source_ordinal, external_key, external_key_scope, request_hash) "
            "VALUES (%s, %s::jsonb, %s, -1, 0, %s, %s, %s) "
            "ON CONFLICT DO NOTHING RETURNING id",
            [asset_id, json.dumps(extra), now, key, scope, body_hash],
        )
        row = cursor.fetchone()
    return row[0] if row else None


# --- the success path's TI statements (task_state.succeed) --------------------------------------


@functools.cache
def _task_instance_select() -> tuple[str, list[str]]:
    meta = TaskInstance._meta
    fields = meta.concrete_fields
    columns = ", ".join(f'"{f.column}"' for f in fields)
    return f'SELECT {columns} FROM "{meta.db_table}" WHERE "id" = %s', [f.attname for f in fields]


def read_task_instance(ti_id: UUID) -> TaskInstance | None:
    """The TI, unlocked: `TaskInstance.objects.filter(id=ti_id).first()`, autocommit or in the
    caller's transaction.

    PostgreSQL: the SELECT built once per process and the instance made by the documented
    `Model.from_db` (psycopg returns every column type of the model as the ORM would): building
    and compiling the query on every success was a measured part of its CPU
    (bench/success_breakdown.py, "TI read"). SQLite: the ORM."""
    if connection.vendor != "postgresql":
        return TaskInstance.objects.filter(id=ti_id).first()
    text, names = _task_instance_select()
    with prepared_cursor() as cursor:
        cursor.execute(text, [ti_id])
        row = cursor.fetchone()
    return None if row is None else TaskInstance.from_db(connection.alias, names, row)


def set_success_if_running(
    *, ti_id: UUID, try_number: int, end_date: datetime, now: datetime
) -> int:
    """running (that try) -> success in one UPDATE, which takes the TI row lock; in the caller's
    transaction. Returns the number of rows it matched (0 or 1).

    PostgreSQL: raw, the statement text written once: the ORM's `filter().update()` built and
    compiled it on every success while the TI lock is held. SQLite: the ORM."""
    if connection.vendor != "postgresql":
        return TaskInstance.objects.filter(
            id=ti_id, state=TIState.RUNNING, try_number=try_number
        ).update(state=TIState.SUCCESS, end_date=end_date, updated_at=now)
    with prepared_cursor() as cursor:
        cursor.execute(
            f'UPDATE "{TaskInstance._meta.db_table}" SET "state" = %s, "end_date" = %s, '
            '"updated_at" = %s WHERE "id" = %s AND "state" = %s AND "try_number" = %s',
            [TIState.SUCCESS, end_date, now, ti_id, TIState.RUNNING, try_number],
        )
        return cursor.rowcount


# --- an ORM UPDATE compiled once per process (task_state.finish_run_if_done) ---------------------
#
# `build(pk, now)` returns (queryset, values) of an UPDATE the ORM expresses (`queryset.update(
# **values)`). Building its `Exists` and `Case` expressions cost ~3.5 ms of CPU on every TI
# finish, half of a success's; on PostgreSQL the statement is compiled once, with a pk and a time
# no call passes standing in for the real ones, and run with the real ones put in their places.

_ANY_PK = -(2**62)
_ANY_TIME = datetime(1, 1, 1, 0, 0, 1, tzinfo=UTC)

UpdateBuilder = Callable[[int, datetime], tuple[QuerySet[Any], dict[str, Any]]]


@functools.cache
def _compiled_update(
    build: UpdateBuilder,
) -> tuple[str, tuple[Any, ...], tuple[int, ...], tuple[int, ...]]:
    queryset, values = build(_ANY_PK, _ANY_TIME)
    query = cast(UpdateQuery, queryset.query.chain(UpdateQuery))
    query.add_update_values(values)
    query.clear_select_clause()
    text, params = query.get_compiler(using=connection.alias).as_sql()
    pk_slots = tuple(i for i, p in enumerate(params) if type(p) is int and p == _ANY_PK)
    time_slots = tuple(
        i for i, p in enumerate(params) if isinstance(p, datetime) and p == _ANY_TIME
    )
    assert len(pk_slots) == 1 and len(time_slots) == 1, "placeholders not found in the UPDATE"
    return text, tuple(params), pk_slots, time_slots


def run_update_compiled_once(build: UpdateBuilder, *, pk: int, now: datetime) -> int:
    """`queryset.update(**values)` of `build(pk, now)`, the statement compiled once per process
    on PostgreSQL (SQLite: the ORM's update as built); autocommit or in the caller's
    transaction. Returns the number of rows updated."""
    if connection.vendor != "postgresql":
        queryset, values = build(pk, now)
        return queryset.update(**values)
    text, template, pk_slots, time_slots = _compiled_update(build)
    params = list(template)
    for slot in pk_slots:
        params[slot] = pk
    for slot in time_slots:
        params[slot] = now
    with prepared_cursor() as cursor:
        cursor.execute(text, params)
        return cursor.rowcount


# --- drain nudge coalescing (tasks.nudge_drain) -------------------------------------------------


def broker_row_waiting(*, table: str, row_id: int, now: datetime) -> bool:
    """Is the broker row `row_id` of django-q2's ORM broker table `table` still waiting for a
    cluster (its lock time passed, not taken)? One primary-key read, autocommit.

    Raw, with the table name given by the caller: this module does not import django_q (the
    caller does), and the ORM's `filter().exists()` cost a query build on every success."""
    with prepared_cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {table} WHERE id = %s AND lock <= %s", [row_id, now])
        return cursor.fetchone() is not None


# ---- issue 30: retention ----


def delete_rows(queryset: QuerySet) -> int:
    """One `DELETE FROM <table> WHERE <the queryset's filter>`; the number of rows deleted.

    Not `QuerySet.delete()`: its collector loads the rows and every dependent row to cascade
    and send signals; retention deletes the dependent rows itself, children first, by key
    lists it already holds, so each table costs one statement (Django's own fast-delete path,
    `_raw_delete`, the same on PostgreSQL and SQLite)."""
    return int(queryset._raw_delete(queryset.db) or 0)
