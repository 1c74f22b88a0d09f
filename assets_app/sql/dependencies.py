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

from ..models import (
    BackfillDagRun,
    Dag,
    DagRun,
    DagRunState,
    DagRunType,
    MapCombine,
    SetupLinkKind,
    Task,
    TaskInstance,
    TaskSetupLink,
    TaskUpstream,
    TIState,
    TriggerRule,
    XCom,
)
from ..models.runs import TI_FINISHED_STATES, TI_UNFINISHED_STATES
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
    """The trigger rules as one SQL CASE over the counts of the direct upstream TIs (n
    upstream, s success, k skipped, f failed, uf upstream_failed, r removed, d done; of setups:
    ns upstream, ss success, ks skipped). A task with no upstream is ready, and so is one whose
    rule is `always`.

    Setup and teardown tasks (issue 39, Airflow 3.3.2's `TriggerRuleDep`): a task that is not
    a teardown first meets its indirect setups' constraint (`_evaluate_setup_constraint`, the
    counts of its `setup` links' TIs: sn, ssu success, sf failed or upstream_failed, sk
    skipped, sr removed): one failed makes it upstream_failed, one skipped skipped, before its
    own rule is looked at. That it runs only once they all succeeded, and a teardown only once
    its scope is done, is `_setups_ok_sql`, applied with the past (`decided`)."""
    R = TriggerRule
    Q, UF, SK = _q(TIState.QUEUED), _q(TIState.UPSTREAM_FAILED), _q(TIState.SKIPPED)
    RM = _q(TIState.REMOVED)
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
        R.ALL_DONE_SETUP_SUCCESS: [
            (f"{ud} AND ns > 0 AND ks >= ns", SK),
            (f"{ud} AND ns > 0 AND ss = 0", UF),
            (ud, Q),
        ],
    }
    assert set(rules) == set(TriggerRule), "every trigger rule is evaluated"
    whens = [
        "WHEN n = 0 THEN " + Q,
        f"WHEN rule = {_q(R.ALWAYS)} THEN {Q}",
        f"WHEN NOT teardown AND sf > 0 THEN {UF}",
        f"WHEN NOT teardown AND sk > 0 THEN {SK}",
        f"WHEN NOT teardown AND sr > 0 AND ssu > 0 AND map_index > -1 AND map_index >= ssu"
        f" THEN {RM}",
    ]
    for rule, branches in rules.items():
        for condition, outcome in branches:
            whens.append(f"WHEN rule = {_q(rule)} AND ({condition}) THEN {outcome}")
    return "CASE " + " ".join(whens) + " ELSE NULL END"


def _setups_ok_sql() -> str:
    """Whether the setup and teardown constraints let a TI its rule would queue run (issue 39):
    a task that is not a teardown needs every indirect setup succeeded (removed ones aside for
    a map index, `_evaluate_setup_constraint`); a teardown whose rule is met needs the tasks
    between its setups and itself done (`_evaluate_teardown_scope`: scn of them, scd done).
    Neither holds back a task with no upstream or whose rule is `always`."""
    return (
        f"(n = 0 OR rule = {_q(TriggerRule.ALWAYS)} OR (CASE WHEN teardown THEN scd >= scn"
        " ELSE sn - ssu - (CASE WHEN map_index > -1 THEN sr ELSE 0 END) <= 0 END))"
    )


# The trigger rules that are met by one upstream TI: inside a mapped group Airflow 3.3.2 has them
# wait on every map index of an upstream of the group, not the one of their own
# (`TriggerRuleDep._get_relevant_upstream_map_indexes`, "is_fast_triggered").
_FAST_TRIGGERED = (TriggerRule.ONE_SUCCESS, TriggerRule.ONE_FAILED, TriggerRule.ONE_DONE)


def _past_sql() -> str:
    """The CTEs `prev` and `past` of the evaluation statement (issue 39): per candidate TI of a
    task that depends on the past (`cand.dop`), whether Airflow 3.3.2's `PrevDagrunDep` passes
    (`past.ok`); a TI with no row in `past` does not depend on it. Passes: a run without a
    logical date (asset-triggered, manual without one: `DagRun.get_previous_dagrun` gives
    None); the first run of a backfill (its planned run of sort ordinal 1); no previous run
    (by logical date; with catchup, the previous run not manual:
    `get_previous_scheduled_dagrun`); with catchup, a previous run before the Dag's start date.
    Else the task's TIs in the previous run: none there passes only with
    ignore_first_depends_on_past and no TI of the task in any earlier run; one not success or
    skipped (running and waiting count, as Airflow's) holds the TI back, and so does, with
    wait_for_downstream, a TI of a direct downstream task there not success or skipped. Only
    TIs of such tasks are looked at; each lookup goes through an index (the Dag's runs by
    logical date, a run's TIs by task). The one lookup that may read a Dag's history, "no TI
    of the task in any earlier run", is made only with ignore_first_depends_on_past and a
    previous run without the task, which happens once, just after the task was added."""
    ti, task, link, run = (
        TaskInstance._meta.db_table,
        Task._meta.db_table,
        TaskUpstream._meta.db_table,
        DagRun._meta.db_table,
    )
    dag, bdr = Dag._meta.db_table, BackfillDagRun._meta.db_table
    done = f"{_q(TIState.SUCCESS)}, {_q(TIState.SKIPPED)}"
    return f""",
prev AS (
    SELECT c.ti_id, c.task_pk, r.dag_id, r.logical_date AS ld, d.catchup, d.start_date,
        (r.run_type = {_q(DagRunType.BACKFILL)} AND EXISTS (
            SELECT 1 FROM {bdr} b WHERE b.dag_run_id = r.id AND b.sort_ordinal = 1)) AS first_fill,
        (SELECT p.id FROM {run} p
         WHERE p.dag_id = r.dag_id AND p.logical_date < r.logical_date
           AND (NOT d.catchup OR p.run_type <> {_q(DagRunType.MANUAL)})
         ORDER BY p.logical_date DESC LIMIT 1) AS prev_id
    FROM cand c
    JOIN {run} r ON r.id = c.run_pk
    JOIN {dag} d ON d.dag_id = r.dag_id
    WHERE c.dop AND r.logical_date IS NOT NULL
),
past AS (
    SELECT v.ti_id, CASE
        WHEN v.first_fill OR v.prev_id IS NULL THEN TRUE
        WHEN v.catchup AND v.start_date IS NOT NULL AND pr.logical_date < v.start_date THEN TRUE
        WHEN NOT EXISTS (
            SELECT 1 FROM {ti} pt WHERE pt.dag_run_id = v.prev_id AND pt.task_id = t.task_id)
        THEN CASE WHEN NOT t.ignore_first_depends_on_past THEN FALSE ELSE NOT EXISTS (
            SELECT 1 FROM {run} orun
            WHERE orun.dag_id = v.dag_id AND orun.logical_date < v.ld AND EXISTS (
                SELECT 1 FROM {ti} o WHERE o.dag_run_id = orun.id AND o.task_id = t.task_id))
        END
        WHEN EXISTS (
            SELECT 1 FROM {ti} pt WHERE pt.dag_run_id = v.prev_id AND pt.task_id = t.task_id
              AND pt.state NOT IN ({done}))
        THEN FALSE
        WHEN t.wait_for_downstream AND EXISTS (
            SELECT 1 FROM {link} ld
            JOIN {task} dt ON dt.id = ld.task_id
            JOIN {ti} pd ON pd.dag_run_id = v.prev_id AND pd.task_id = dt.task_id
            WHERE ld.upstream_id = t.id AND pd.state NOT IN ({done}))
        THEN FALSE
        ELSE TRUE END AS ok
    FROM prev v
    JOIN {task} t ON t.id = v.task_pk
    LEFT JOIN {run} pr ON pr.id = v.prev_id
)"""


def _woken_sql(*, unexpanded: str) -> str:
    """The evaluation's second set of candidates when given finished tasks (issue 39): the
    waiting TIs, in the Dag's active runs with a later logical date, of the tasks whose past
    those finishes may complete: a finished task that depends on the past, and a task with
    wait_for_downstream upstream of a finished one. Which of them the finished run is the
    previous run of is `past`'s to decide; the active runs bound how many are looked at. For
    a Dag that uses neither, two index probes on the finished tasks that find nothing."""
    ti, task, link, run = (
        TaskInstance._meta.db_table,
        Task._meta.db_table,
        TaskUpstream._meta.db_table,
        DagRun._meta.db_table,
    )
    active = f"{_q(DagRunState.QUEUED)}, {_q(DagRunState.RUNNING)}"
    return f"""
    UNION
    SELECT w.id AS ti_id, t.id AS task_pk, t.trigger_rule AS rule, {unexpanded},
        w.dag_run_id AS run_pk, t.depends_on_past AS dop
    FROM (
        SELECT u0.id AS task_pk FROM {task} u0
        WHERE u0.dag_id = (SELECT dag_id FROM this_run) AND u0.task_id IN (SELECT value FROM given)
          AND u0.depends_on_past
        UNION
        SELECT lw.upstream_id FROM {task} u0
        JOIN {link} lw ON lw.task_id = u0.id
        JOIN {task} tw ON tw.id = lw.upstream_id AND tw.wait_for_downstream
        WHERE u0.dag_id = (SELECT dag_id FROM this_run) AND u0.task_id IN (SELECT value FROM given)
    ) k
    JOIN {task} t ON t.id = k.task_pk
    JOIN this_run r0 ON r0.logical_date IS NOT NULL
    JOIN {run} r ON r.dag_id = r0.dag_id AND r.state IN ({active})
        AND r.logical_date > r0.logical_date
    JOIN {ti} w ON w.dag_run_id = r.id AND w.task_id = t.task_id
        AND w.state = {_q(TIState.SCHEDULED)}"""


def _evaluate_sql(*, from_tasks: bool) -> str:
    ti, task, link = TaskInstance._meta.db_table, Task._meta.db_table, TaskUpstream._meta.db_table
    setup_link = TaskSetupLink._meta.db_table
    waiting = _q(TIState.SCHEDULED)
    finished = ", ".join(_q(s) for s in sorted(TI_FINISHED_STATES))

    def count(state: str, *, kind: str = "up", setup: bool = False) -> str:
        among = f"p.kind = {_q(kind)}" + (" AND p.up_setup" if setup else "")
        return f"SUM(CASE WHEN {among} AND p.state = {_q(state)} THEN 1 ELSE 0 END)"

    def number(kind: str, *, setup: bool = False) -> str:
        among = f"p.kind = {_q(kind)}" + (" AND p.up_setup" if setup else "")
        return f"COUNT(CASE WHEN {among} THEN p.up_id END)"

    S, SC = SetupLinkKind.SETUP.value, SetupLinkKind.SCOPE.value

    run = DagRun._meta.db_table
    # A mapped task's TI of map index -1 (issue 25): expanded, not queued, once its rule is
    # met (`_write_sql`).
    unexpanded = (
        "(w.map_index = -1 AND (t.map_length IS NOT NULL OR t.map_upstream <> '')) AS unexpanded,"
        " t.map_length, t.map_upstream, w.map_index, t.retries, t.map_group,"
        " t.is_teardown AS teardown"
    )
    # The waiting TIs to look at: downstream of the given tasks (found from them through the
    # indexes: task by (dag, task_id), links by upstream, TI by (run, task_id)), or (the sweep)
    # every waiting TI of the run.
    # Issue 39: with them, the waiting TIs of later runs whose past these finishes may complete
    # (`_woken_sql`); each candidate carries its run (`run_pk`) and whether its task depends on
    # the past (`dop`, decided in `past`).
    woken = _woken_sql(unexpanded=unexpanded)
    cand = (
        f"""SELECT DISTINCT w.id AS ti_id, t.id AS task_pk, t.trigger_rule AS rule, {unexpanded},
        w.dag_run_id AS run_pk, t.depends_on_past AS dop
    FROM {task} u0
    JOIN {link} l0 ON l0.upstream_id = u0.id
    JOIN {task} t ON t.id = l0.task_id
    JOIN {ti} w ON w.dag_run_id = (SELECT id FROM this_run) AND w.dag_id = t.dag_id
        AND w.task_id = t.task_id
    WHERE u0.dag_id = (SELECT dag_id FROM this_run)
      AND u0.task_id IN (SELECT value FROM given) AND w.state = {waiting}
    UNION
    SELECT w.id AS ti_id, t.id AS task_pk, t.trigger_rule AS rule, {unexpanded},
        w.dag_run_id AS run_pk, t.depends_on_past AS dop
    FROM {task} u0
    JOIN {setup_link} s0 ON s0.other_id = u0.id
    JOIN {task} t ON t.id = s0.task_id
    JOIN {ti} w ON w.dag_run_id = (SELECT id FROM this_run) AND w.dag_id = t.dag_id
        AND w.task_id = t.task_id
    WHERE u0.dag_id = (SELECT dag_id FROM this_run)
      AND u0.task_id IN (SELECT value FROM given) AND w.state = {waiting}{woken}"""
        if from_tasks
        else f"""SELECT w.id AS ti_id, t.id AS task_pk, t.trigger_rule AS rule, {unexpanded},
        w.dag_run_id AS run_pk, t.depends_on_past AS dop
    FROM {ti} w
    JOIN {task} t ON t.dag_id = w.dag_id AND t.task_id = w.task_id
    WHERE w.dag_run_id = (SELECT id FROM this_run) AND w.state = {waiting}"""
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
    given += f"this_run AS (SELECT id, dag_id, logical_date FROM {run} WHERE id = %s), "
    fast = ", ".join(_q(rule) for rule in _FAST_TRIGGERED)
    columns = (
        "c.ti_id, c.task_pk, c.rule, c.unexpanded, c.map_length, c.map_upstream, c.map_index,"
        " c.retries, c.map_group, c.run_pk, c.teardown"
    )
    # Per waiting TI, its upstream TIs' states (`ups`): every TI of an upstream task, except
    # inside a mapped group (issue 25; Airflow 3.3.2 `TriggerRuleDep._iter_upstream_conditions`):
    # map index i of a task counts only map index i of an upstream task of its group (and that
    # task's -1 TI, while it is not expanded). Two branches, each joining TIs by equality, so
    # that a 1,000-wide group's evaluation looks up one upstream TI per waiting one instead of
    # filtering a thousand.
    return f"""
WITH {given}cand AS (
    {cand}
),
links AS (
    SELECT c.ti_id, c.run_pk, c.map_index, u.id AS up_id, u.task_id AS up_task_id,
        COALESCE(u.is_setup, FALSE) AS up_setup,
        COALESCE(c.map_group <> '' AND u.map_group = c.map_group AND c.map_index >= 0
            AND c.rule NOT IN ({fast}), FALSE) AS per_index
    FROM cand c
    LEFT JOIN {link} l ON l.task_id = c.task_pk
    LEFT JOIN {task} u ON u.id = l.upstream_id
),
ups AS (
    SELECT k.ti_id, k.up_id, ut.state, 'up' AS kind, k.up_setup
    FROM links k
    LEFT JOIN {ti} ut ON ut.dag_run_id = k.run_pk AND ut.task_id = k.up_task_id
    WHERE NOT k.per_index
    UNION ALL
    SELECT k.ti_id, k.up_id, COALESCE(ut.state, um.state) AS state, 'up' AS kind, k.up_setup
    FROM links k
    LEFT JOIN {ti} ut ON ut.dag_run_id = k.run_pk AND ut.task_id = k.up_task_id
        AND ut.map_index = k.map_index
    LEFT JOIN {ti} um ON um.dag_run_id = k.run_pk AND um.task_id = k.up_task_id
        AND um.map_index = -1
    WHERE k.per_index
    UNION ALL
    -- Issue 39: the TIs of the tasks a candidate waits for beyond its direct upstream (its
    -- indirect setups, a teardown's scope), every TI of each (none is mapped in a mapped
    -- group: the sync refuses such setups and teardowns).
    SELECT c.ti_id, o.id AS up_id, ot.state, s.kind, FALSE AS up_setup
    FROM cand c
    JOIN {setup_link} s ON s.task_id = c.task_pk
    JOIN {task} o ON o.id = s.other_id
    LEFT JOIN {ti} ot ON ot.dag_run_id = c.run_pk AND ot.task_id = o.task_id
),
counts AS (
    SELECT {columns},
        {number("up")} AS n,
        {count(TIState.SUCCESS)} AS s,
        {count(TIState.SKIPPED)} AS k,
        {count(TIState.FAILED)} AS f,
        {count(TIState.UPSTREAM_FAILED)} AS uf,
        {count(TIState.REMOVED)} AS r,
        SUM(CASE WHEN p.kind = 'up' AND p.state IN ({finished}) THEN 1 ELSE 0 END) AS d,
        {number("up", setup=True)} AS ns,
        {count(TIState.SUCCESS, setup=True)} AS ss,
        {count(TIState.SKIPPED, setup=True)} AS ks,
        {number(S)} AS sn,
        {count(TIState.SUCCESS, kind=S)} AS ssu,
        {count(TIState.FAILED, kind=S)} + {count(TIState.UPSTREAM_FAILED, kind=S)} AS sf,
        {count(TIState.SKIPPED, kind=S)} AS sk,
        {count(TIState.REMOVED, kind=S)} AS sr,
        {number(SC)} AS scn,
        SUM(CASE WHEN p.kind = {_q(SC)} AND p.state IN ({finished}) THEN 1 ELSE 0 END) AS scd
    FROM cand c
    JOIN ups p ON p.ti_id = c.ti_id
    GROUP BY {columns}
){_past_sql()},
ruled AS (
    SELECT ti_id, task_pk, unexpanded, map_length, map_upstream, map_index, retries, map_group,
        {_decision_sql()} AS new_state, {_setups_ok_sql()} AS setups_ok
    FROM counts
),
decided AS (
    -- Depending on the past holds back only a TI its rule would queue: Airflow's scheduler
    -- still marks it upstream_failed / skipped (its TriggerRuleDep sets the state whatever
    -- PrevDagrunDep says).
    SELECT r.ti_id, r.task_pk, r.unexpanded, r.map_length, r.map_upstream, r.map_index,
        r.retries, r.map_group,
        CASE WHEN r.new_state = {_q(TIState.QUEUED)}
            AND NOT (COALESCE(p.ok, TRUE) AND r.setups_ok) THEN NULL
            ELSE r.new_state END AS new_state
    FROM ruled r LEFT JOIN past p ON p.ti_id = r.ti_id
){_write_sql()}"""


def _copy_columns(source: str, **overrides: str) -> tuple[str, str]:
    """The INSERT column list and SELECT list of TaskInstance rows made from `source`'s row
    (its columns, as RETURNING gives them): a new id, map index `g.i`, `overrides` by column."""
    values = {"id": "gen_random_uuid()", "map_index": "g.i", **overrides}
    columns = [str(field.column) for field in TaskInstance._meta.concrete_fields]
    return ", ".join(columns), ", ".join(values.get(c, f"{source}.{c}") for c in columns)


def _source_length_sql(task_id: str) -> str:
    """The length the return value of the upstream task named by the SQL `task_id` gives, in
    the run of the TI `w` (PostgreSQL), as Airflow 3.3.2's `get_task_map_length` of a
    `PlainXComArg`: of an unmapped task, the length the Task SDK pushed with its return value
    (`XCom.mapped_length`, Airflow's TaskMap) else that value's if a list or object; of a mapped
    one (second order), NULL while one of its TIs is unfinished, else the count of the return
    values its map indexes pushed. NULL: nothing to map over."""
    ti, xcom, task = TaskInstance._meta.db_table, XCom._meta.db_table, Task._meta.db_table
    unfinished = ", ".join(_q(state) for state in TI_UNFINISHED_STATES)
    key = _q(RETURN_VALUE_KEY)
    return f"""(CASE WHEN NOT EXISTS (SELECT 1 FROM {task} um WHERE um.dag_id = w.dag_id
            AND um.task_id = {task_id} AND (um.map_length IS NOT NULL OR um.map_upstream <> ''))
        THEN (SELECT COALESCE(x.mapped_length, CASE jsonb_typeof(x.value)
            WHEN 'array' THEN jsonb_array_length(x.value)
            WHEN 'object' THEN (SELECT COUNT(*) FROM jsonb_object_keys(x.value)) END)
            FROM {xcom} x WHERE x.dag_id = w.dag_id AND x.run_id = w.run_id
            AND x.task_id = {task_id} AND x.map_index = -1 AND x.key = {key})
        WHEN EXISTS (SELECT 1 FROM {ti} o WHERE o.dag_run_id = w.dag_run_id
            AND o.task_id = {task_id} AND o.state IN ({unfinished})) THEN NULL
        ELSE (SELECT COUNT(*) FROM {xcom} m WHERE m.dag_id = w.dag_id AND m.run_id = w.run_id
            AND m.task_id = {task_id} AND m.map_index >= 0 AND m.key = {key}) END)"""


def _write_sql() -> str:
    """The write of the evaluation statement, after its `decided` (ti_id, task_pk, unexpanded,
    map_length, map_upstream, map_index, retries, map_group, new_state). On PostgreSQL it also
    expands the mapped tasks' TIs of map index -1 whose rule is met (issue 25; the rules of
    `mapping`, Airflow 3.3.2's `TaskMap.expand_mapped_task`): their length (the literal's, or
    the one the upstream's return value gives, `_source_length_sql`; over several zipped or
    concatenated (`Task.map_combine`, issue 39), as Airflow's `get_task_map_length` combines
    them: nothing to map over if one gives nothing, else the shortest's length, the longest's
    with a fillvalue, or their sum), the -1 TI becomes map index 0 (queued) or is skipped
    (length 0) or upstream_failed (nothing to map over), and map indexes 1..n-1 are inserted as
    copies of it, in the same statement: the INSERT reads the UPDATE's RETURNING, so of two
    evaluations racing for one TI only the one whose UPDATE changed it inserts (the UPDATE
    re-checks `map_index = -1` too, since a mapped group's task stays waiting when it expands,
    below). A map index of a task mapped over a return value, waiting again (a clear) when its
    rule is met, is revised as Airflow's `DagRun._revise_map_indexes_if_mapped` does: beyond the
    new length it is removed, and map index 0's row inserts the map indexes the new length adds.
    New TIs are a first try (try 1, the task's retries; try 0 while they wait, and a waiting TI
    this statement queues gets try 1, `models.runs.first_try_number`).

    A mapped group (`Task.map_group`) expands as one: when the statement expands (or grows) a
    task of the group, the group's tasks downstream of others in it get the same map indexes,
    left waiting (`scheduled`), since map index i of each runs after map index i of its upstream
    in the group (`ups`). The group's roots are left to expand by their own rule: one expanded
    for another here would stay waiting when its own upstream's finish, racing this statement,
    no longer found it at -1. A non-root's -1 TI becomes map index 0: locked first, in task_id
    order (`locked`: two roots' statements spreading to the same tasks wait for each other
    instead of deadlocking), then an UPDATE re-checking it is still -1 and waiting, whose
    RETURNING feeds the INSERT of 1..n-1, so again only one racing statement inserts; and
    a grown group's tasks get the added map indexes (ON CONFLICT DO NOTHING: a task's grown rows
    are not guarded by a row of its own). Tasks with a TI decided in this statement expand by
    their own rule instead.

    SQLite (no data-modifying WITH) leaves a -1 TI waiting and returns it as `scheduled` for
    `mapping.expand`, and does not revise."""
    ti = TaskInstance._meta.db_table
    task, link = Task._meta.db_table, TaskUpstream._meta.db_table
    waiting, queued = _q(TIState.SCHEDULED), _q(TIState.QUEUED)
    # Queued: the TI's first try (Airflow counts one when its scheduler queues a TI; a cleared
    # TI keeps the next try its clear gave it). Skipped or upstream_failed: its try stays.
    greatest = "GREATEST" if connection.vendor == "postgresql" else "MAX"
    set_times = f"""
    try_number = CASE WHEN outcome.new_state = {queued}
        THEN {greatest}({ti}.try_number, 1) ELSE {ti}.try_number END,
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
RETURNING {ti}.task_id, {ti}.state, {ti}.dag_run_id
"""
    columns, copies = _copy_columns("changed", try_number="1", max_tries="changed.task_retries")
    fresh = {
        "try_number": "0",  # waiting: no try counted yet (`models.runs.first_try_number`)
        "max_tries": "src.task_retries",
        "state": waiting,
        "hostname": "''",
        "unixname": "''",
        "pid": "NULL",
        "start_date": "NULL",
        "end_date": "NULL",
        "last_heartbeat_at": "NULL",
        "claimed_by": "''",
        "claimed_at": "NULL",
        "retry_at": "NULL",
    }
    _, member_copies = _copy_columns("src", **fresh)
    row_columns = ", ".join(str(field.column) for field in TaskInstance._meta.concrete_fields)
    return f""",
lengths AS (
    SELECT d.ti_id, COALESCE(d.map_length, CASE WHEN tk.map_combine = '' THEN
        {_source_length_sql("d.map_upstream")} ELSE (
        SELECT CASE WHEN COUNT(*) = COUNT(s.len) THEN CASE tk.map_combine
            WHEN {_q(MapCombine.ZIP)} THEN MIN(s.len)
            WHEN {_q(MapCombine.ZIP_LONGEST)} THEN MAX(s.len) ELSE SUM(s.len) END END
        FROM (SELECT {_source_length_sql("src.task_id")} AS len
            FROM jsonb_array_elements_text(tk.map_sources) AS src(task_id)) s) END) AS len,
        CASE WHEN d.unexpanded THEN 1 WHEN d.map_index = 0 THEN (
            SELECT MAX(o.map_index) + 1 FROM {ti} o
            WHERE o.dag_run_id = w.dag_run_id AND o.task_id = w.task_id) END AS grow_from
    FROM decided d
    JOIN {ti} w ON w.id = d.ti_id
    JOIN {task} tk ON tk.id = d.task_pk
    WHERE d.new_state = {queued} AND (d.unexpanded OR d.map_upstream <> '')
),
outcome AS (
    SELECT d.ti_id, d.task_pk, d.unexpanded, d.retries, d.map_group, l.len, l.grow_from, CASE
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
        AND (NOT outcome.unexpanded OR {ti}.map_index = -1)
    RETURNING {ti}.*, outcome.len AS expand_length, outcome.grow_from,
        outcome.retries AS task_retries, outcome.map_group
),
expanded AS (
    INSERT INTO {ti} ({columns})
    SELECT {copies}
    FROM changed
    CROSS JOIN generate_series(changed.grow_from, changed.expand_length - 1) AS g(i)
    WHERE changed.state = {queued} AND changed.grow_from IS NOT NULL
),
spread AS (
    SELECT DISTINCT dag_run_id, dag_id, map_group, expand_length AS len FROM changed
    WHERE map_group <> '' AND state = {queued} AND grow_from IS NOT NULL
),
members AS (
    SELECT DISTINCT ON (w.task_id) w.*, s.len, t.retries AS task_retries
    FROM spread s
    JOIN {task} t ON t.dag_id = s.dag_id AND t.map_group = s.map_group
    JOIN {ti} w ON w.dag_run_id = s.dag_run_id AND w.task_id = t.task_id
    WHERE t.id NOT IN (SELECT task_pk FROM outcome) AND EXISTS (
        SELECT 1 FROM {link} lg JOIN {task} ug ON ug.id = lg.upstream_id
        WHERE lg.task_id = t.id AND ug.map_group = t.map_group)
    ORDER BY w.task_id, w.map_index DESC
),
locked AS (
    SELECT w.id FROM {ti} w JOIN members m ON m.id = w.id
    WHERE m.map_index = -1 AND m.len > 0 AND w.map_index = -1 AND w.state = {waiting}
    ORDER BY w.task_id
    FOR UPDATE OF w
),
grouped AS (
    UPDATE {ti} SET map_index = 0, updated_at = %s
    FROM members m JOIN locked k ON k.id = m.id
    WHERE {ti}.id = m.id AND {ti}.map_index = -1 AND {ti}.state = {waiting}
    RETURNING {ti}.*, m.len, m.task_retries
),
member_rows AS (
    SELECT {row_columns}, len, task_retries, 1 AS grow_from FROM grouped
    UNION ALL
    SELECT {row_columns}, len, task_retries, map_index + 1 FROM members WHERE map_index >= 0
),
spread_rows AS (
    INSERT INTO {ti} ({columns})
    SELECT {member_copies}
    FROM member_rows src
    CROSS JOIN generate_series(src.grow_from, src.len - 1) AS g(i)
    ON CONFLICT DO NOTHING
)
SELECT task_id, state, dag_run_id FROM changed
"""


_EVALUATE_SQL: dict[tuple[str, bool], str] = {}


def _evaluate_statement(*, from_tasks: bool) -> str:
    key = (connection.vendor, from_tasks)
    if key not in _EVALUATE_SQL:
        _EVALUATE_SQL[key] = _evaluate_sql(from_tasks=from_tasks)
    return _EVALUATE_SQL[key]


def evaluate_waiting_task_instances(
    *, dag_run_id: int, finished_task_ids: Sequence[str] | None, now: datetime
) -> list[tuple[str, str, int]]:
    """Decide the run's waiting TIs downstream of `finished_task_ids` (None: every waiting TI of
    the run) and write the decided ones: one statement, autocommit or in the caller's
    transaction; given finished tasks, also the waiting TIs of later runs whose past they may
    complete (issue 39, `_woken_sql`). Returns (task_id, new state, run id) of the TIs it
    changed, a mapped task's expanded
    TIs once (its map index 0's row); on SQLite `scheduled` is a mapped task's TI of map index
    -1 whose rule is met, left waiting for the caller to expand (`mapping.expand`)."""
    at = connection.ops.adapt_datetimefield_value(now)
    spread = [at] if connection.vendor == "postgresql" else []  # `grouped`'s updated_at
    with prepared_cursor() as cursor:
        if finished_task_ids is None:
            params = [dag_run_id, at, at, at, *spread]
            cursor.execute(_evaluate_statement(from_tasks=False), params)
        else:
            given = json.dumps(list(finished_task_ids))
            params = [given, dag_run_id, at, at, at, *spread]
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


def run_update_compiled_once(
    build: UpdateBuilder, *, pk: int, now: datetime, returning: str, also: str = ""
) -> list[tuple[Any, Any]]:
    """`queryset.update(**values)` of `build(pk, now)`, the statement compiled once per process
    on PostgreSQL (SQLite: the ORM's update as built); autocommit or in the caller's
    transaction. Returns, per row it updated, the column `returning` and the SQL expression
    `also` over the updated row (its table named in full; None when not given) (RETURNING: no
    statement more; on SQLite a read after an update that changed anything)."""
    table = build(_ANY_PK, _ANY_TIME)[0].model._meta.db_table
    extra = also or "NULL"
    column = connection.ops.quote_name(returning)
    if connection.vendor != "postgresql":
        queryset, values = build(pk, now)
        if not queryset.update(**values):
            return []
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {column}, {extra} FROM {table} WHERE id = %s", [pk])
            return [tuple(row) for row in cursor.fetchall()]
    text, template, pk_slots, time_slots = _compiled_update(build)
    text += f" RETURNING {column}, {extra}"
    params = list(template)
    for slot in pk_slots:
        params[slot] = pk
    for slot in time_slots:
        params[slot] = now
    with prepared_cursor() as cursor:
        cursor.execute(text, params)
        return [tuple(row) for row in cursor.fetchall()]


_PAUSE_SQL = f"""
UPDATE {Dag._meta.db_table} d SET is_paused = TRUE, updated_at = %s
WHERE d.dag_id = %s AND d.max_consecutive_failed_dag_runs > 0 AND NOT d.is_paused
  AND d.max_consecutive_failed_dag_runs <= (
    SELECT count(*) FROM (
        SELECT r.state FROM {DagRun._meta.db_table} r WHERE r.dag_id = d.dag_id
        ORDER BY r.run_after DESC, r.id DESC LIMIT d.max_consecutive_failed_dag_runs
    ) last_runs WHERE last_runs.state = {_q(DagRunState.FAILED)})
RETURNING d.max_consecutive_failed_dag_runs
"""


def pause_after_consecutive_failures(*, dag_id: str, now: datetime) -> int | None:
    """Pause `dag_id` if it has `max_consecutive_failed_dag_runs` (> 0) and its last that many
    runs by run_after (then id) all failed, as Airflow 3.3.2's
    `DagRun._check_last_n_dagruns_failed`: one conditional UPDATE (a Dag without the setting,
    or paused already, is not looked at further; the last runs are read through
    `dag_run_by_dag_run_after`). Returns the limit when it paused the Dag, else None.
    Autocommit or the caller's transaction."""
    if connection.vendor != "postgresql":
        limit = (
            Dag.objects.filter(dag_id=dag_id, is_paused=False)
            .values_list("max_consecutive_failed_dag_runs", flat=True)
            .first()
        )
        if not limit:
            return None
        last = list(
            DagRun.objects.filter(dag_id=dag_id)
            .order_by("-run_after", "-id")
            .values_list("state", flat=True)[:limit]
        )
        if len(last) < limit or any(state != DagRunState.FAILED for state in last):
            return None
        Dag.objects.filter(dag_id=dag_id).update(is_paused=True, updated_at=now)
        return limit
    at = connection.ops.adapt_datetimefield_value(now)
    with prepared_cursor() as cursor:
        cursor.execute(_PAUSE_SQL, [at, dag_id])
        row = cursor.fetchone()
    return None if row is None else int(row[0])
