"""The repair (invariant 11): what dead workers and crashes left behind.

Runs as the timers process's repair timer (every TASK_REPAIR_INTERVAL_SECONDS,
`assets_app/timers/`) and in `run_scheduler`. It composes
`task_state` (failing or retrying TIs whose heartbeat stopped, finishing runs) with
`dependencies` (evaluating waiting TIs), so that neither of those imports the other's caller.
"""

from dataclasses import dataclass
from typing import Any

from django.db.models import Exists, OuterRef
from django.utils import timezone

from ..models import DagRun, DagRunState, TaskInstance, TIState
from ..models.runs import TI_UNFINISHED_STATES
from ..operations import heartbeats
from ..scheduling import dependencies
from . import liveness


@dataclass(frozen=True)
class RepairResult:
    """What a repair sweep did: TIs of dead workers retried / failed, waiting TIs queued or
    finished (upstream_failed / skipped), runs finished."""

    tis_retried: int
    tis_failed: int
    tis_queued: int
    tis_finished: int
    runs_finished: int


def repair_task_instances() -> RepairResult:
    """The sweep behind task dependencies and heartbeats (invariant 11): running TIs whose
    heartbeat stopped for `TASK_HEARTBEAT_TIMEOUT_SECONDS` are failed or retried
    (`task_state.liveness.fail_dead_task_instances`), then runs a crash left with ready TIs
    waiting, or with every TI finished, are evaluated and finished (`sweep_waiting_runs`).
    Every write is conditional: safe to run concurrently with workers, finishes and other
    sweeps. Records the "repair" heartbeat."""
    ok = False
    detail: dict[str, Any] = {}
    try:
        dead = liveness.fail_dead_task_instances()
        waiting = sweep_waiting_runs()
        ok = True
        detail = {
            "tis_retried": len(dead.retried),
            "tis_failed": len(dead.failed),
            "tis_queued": waiting.tis_queued,
            "runs_finished": waiting.runs_finished,
        }
    finally:
        heartbeats.record(component="repair", ok=ok, detail=detail)
    return RepairResult(
        tis_retried=len(dead.retried),
        tis_failed=len(dead.failed),
        tis_queued=waiting.tis_queued,
        tis_finished=waiting.tis_finished,
        runs_finished=waiting.runs_finished,
    )


@dataclass(frozen=True)
class SweepResult:
    runs_evaluated: int
    tis_queued: int
    tis_finished: int
    runs_finished: int


def sweep_waiting_runs(*, limit: int = 1000) -> SweepResult:
    """The scheduler sweep's repair of what a crash left (invariant 11): every waiting TI of the
    active runs that have any is evaluated (`evaluate` with no frontier), and active runs whose
    TIs are all finished are finished. Up to `limit` runs of each kind, oldest first; safe to
    run concurrently with finishes and other sweeps (every write is conditional)."""
    active = (DagRunState.QUEUED, DagRunState.RUNNING)
    waiting_runs = list(
        TaskInstance.objects.filter(state=TIState.SCHEDULED, dag_run__state__in=active)
        .order_by("dag_run_id")
        .values_list("dag_run_id", flat=True)
        .distinct()[:limit]
    )
    queued = finished = 0
    for run_id in waiting_runs:
        result = dependencies.evaluate(dag_run_id=run_id, finished_task_ids=None)
        queued += len(result.queued)
        finished += len(result.finished)
    unfinished = TaskInstance.objects.filter(
        dag_run_id=OuterRef("pk"), state__in=TI_UNFINISHED_STATES
    )
    stranded = list(
        DagRun.objects.filter(state__in=active)
        .filter(~Exists(unfinished))
        .order_by("id")
        .values_list("id", "dag_id")[:limit]
    )
    runs_finished = 0
    for run_id, dag_id in stranded:
        runs_finished += dependencies.finish_run_if_done(run_id, dag_id=dag_id, now=timezone.now())
    return SweepResult(
        runs_evaluated=len(waiting_runs),
        tis_queued=queued,
        tis_finished=finished,
        runs_finished=runs_finished,
    )
