"""Every hand-written SQL statement and every database-dialect branch of the service.

Each function here runs one statement (or answers one dialect question) that the ORM does not
write as well; the comment above it gives the reason (a PostgreSQL feature, a measured cost, a
lock order) and its SQLite branch sits next to it. Domain modules call these functions by name
and never open a cursor, write `.raw(` / `RawSQL` or look at a connection's vendor themselves
(`tests/test_sql_boundary.py` fails on one that does).

This module imports Django and the models only, never a domain module: the statements are the
domain's, their callers own the transactions and locks (each function says whether it runs in
the caller's transaction).
"""

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from . import prepared
from .models import DagRun, MetricCounter, Task, TaskInstance, TaskUpstream, TIState, TriggerRule
from .models.runs import TI_FINISHED_STATES

# --- dialect questions ----------------------------------------------------------------------


def is_postgresql(using: str = DEFAULT_DB_ALIAS) -> bool:
    """Whether the database `using` is PostgreSQL (LISTEN/NOTIFY, advisory locks, ILIKE): the
    one place a caller asks which backend it runs on."""
    return connections[using].vendor == "postgresql"


def ilike_operator(db: BaseDatabaseWrapper) -> str:
    """The case-insensitive LIKE of `db`, for a lookup's `as_sql`: PostgreSQL's ILIKE; SQLite's
    LIKE is case-insensitive for ASCII already (and has no ILIKE)."""
    return "ILIKE" if db.vendor == "postgresql" else "LIKE"


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

    Raw because the ORM has no upsert with an increment: `update_or_create` is a SELECT and an
    UPDATE or INSERT (3 statements with its savepoint) and two processes creating the same shard
    race into an IntegrityError. `INSERT ... ON CONFLICT DO UPDATE` is one statement on
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
    with prepared.cursor() as cursor:
        if finished_task_ids is None:
            params = [dag_run_id, dag_run_id, at, at, at]
            cursor.execute(_evaluate_statement(from_tasks=False), params)
        else:
            given = json.dumps(list(finished_task_ids))
            params = [given, dag_run_id, dag_run_id, dag_run_id, at, at, at]
            cursor.execute(_evaluate_statement(from_tasks=True), params)
        return list(cursor.fetchall())
