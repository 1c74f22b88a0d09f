"""What follows a TI's finish: its run's waiting TIs against their upstream and trigger rules
(DESIGN 3, invariant 11), then the run's own finish.

The whole path is here and in its statements' module, `sql/dependencies.py` (the trigger-rule
table is its `_decision_sql`, beside the evaluation statement): `after_ti_finished` (a TI) and
`follow_finishes` (several, the skip path) -> `evaluate` (one statement per round) ->
`finish_run_if_done` (one conditional UPDATE, compiled once from `_finish_run_update`).

A TI whose task has upstream tasks starts `scheduled` (waiting, not claimable); roots start
`queued` (`runs.initial_ti_states`). When a TI finishes, after its own commit and never under its
row lock, `after_ti_finished` evaluates its run's waiting TIs downstream of it in one statement
(`dependencies_sql.evaluate_waiting_task_instances`): per waiting TI the counts of its upstream
TIs' states (success, skipped, failed, upstream_failed, removed, done), Airflow's trigger rule
on those counts (the facts of `airflow/ti_deps/deps/trigger_rule_dep.py`, with
`flag_upstream_failed` on, as the scheduler runs it), and one conditional UPDATE: `queued` when
the rule is met, `upstream_failed` or `skipped` when it can no longer be met, else nothing. Only
the direct downstream of the finished task are looked at, through the upstream link table's
index, so the statement does not grow with the run's size.

No double queueing: the UPDATE keeps `state = 'scheduled'` in its WHERE, which PostgreSQL
re-checks on the row's latest version after waiting for a concurrent writer; of two evaluations
that both find a TI ready, the second matches nothing. No missed queueing: each evaluation is
one statement run after its finishing TI committed, so of two upstream finishing together the
later evaluation's snapshot sees both finished.

Mapped tasks (issue 25, `mapping`): the same statement expands a mapped task's map-index -1
TI whose rule is met (its map indexes queued, or it is skipped / upstream_failed), and a
downstream of a mapped task counts every map index of it among its upstream TIs, so it waits
for all of them and its rule applies over all of them. Inside a mapped task group map index i
counts map index i of its upstream in the group only, and the statement that expands a group's
roots expands its other tasks too, waiting (`sql/dependencies._write_sql`).

Propagation: the TIs a round marks upstream_failed / skipped are finished tasks too, so their own
downstream are evaluated in a next round (one statement per level of such a cascade; the common
finish is one round). A crash between a TI's commit and its evaluation (or between rounds)
leaves ready TIs waiting: `repair.sweep_waiting_runs` evaluates every waiting TI of the runs
that have any, and finishes runs a crash left with every TI finished.

The run's state once every TI is finished follows Airflow's `DagRun.update_state`: failed when a
leaf TI (a task nothing runs after; removed TIs aside) is failed or upstream_failed, else
success (`finish_run_if_done`). With setup and teardown tasks (issue 39) a leaf is Airflow's
effective leaf: a teardown without `on_failure_fail_dagrun` does not count and does not keep
the task before it from counting (`Task.run_state_leaf`, derived at sync).
"""

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Case, Exists, OuterRef, QuerySet, Value, When
from django.utils import timezone

from ..cluster import nudges
from ..events_out import webhooks
from ..models import (
    AssetDagRunQueue,
    AuditVia,
    DagRun,
    DagRunState,
    Task,
    TaskInstance,
    TIState,
)
from ..models.runs import TI_UNFINISHED_STATES
from ..operations import audit
from ..sql import callbacks as callbacks_sql
from ..sql import dependencies as dependencies_sql
from . import mapping

logger = logging.getLogger(__name__)

# Upper bound on cascade rounds: a cascade is at most as deep as the longest path in the Dag;
# this only stops a runaway loop (the sweep finishes whatever is left).
MAX_ROUNDS = 10_000

_RUN_FAILING_STATES = (TIState.FAILED, TIState.UPSTREAM_FAILED)


@dataclass(frozen=True)
class Evaluation:
    """What an evaluation changed: task ids queued, and marked upstream_failed / skipped."""

    queued: tuple[str, ...] = ()
    finished: tuple[tuple[str, str], ...] = ()
    rounds: int = 0


def evaluate_round(*, dag_run_id: int, finished_task_ids: Sequence[str] | None) -> list[tuple]:
    """One statement (autocommit, or inside the caller's transaction): decide the waiting TIs of
    the run downstream of `finished_task_ids` (None: every waiting TI of the run). Returns the
    (task_id, new state) of the TIs it changed
    (`dependencies_sql.evaluate_waiting_task_instances`). The same statement expands a mapped
    task's map-index -1 TI whose rule is met (issue 25): its map indexes queued, or it is
    skipped / upstream_failed (`mapping`). Given finished tasks, it also queues the TIs of the
    Dag's later runs that waited only for them as their past (issue 39: depends_on_past,
    wait_for_downstream; not returned). On SQLite, which cannot write in a WITH, that TI is
    left waiting and expanded by `mapping.expand` in a transaction of its own."""
    now = timezone.now()
    rows = dependencies_sql.evaluate_waiting_task_instances(
        dag_run_id=dag_run_id, finished_task_ids=finished_task_ids, now=now
    )
    changed = [(task_id, state) for task_id, state, run_pk in rows if run_pk == dag_run_id]
    # TIs of later runs this round woke (issue 39: their past is done) are queued, except a
    # mapped one expanding to skipped / upstream_failed: that run's downstream follow it (a
    # query for the run's Dag and that run's own evaluation, only then).
    woken_done: dict[int, list[str]] = {}
    for task_id, state, run_pk in rows:
        if run_pk != dag_run_id and state not in (TIState.QUEUED, TIState.SCHEDULED):
            woken_done.setdefault(run_pk, []).append(task_id)
    for run_pk, task_ids in sorted(woken_done.items()):
        dag_id = DagRun.objects.filter(pk=run_pk).values_list("dag_id", flat=True).first()
        if dag_id is not None:
            follow_finishes(dag_run_id=run_pk, dag_id=dag_id, finished_task_ids=task_ids)
    ready = sorted({task_id for task_id, state in changed if state == TIState.SCHEDULED})
    if ready:
        with transaction.atomic():
            expanded = mapping.expand(dag_run_id=dag_run_id, task_ids=ready, now=now)
        changed = [*(row for row in changed if row[1] != TIState.SCHEDULED), *expanded]
    return changed


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


# --- the run follows its TIs (after the TI commit, no locks) ----------------------------------


def _finish_run_update(dag_run_id: int, now: datetime) -> tuple[QuerySet[DagRun], dict[str, Any]]:
    """The conditional UPDATE of `finish_run_if_done`: the runs it matches and the values it
    sets (`runs.update(**values)`), built (not run) through the ORM."""
    tis = TaskInstance.objects.filter(dag_run_id=OuterRef("pk"))
    # Issue 39: the sync's `Task.run_state_leaf` (Airflow's `_tis_for_dagrun_state`: nothing
    # but ignorable teardowns after it, and not one itself). A TI whose task is no longer in
    # the Dag counts, as before.
    not_leaf = Task.objects.filter(
        dag_id=OuterRef("dag_id"), task_id=OuterRef("task_id"), run_state_leaf=False
    )
    failing_leaf = tis.filter(state__in=_RUN_FAILING_STATES).filter(~Exists(not_leaf))
    runs = DagRun.objects.filter(
        id=dag_run_id, state__in=(DagRunState.QUEUED, DagRunState.RUNNING)
    ).filter(~Exists(tis.filter(state__in=TI_UNFINISHED_STATES)))
    values = {
        "state": Case(
            When(Exists(failing_leaf), then=Value(DagRunState.FAILED)),
            default=Value(DagRunState.SUCCESS),
        ),
        "end_date": now,
    }
    return runs, values


def _execute_finish_run_update(dag_run_id: int, *, now: datetime) -> tuple[str | None, bool]:
    """Run `_finish_run_update`, compiled once per process
    (`dependencies_sql.run_update_compiled_once`: building its two `Exists` and the `Case` cost
    ~3.5 ms of CPU on every finish). Returns the state it gave the run (None: not finished)
    and whether its Dag has the callback of that state (`callbacks_sql.WANTED`, read by the
    same statement)."""
    rows = dependencies_sql.run_update_compiled_once(
        _finish_run_update,
        pk=dag_run_id,
        now=now,
        returning="state",
        also=callbacks_sql.WANTED,
    )
    if not rows:
        return None, False
    state, wanted = rows[0]
    return state, bool(wanted)


def finish_run_if_done(dag_run_id: int, *, dag_id: str, now: datetime) -> bool:
    """One conditional UPDATE: success/failed once no TI of the run is unfinished. Failed when a
    leaf TI (its task has no downstream task; Airflow's `DagRun.update_state` looks at leaves)
    is failed or upstream_failed, else success. Returns whether it finished the run.

    A run that finishes frees a `max_active_runs` slot, so if its Dag has queued events waiting
    the scheduler is nudged (after commit) instead of leaving them to the one-minute sweep.

    A run that finishes failed may pause its Dag (issue 39, Airflow 3.3.2's
    `max_consecutive_failed_dag_runs`, checked where its `DagRun.update_state` fails a run for
    a task failure): when the Dag's last that many runs by run_after all failed, it is paused
    and audited with Airflow's log line (`_pause_after_consecutive_failures`): one
    conditional UPDATE more, only for a run that failed; two audit INSERTs when it pauses.

    A Dag with `on_success_callback` / `on_failure_callback` (issue 39) gets one callback
    request per finish, committed with the run's state (outbox style: `bin/airflow-worker`
    claims and runs it later, never under any lock here); a replay finishes nothing and so
    writes nothing, and the request's unique key refuses a second one for the same finish.
    """
    # The run's `dag_run.succeeded` / `dag_run.failed` webhook messages commit with its state
    # (issue 29): one statement more, only for a run that finished; and its Dag callback
    # request (issue 39, `sql.callbacks`), one more only for a Dag with the callback of that
    # state (the finish's RETURNING says). No savepoint inside a caller's transaction: they
    # are the caller's then.
    with transaction.atomic(savepoint=False):
        finished, callback_wanted = _execute_finish_run_update(dag_run_id, now=now)
        if finished:
            webhooks.write_run_finished(dag_run_id=dag_run_id, now=now)
        if callback_wanted:
            callbacks_sql.write_requests(dag_run_ids=[dag_run_id], now=now)
        if finished == DagRunState.FAILED:
            _pause_after_consecutive_failures(dag_id=dag_id, now=now)
    if finished and AssetDagRunQueue.objects.filter(target_dag_id=dag_id).exists():
        nudges.scheduler_on_commit(dag_ids=[dag_id])
    return bool(finished)


# Airflow's log line (`DagRun._check_last_n_dagruns_failed`), the audit entry's summary.
PAUSED_AFTER_FAILURES = "Pausing DAG {dag_id} because last {limit} DAG runs failed."
# Airflow writes its `Log` row as owner "scheduler".
SCHEDULER = audit.Actor(name="scheduler", via=AuditVia.SYSTEM)


def _pause_after_consecutive_failures(*, dag_id: str, now: datetime) -> None:
    """Inside `finish_run_if_done`'s transaction: pause the Dag after its
    `max_consecutive_failed_dag_runs` failed runs (`dependencies_sql.
    pause_after_consecutive_failures`), audited as a `dag.pause` when it did."""
    limit = dependencies_sql.pause_after_consecutive_failures(dag_id=dag_id, now=now)
    if limit is not None:
        audit.record(
            actor=SCHEDULER,
            action="dag.pause",
            summary=PAUSED_AFTER_FAILURES.format(dag_id=dag_id, limit=limit),
            targets=[audit.Target(kind="dag", object_id=dag_id)],
            dag_id=dag_id,
            detail={"is_paused": True, "max_consecutive_failed_dag_runs": limit},
        )


def after_ti_finished(ti: TaskInstance) -> None:
    """What follows a TI's finish (success, failed, skipped, upstream_failed), after its commit
    and without its lock: a failed one of a `fail_fast` Dag stops the rest of its run
    (`stop_remaining`), then `follow_finishes` of its task and the stopped ones (whose later
    runs' depends_on_past TIs may wait for them)."""
    stopped = stop_remaining(ti) if ti.state == TIState.FAILED else []
    follow_finishes(
        dag_run_id=ti.dag_run_id, dag_id=ti.dag_id, finished_task_ids=[ti.task_id, *stopped]
    )


# Airflow's `_stop_remaining_tasks` leaves these alone (and the failed task's own map indexes).
_NOT_STOPPED = (TIState.SUCCESS, TIState.FAILED, TIState.SKIPPED)


def stop_remaining(ti: TaskInstance) -> list[str]:
    """Airflow's fail_fast (`_stop_remaining_tasks`, which its execution API runs when a TI of a
    `fail_fast` Dag fails for good): every other TI of the run that is not success or failed,
    the failed task's own map indexes aside, is failed when running (its worker learns it at
    its next heartbeat, as from Airflow) and skipped otherwise (upstream_failed and removed
    ones too, as Airflow does). Returns the task ids of those it changed.

    One SELECT on every failure (nothing for a Dag without fail_fast); then one single-row
    conditional UPDATE per TI, each its own autocommit statement: like a worker's, each holds
    one TI row lock for one statement, so it never waits while holding another (lock order
    step 1) and a TI that moved on meanwhile (started, finished) is judged on its latest state.
    A TI a concurrent expansion inserts after the SELECT is not stopped."""
    candidates = list(
        TaskInstance.objects.filter(dag_run_id=ti.dag_run_id, dag_run__dag__fail_fast=True)
        .exclude(task_id=ti.task_id)
        .exclude(state__in=_NOT_STOPPED)
        .order_by("id")
        .values_list("id", "task_id")
    )
    now = timezone.now()
    stopped: list[str] = []
    for ti_id, task_id in candidates:
        changed = (
            TaskInstance.objects.filter(id=ti_id)
            .exclude(state__in=_NOT_STOPPED)
            .update(
                state=Case(
                    When(state=TIState.RUNNING, then=Value(TIState.FAILED)),
                    default=Value(TIState.SKIPPED),
                ),
                end_date=now,
                updated_at=now,
            )
        )
        if changed:
            stopped.append(task_id)
    if stopped:
        logger.info(
            "fail_fast: task %s of run %s failed; %d other task instances stopped",
            ti.task_id,
            ti.dag_run_id,
            len(stopped),
        )
    return sorted(set(stopped))


def follow_finishes(*, dag_run_id: int, dag_id: str, finished_task_ids: Sequence[str]) -> None:
    """After the commit of finished TIs of one run: its downstream TIs are evaluated
    (`evaluate`, one statement per round), then the run may finish (`finish_run_if_done`). When
    the evaluation queued a TI the run cannot be finished, so that statement is not run."""
    evaluation = evaluate(dag_run_id=dag_run_id, finished_task_ids=finished_task_ids)
    if not evaluation.queued:
        finish_run_if_done(dag_run_id, dag_id=dag_id, now=timezone.now())
