"""Task dependencies: a run's waiting TIs against their upstream and trigger rules (DESIGN 3,
invariant 11).

A TI whose task has upstream tasks starts `scheduled` (waiting, not claimable); roots start
`queued` (`runs.initial_ti_states`). When a TI finishes, after its own commit and never under its
row lock, `after_ti_finished` evaluates its run's waiting TIs downstream of it in one statement
(`_EVALUATE`): per waiting TI the counts of its upstream TIs' states (success, skipped, failed,
upstream_failed, removed, done), Airflow's trigger rule on those counts (the facts of
`airflow/ti_deps/deps/trigger_rule_dep.py`, with `flag_upstream_failed` on, as the scheduler
runs it), and one conditional UPDATE: `queued` when the rule is met, `upstream_failed` or
`skipped` when it can no longer be met, else nothing. Only the direct downstream of the finished
task are looked at, through the upstream link table's index, so the statement does not grow
with the run's size.

No double queueing: the UPDATE keeps `state = 'scheduled'` in its WHERE, which PostgreSQL
re-checks on the row's latest version after waiting for a concurrent writer; of two evaluations
that both find a TI ready, the second matches nothing. No missed queueing: each evaluation is
one statement run after its finishing TI committed, so of two upstream finishing together the
later evaluation's snapshot sees both finished.

Propagation: the TIs a round marks upstream_failed / skipped are finished tasks too, so their own
downstream are evaluated in a next round (one statement per level of such a cascade; the common
finish is one round). A crash between a TI's commit and its evaluation (or between rounds)
leaves ready TIs waiting: `repair.sweep_waiting_runs` evaluates every waiting TI of the runs
that have any, and finishes runs a crash left with every TI finished.

The run's state once every TI is finished follows Airflow's `DagRun.update_state`: failed when a
leaf TI (a task nothing runs after; removed TIs aside) is failed or upstream_failed, else
success (`task_state.finish_run_if_done`).
"""

from collections.abc import Sequence
from dataclasses import dataclass

from django.db import connection
from django.utils import timezone

from . import prepared
from .models import DagRun, Task, TaskInstance, TaskUpstream, TIState, TriggerRule
from .models.runs import TI_FINISHED_STATES

# Upper bound on cascade rounds: a cascade is at most as deep as the longest path in the Dag;
# this only stops a runaway loop (the sweep finishes whatever is left).
MAX_ROUNDS = 10_000


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
        # The finished task ids come as one JSON array parameter: one statement text for any
        # number of them (PostgreSQL and SQLite both unnest it).
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


_SQL: dict[tuple[str, bool], str] = {}


def _sql(*, from_tasks: bool) -> str:
    key = (connection.vendor, from_tasks)
    if key not in _SQL:
        _SQL[key] = _evaluate_sql(from_tasks=from_tasks)
    return _SQL[key]


@dataclass(frozen=True)
class Evaluation:
    """What an evaluation changed: task ids queued, and marked upstream_failed / skipped."""

    queued: tuple[str, ...] = ()
    finished: tuple[tuple[str, str], ...] = ()
    rounds: int = 0


def evaluate_round(*, dag_run_id: int, finished_task_ids: Sequence[str] | None) -> list[tuple]:
    """One statement (autocommit, or inside the caller's transaction): decide the waiting TIs of
    the run downstream of `finished_task_ids` (None: every waiting TI of the run). Returns the
    (task_id, new state) of the TIs it changed."""
    import json

    now = connection.ops.adapt_datetimefield_value(timezone.now())
    with prepared.cursor() as cursor:
        if finished_task_ids is None:
            params = [dag_run_id, dag_run_id, now, now, now]
            cursor.execute(_sql(from_tasks=False), params)
        else:
            given = json.dumps(list(finished_task_ids))
            params = [given, dag_run_id, dag_run_id, dag_run_id, now, now, now]
            cursor.execute(_sql(from_tasks=True), params)
        return list(cursor.fetchall())


def evaluate(*, dag_run_id: int, finished_task_ids: Sequence[str] | None) -> Evaluation:
    """Evaluate the run's waiting TIs downstream of `finished_task_ids` (None: all of them) and
    propagate: one statement per round, one round per level of upstream_failed / skipped
    cascade. Each round is its own short transaction (autocommit); safe to run concurrently
    with any other evaluation of the run (see the module docstring)."""
    queued: list[str] = []
    finished: list[tuple[str, str]] = []
    rounds = 0
    frontier: Sequence[str] | None = finished_task_ids
    while rounds < MAX_ROUNDS:
        changed = evaluate_round(dag_run_id=dag_run_id, finished_task_ids=frontier)
        rounds += 1
        queued.extend(task_id for task_id, state in changed if state == TIState.QUEUED)
        done = [(task_id, state) for task_id, state in changed if state != TIState.QUEUED]
        finished.extend(done)
        if not done:
            break
        frontier = [task_id for task_id, _ in done]
    return Evaluation(queued=tuple(queued), finished=tuple(finished), rounds=rounds)
