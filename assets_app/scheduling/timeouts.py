"""Run timeouts (issue 39): Airflow's `dagrun_timeout`, as its scheduler applies it
(`SchedulerJobRunner._schedule_dag_run`, Airflow 3.3.2): a running run whose start is more than
its Dag's `dagrun_timeout` ago is failed (its end date now) and its unfinished TIs are skipped,
"Run ... has timed-out"; a worker still running one of them is told at its next heartbeat, as
Airflow's execution API tells it (409 `not_running`: the Task SDK stops the task), and its
final state is refused the same way. Every run type is concerned, as there (the scheduler
examines every running run).

Due times, not a sweep: a run's `timeout_at` (its start plus the timeout) is written when it
starts running, in the statement that starts it, which wakes the timeout timer
(`sql/timeouts.mark_run_running`); the timer (`timers.service`) sleeps until the earliest
`timeout_at` of a running run (`next_due_at`, through the partial index `dag_run_timeout_due`)
and then ends the due runs in batches (`time_out_due_runs`). A sync that changes a Dag's timeout
wakes it too, and then the running runs' due times are recomputed (`retime`), since Airflow
reads the Dag's current timeout at each look.

A paused Dag's runs are left alone until it is unpaused (the unpause wakes the timer:
`catalog.dags.after_unpause`), as Airflow examines only the running runs of unpaused Dags
(`DagRun.get_running_dag_runs_to_examine`); a queued run never times out (it has no start),
as there.
"""

from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from ..cluster import nudges
from ..events_out import webhooks
from ..models import AssetDagRunQueue, DagRun, DagRunState, TaskInstance, TIState
from ..models.runs import TI_UNFINISHED_STATES
from ..operations import audit
from ..sql import callbacks as callbacks_sql
from ..sql import locks
from ..sql import timeouts as timeouts_sql

BATCH = 200

# Airflow's scheduler log line (`SchedulerJobRunner._schedule_dag_run`), the audit summary.
TIMED_OUT = "Run {run_id} of {dag_id} has timed-out"


@dataclass(frozen=True)
class TimedOut:
    """What a pass ended: the runs (id, dag_id, run_id) and how many TIs it skipped."""

    runs: tuple[tuple[int, str, str], ...] = ()
    skipped: int = 0


def time_out_due_runs(*, now: datetime | None = None, batch: int = BATCH) -> TimedOut:
    """End every running run whose `timeout_at` passed by `now`: failed with end date `now`,
    its unfinished TIs (waiting, queued, running, up for retry) skipped, its
    `dag_run.failed` webhook message written, its Dag's failure callback requested (when it
    has one: reason "timed_out", as Airflow's scheduler), and one audit entry per run naming
    it. One
    durable transaction per batch of `batch` runs, locked SKIP LOCKED (`locks.
    lock_timed_out_runs`): two timers never end one run twice, and a run a finish holds is
    left to the next pass (its finish may have ended it first; only a run still running is
    changed). Afterwards the scheduler is nudged for those Dags with queued events (a
    `max_active_runs` slot was freed; the webhook message's statement wakes the time
    scheduler for timetable Dags)."""
    now = now or timezone.now()
    ended: list[tuple[int, str, str]] = []
    skipped = 0
    while True:
        with transaction.atomic(durable=True):
            due = locks.lock_timed_out_runs(now=now, limit=batch)
            if not due:
                break
            ids = [run_pk for run_pk, _, _ in due]
            DagRun.objects.filter(id__in=ids, state=DagRunState.RUNNING).update(
                state=DagRunState.FAILED, end_date=now
            )
            # Airflow's failure callback of a timed-out run (reason "timed_out", the
            # unfinished TI that started last): before those TIs are skipped.
            callbacks_sql.write_requests(dag_run_ids=ids, now=now, timed_out=True)
            skipped += TaskInstance.objects.filter(
                dag_run_id__in=ids, state__in=TI_UNFINISHED_STATES
            ).update(state=TIState.SKIPPED, updated_at=now)
            for run_pk, dag_id, run_id in due:
                webhooks.write_run_finished(dag_run_id=run_pk, now=now)
                audit.record(
                    actor=None,
                    action="dag_run.timed_out",
                    summary=TIMED_OUT.format(run_id=run_id, dag_id=dag_id),
                    targets=[audit.Target(kind="dag_run", object_id=run_pk)],
                    dag_id=dag_id,
                    detail={"run_id": run_id, "reason": "timed_out"},
                )
            dag_ids = sorted({dag_id for _, dag_id, _ in due})
            waiting = set(
                AssetDagRunQueue.objects.filter(target_dag_id__in=dag_ids)
                .values_list("target_dag_id", flat=True)
                .distinct()
            )
            if waiting:
                nudges.scheduler_on_commit(dag_ids=sorted(waiting))
        ended += due
        if len(due) < batch:
            break
    return TimedOut(runs=tuple(ended), skipped=skipped)


def next_due_at() -> datetime | None:
    """The earliest `timeout_at` of a running run of an unpaused Dag (one index read), None
    when none has one."""
    return (
        DagRun.objects.filter(
            state=DagRunState.RUNNING, timeout_at__isnull=False, dag__is_paused=False
        )
        .order_by("timeout_at")
        .values_list("timeout_at", flat=True)
        .first()
    )


def retime() -> int:
    """Recompute the running runs' `timeout_at` from their Dags' current `dagrun_timeout`
    (`sql/timeouts.retime_running_runs`, one autocommit UPDATE). Returns how many changed."""
    return timeouts_sql.retime_running_runs()
