"""The time scheduler (issue 24): creates the due runs of Dags with a timetable.

A pass claims the due Dags (`next_dagrun_create_after <= now`, unpaused, a timetable) in
batches, each batch in one durable transaction with a fixed number of statements whatever
its number of Dags and runs: lock the Dag rows (FOR NO KEY UPDATE SKIP LOCKED,
`locks.claim_due_timetable_dags`), count their active runs, read each one's last scheduled
run, the runs already holding the planned logical dates, the tasks; insert the runs and their
TIs (`runs.create_scheduled_runs`); store each Dag's next run (Airflow's `next_dagrun`,
`next_dagrun_data_interval_*`, `next_dagrun_create_after`).

Which runs: from the Dag's last scheduled run, `timetables.Timetable.next_run` at `now`, as
Airflow's scheduler asks its timetable, again and again while the next run is due and the Dag
is under `max_active_runs` (at most TIME_SCHEDULER_RUNS_PER_DAG in one pass). So with catchup
every missed logical date gets its run, in order; without catchup (and after an unpause) the
timetable itself skips to the latest due tick: at most one run. The stored next run only
decides which Dags a pass reads; the runs are always computed from the last run, so a stale
stored value (a pause, a scheduler down for a day) never creates a run Airflow would not.

Exactly once per (Dag, logical_date): the Dag lock serializes schedulers on a Dag, the runs
and the advanced next run commit together (a crash rolls both back), and the partial unique
constraint `dag_run_logical_date_unique` refuses a second run whatever happens. A logical
date already taken (a manual run given that date) is skipped, as Airflow's scheduler does.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from . import locks, runs, timetables
from .models import Dag, DagRun, DagRunState, DagRunTriggeredBy, DagRunType

logger = logging.getLogger(__name__)

ACTIVE_STATES = (DagRunState.QUEUED, DagRunState.RUNNING)


@dataclass(frozen=True)
class TimePassResult:
    dags_checked: int
    run_ids: tuple[tuple[str, str], ...]
    seconds: float


@dataclass
class _Batch:
    checked: list[str] = field(default_factory=list)
    created: list[tuple[str, str]] = field(default_factory=list)


def timetable_of(dag: Dag) -> timetables.Timetable | None:
    if dag.timetable is None:
        return None
    return timetables.Timetable.from_spec(dag.timetable, timezone=dag.timezone)


def restriction_of(dag: Dag) -> timetables.Restriction:
    return timetables.Restriction(earliest=dag.start_date, latest=dag.end_date, catchup=dag.catchup)


def run_info(run: DagRun | None) -> timetables.RunInfo | None:
    if run is None or run.data_interval_start is None:
        return None
    return timetables.RunInfo(
        run_after=run.run_after,
        data_interval_start=run.data_interval_start,
        data_interval_end=run.data_interval_end,
    )


def next_fields(
    timetable: timetables.Timetable | None,
    restriction: timetables.Restriction,
    *,
    last: timetables.RunInfo | None,
    now: datetime,
) -> dict[str, datetime | None]:
    """The Dag's `next_dagrun*` fields after `last` (all None without a next run)."""
    info = (
        timetable.next_run(last=last, restriction=restriction, now=now)
        if timetable is not None
        else None
    )
    return {
        "next_dagrun": info.logical_date if info else None,
        "next_dagrun_data_interval_start": info.data_interval_start if info else None,
        "next_dagrun_data_interval_end": info.data_interval_end if info else None,
        "next_dagrun_create_after": info.run_after if info else None,
    }


NEXT_FIELDS = (
    "next_dagrun",
    "next_dagrun_data_interval_start",
    "next_dagrun_data_interval_end",
    "next_dagrun_create_after",
)


def scheduled_run_id(run_after: datetime) -> str:
    """Airflow's run id of a scheduled run: `scheduled__` and the run's `run_after` (its
    timetable's `generate_run_id`), in UTC ISO 8601."""
    return f"{DagRunType.SCHEDULED}__{run_after.astimezone(timetables.UTC).isoformat()}"


def create_due_runs(*, now: datetime | None = None) -> TimePassResult:
    """One pass: every due Dag once, TIME_SCHEDULER_BATCH_SIZE per durable transaction. Safe to
    run concurrently with other schedulers (SKIP LOCKED: a Dag another holds is left to it)."""
    started = time.monotonic()
    now = now or timezone.now()
    limit = settings.TIME_SCHEDULER_BATCH_SIZE
    seen: list[str] = []
    created: list[tuple[str, str]] = []
    while True:
        batch = _create_batch(now=now, limit=limit, exclude=seen)
        seen += batch.checked
        created += batch.created
        if len(batch.checked) < limit:
            break
    return TimePassResult(
        dags_checked=len(seen), run_ids=tuple(created), seconds=time.monotonic() - started
    )


def _create_batch(*, now: datetime, limit: int, exclude: list[str]) -> _Batch:
    batch = _Batch()
    per_dag = settings.TIME_SCHEDULER_RUNS_PER_DAG
    with transaction.atomic(durable=True):
        dags = locks.claim_due_timetable_dags(now=now, limit=limit, exclude=exclude)
        if not dags:
            return batch
        ids = [dag.dag_id for dag in dags]
        batch.checked = ids
        # Counted after the locks, in a statement of its own: its snapshot includes the runs
        # another scheduler committed before releasing one of these Dags.
        active = dict(
            DagRun.objects.filter(dag_id__in=ids, state__in=ACTIVE_STATES)
            .order_by()
            .values("dag_id")
            .annotate(count=Count("*"))
            .values_list("dag_id", "count")
        )
        last_runs = {
            run.dag_id: run
            for run in DagRun.objects.filter(dag_id__in=ids, run_type=DagRunType.SCHEDULED)
            .order_by("dag_id", "-logical_date")
            .distinct("dag_id")
            .only("dag_id", "run_after", "data_interval_start", "data_interval_end")
        }
        planned: dict[str, list[timetables.RunInfo]] = {}
        for dag in dags:
            planned[dag.dag_id] = _plan(dag, last_runs.get(dag.dag_id), active, now, per_dag)
        dates = {info.logical_date for infos in planned.values() for info in infos}
        taken = set(
            DagRun.objects.filter(dag_id__in=ids, logical_date__in=list(dates)).values_list(
                "dag_id", "logical_date"
            )
        )
        tasks = runs.dag_tasks(ids)
        items = [
            (
                DagRun(
                    dag_id=dag_id,
                    run_id=scheduled_run_id(info.run_after),
                    run_type=DagRunType.SCHEDULED,
                    triggered_by=DagRunTriggeredBy.TIMETABLE,
                    state=DagRunState.QUEUED,
                    run_after=info.run_after,
                    logical_date=info.logical_date,
                    data_interval_start=info.data_interval_start,
                    data_interval_end=info.data_interval_end,
                    conf={},
                ),
                tasks[dag_id],
            )
            for dag_id, infos in planned.items()
            for info in infos
            if (dag_id, info.logical_date) not in taken
        ]
        runs.create_scheduled_runs(items=items)
        for dag in dags:
            infos = planned[dag.dag_id]
            last = infos[-1] if infos else run_info(last_runs.get(dag.dag_id))
            values = _next_or_none(dag, last, now)
            for name, value in values.items():
                setattr(dag, name, value)
        Dag.objects.bulk_update(dags, list(NEXT_FIELDS))
        batch.created = [(run.dag_id, run.run_id) for run, _ in items]
    return batch


def _plan(
    dag: Dag, last_run: DagRun | None, active: dict[str, int], now: datetime, per_dag: int
) -> list[timetables.RunInfo]:
    """The runs to create for `dag` now: each next run from the previous while it is due and
    the Dag under max_active_runs. A timetable that cannot compute is logged and plans none."""
    try:
        timetable = timetable_of(dag)
        if timetable is None:
            return []
        restriction = restriction_of(dag)
        last = run_info(last_run)
        free = min(dag.max_active_runs - active.get(dag.dag_id, 0), per_dag)
        planned: list[timetables.RunInfo] = []
        while len(planned) < free:
            info = timetable.next_run(last=last, restriction=restriction, now=now)
            if info is None or info.run_after > now or info.logical_date is None:
                break
            planned.append(info)
            last = info
        return planned
    except timetables.TimetableError:
        logger.exception("dag %s: its timetable cannot compute a next run", dag.dag_id)
        return []


def _next_or_none(
    dag: Dag, last: timetables.RunInfo | None, now: datetime
) -> dict[str, datetime | None]:
    try:
        return next_fields(timetable_of(dag), restriction_of(dag), last=last, now=now)
    except timetables.TimetableError:
        # Not read again until its definition changes (sync recomputes it).
        return dict.fromkeys(NEXT_FIELDS)
