"""The statements of what follows a TI's finish (`dependencies`): the downstream evaluation,
with the trigger-rule table as one SQL CASE (`_decision_sql`), and the run-finish UPDATE
compiled once per process (`run_update_compiled_once`, which calls back
`dependencies._finish_run_update` once to build it: the path's one return climb).
"""

import functools
import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, cast

from django.db import connection
from django.db.models import QuerySet
from django.db.models.sql import UpdateQuery

from ..models import DagRun, Task, TaskInstance, TaskUpstream, TIState, TriggerRule, XCom
from ..models.runs import TI_FINISHED_STATES
from .connection import prepared_cursor

RETURN_VALUE_KEY = "return_value"

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
    # A mapped task's TI of map index -1 (issue 25): expanded, not queued, once its rule is
    # met (`_write_sql`).
    unexpanded = (
        "(w.map_index = -1 AND (t.map_length IS NOT NULL OR t.map_upstream <> '')) AS unexpanded,"
        " t.map_length, t.map_upstream, w.map_index, t.retries"
    )
    # The waiting TIs to look at: downstream of the given tasks (found from them through the
    # indexes: task by (dag, task_id), links by upstream, TI by (run, task_id)), or (the sweep)
    # every waiting TI of the run.
    cand = (
        f"""SELECT DISTINCT w.id AS ti_id, t.id AS task_pk, t.trigger_rule AS rule, {unexpanded}
    FROM {task} u0
    JOIN {link} l0 ON l0.upstream_id = u0.id
    JOIN {task} t ON t.id = l0.task_id
    JOIN {ti} w ON w.dag_run_id = %s AND w.dag_id = t.dag_id AND w.task_id = t.task_id
    WHERE u0.dag_id = (SELECT dag_id FROM {run} WHERE id = %s)
      AND u0.task_id IN (SELECT value FROM given) AND w.state = {waiting}"""
        if from_tasks
        else f"""SELECT w.id AS ti_id, t.id AS task_pk, t.trigger_rule AS rule, {unexpanded}
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
    SELECT c.ti_id, c.rule, c.unexpanded, c.map_length, c.map_upstream, c.map_index, c.retries,
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
    GROUP BY c.ti_id, c.rule, c.unexpanded, c.map_length, c.map_upstream, c.map_index, c.retries
),
decided AS (
    SELECT ti_id, unexpanded, map_length, map_upstream, map_index, retries,
        {_decision_sql()} AS new_state
    FROM counts
){_write_sql()}"""


def _write_sql() -> str:
    """The write of the evaluation statement, after its `decided` (ti_id, unexpanded,
    map_length, map_upstream, new_state). On PostgreSQL it also expands the mapped tasks' TIs
    of map index -1 whose rule is met (issue 25; the rules of `mapping`, Airflow 3.3.2's
    `TaskMap.expand_mapped_task`): their length (the literal's, the one the Task SDK pushed with
    the upstream's return value, else that value's length), the -1 TI becomes map index 0
    (queued) or is skipped (length 0) or upstream_failed (nothing to map over), and map indexes
    1..n-1 are inserted as copies of it, in the same statement: the INSERT reads the UPDATE's
    RETURNING, so of two evaluations racing for one TI only the one whose UPDATE changed it
    inserts. A map index of a task mapped over a return value, waiting again (a clear) when
    its rule is met, is revised as Airflow's `DagRun._revise_map_indexes_if_mapped` does: beyond
    the new length it is removed, and map index 0's row inserts the map indexes the new length
    adds. New TIs are a first try (try 1, the task's retries). SQLite (no data-modifying WITH)
    leaves a -1 TI waiting and returns it as `scheduled` for `mapping.expand`, and does not
    revise."""
    ti, xcom = TaskInstance._meta.db_table, XCom._meta.db_table
    waiting, queued = _q(TIState.SCHEDULED), _q(TIState.QUEUED)
    set_times = f"""
    queued_at = CASE WHEN outcome.new_state = {queued} THEN %s ELSE {ti}.queued_at END,
    end_date = CASE WHEN outcome.new_state = {queued} THEN {ti}.end_date ELSE %s END,
    updated_at = %s"""
    if connection.vendor != "postgresql":
        return f""",
outcome AS (
    SELECT ti_id, CASE WHEN unexpanded AND new_state = {queued} THEN {waiting}
        ELSE new_state END AS new_state
    FROM decided WHERE new_state IS NOT NULL
)
UPDATE {ti} SET
    state = outcome.new_state,{set_times}
FROM outcome
WHERE {ti}.id = outcome.ti_id AND {ti}.state = {waiting}
RETURNING {ti}.task_id, {ti}.state
"""
    copied: dict[str, str] = {
        str(field.column): (
            "gen_random_uuid()"
            if field.column == "id"
            else "g.i"
            if field.column == "map_index"
            else "1"
            if field.column == "try_number"
            else "changed.task_retries"
            if field.column == "max_tries"
            else f"changed.{field.column}"
        )
        for field in TaskInstance._meta.concrete_fields
    }
    return f""",
lengths AS (
    SELECT d.ti_id, COALESCE(d.map_length, x.mapped_length, CASE jsonb_typeof(x.value)
        WHEN 'array' THEN jsonb_array_length(x.value)
        WHEN 'object' THEN (SELECT COUNT(*) FROM jsonb_object_keys(x.value)) END) AS len,
        CASE WHEN d.unexpanded THEN 1 WHEN d.map_index = 0 THEN (
            SELECT MAX(o.map_index) + 1 FROM {ti} o
            WHERE o.dag_run_id = w.dag_run_id AND o.task_id = w.task_id) END AS grow_from
    FROM decided d
    JOIN {ti} w ON w.id = d.ti_id
    LEFT JOIN {xcom} x ON d.map_upstream <> '' AND x.dag_id = w.dag_id
        AND x.run_id = w.run_id AND x.task_id = d.map_upstream AND x.map_index = -1
        AND x.key = {_q(RETURN_VALUE_KEY)}
    WHERE d.new_state = {queued} AND (d.unexpanded OR d.map_upstream <> '')
),
outcome AS (
    SELECT d.ti_id, d.unexpanded, d.retries, l.len, l.grow_from, CASE
        WHEN l.ti_id IS NULL THEN d.new_state
        WHEN NOT d.unexpanded AND (l.len IS NULL OR d.map_index < l.len) THEN {queued}
        WHEN NOT d.unexpanded THEN {_q(TIState.REMOVED)}
        WHEN l.len IS NULL THEN {_q(TIState.UPSTREAM_FAILED)}
        WHEN l.len = 0 THEN {_q(TIState.SKIPPED)}
        ELSE {queued} END AS new_state
    FROM decided d LEFT JOIN lengths l ON l.ti_id = d.ti_id
    WHERE d.new_state IS NOT NULL
),
changed AS (
    UPDATE {ti} SET
        state = outcome.new_state,
        map_index = CASE WHEN outcome.unexpanded AND outcome.len > 0 THEN 0
            ELSE {ti}.map_index END,{set_times}
    FROM outcome
    WHERE {ti}.id = outcome.ti_id AND {ti}.state = {waiting}
    RETURNING {ti}.*, outcome.len AS expand_length, outcome.grow_from,
        outcome.retries AS task_retries
),
expanded AS (
    INSERT INTO {ti} ({", ".join(copied)})
    SELECT {", ".join(copied.values())}
    FROM changed
    CROSS JOIN generate_series(changed.grow_from, changed.expand_length - 1) AS g(i)
    WHERE changed.state = {queued} AND changed.grow_from IS NOT NULL
)
SELECT task_id, state FROM changed
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
    transaction. Returns (task_id, new state) of the TIs it changed, a mapped task's expanded
    TIs once (its map index 0's row); on SQLite `scheduled` is a mapped task's TI of map index
    -1 whose rule is met, left waiting for the caller to expand (`mapping.expand`)."""
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


# --- an ORM UPDATE compiled once per process (dependencies.finish_run_if_done) ------------------
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
