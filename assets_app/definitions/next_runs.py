"""A Dag's stored next run (issue 40): Airflow's `DagModel.calculate_dagrun_date_fields`.

The `next_dagrun*` fields of a Dag with a timetable name the run its time scheduler creates next:
`next_dagrun_create_after` the instant it becomes due (None: nothing is due ever again), the
others its logical date and data interval. As in Airflow 3.3.2 they are computed from a
reference run, at one instant, and then only read:

- the time scheduler (`scheduling.time_runs`) creates the stored run when it is due, whatever
  instant its pass lands on, and stores the next one computed from the run it created (Airflow's
  `_create_dag_runs`); a stored date another run holds already is not created again, the next
  one is computed from that run;
- a sync that creates a Dag or changes its time schedule, and an unpause, store the next run
  after the Dag's latest automated run (scheduled or backfill, Airflow's `_get_latest_runs_stmt`;
  a backfill's dates waiting for their run count, as Airflow creates them all at once) at that
  instant, as Airflow's Dag processor does each time it parses the Dag's file (it
  re-parses every file every 30 s, paused or not, so an unpaused Dag's next run is one computed
  at most that long before).

Without catchup the computation reads the clock (the latest tick due now, the events not past
yet), so the instant it is made at matters; after that the run is fixed: a pass landing late
still creates it, and the one after it follows from it, never from the pass's clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.utils import timezone

from ..models import BackfillDagRun, Dag, DagRun, DagRunType
from . import timetables

# Airflow's fields, as the API gives them.
AIRFLOW_FIELDS = (
    "next_dagrun",
    "next_dagrun_data_interval_start",
    "next_dagrun_data_interval_end",
    "next_dagrun_create_after",
)
# All the stored next run's fields: Airflow's and the instant they were computed at.
FIELDS = (*AIRFLOW_FIELDS, "next_dagrun_computed_at")
# Airflow's "automated" runs: the reference of a Dag's next run when its file is parsed.
AUTOMATED_RUN_TYPES = (DagRunType.SCHEDULED, DagRunType.BACKFILL)


def timetable_of(dag: Dag) -> timetables.Timetable | None:
    if dag.timetable is None:
        return None
    return timetables.Timetable.from_spec(dag.timetable, timezone=dag.timezone)


def restriction_of(dag: Dag) -> timetables.Restriction:
    return timetables.Restriction(earliest=dag.start_date, latest=dag.end_date, catchup=dag.catchup)


def fields_of(info: timetables.RunInfo | None, *, at: datetime) -> dict[str, datetime | None]:
    """The `next_dagrun*` fields naming `info` (Airflow's all None without a next run),
    computed at `at`."""
    return {
        "next_dagrun": info.logical_date if info else None,
        "next_dagrun_data_interval_start": info.data_interval_start if info else None,
        "next_dagrun_data_interval_end": info.data_interval_end if info else None,
        "next_dagrun_create_after": info.run_after if info else None,
        "next_dagrun_computed_at": at,
    }


def stored(dag: Dag) -> timetables.RunInfo | None:
    """The run `dag`'s fields name (None: no next run)."""
    if dag.next_dagrun_create_after is None or dag.next_dagrun is None:
        return None
    return timetables.RunInfo(
        run_after=dag.next_dagrun_create_after,
        data_interval_start=dag.next_dagrun_data_interval_start or dag.next_dagrun,
        data_interval_end=dag.next_dagrun_data_interval_end or dag.next_dagrun,
    )


def after(
    dag: Dag, *, last: timetables.RunInfo | None, now: datetime
) -> dict[str, datetime | None]:
    """The `next_dagrun*` fields of `dag` after the run `last` (None: its first run), computed
    at `now`. A timetable that cannot compute gives no next run (Airflow logs it and stores
    None; a sync of a changed schedule computes it again)."""
    try:
        timetable = timetable_of(dag)
        if timetable is None:
            return fields_of(None, at=now)
        return fields_of(
            timetable.next_run(last=last, restriction=restriction_of(dag), now=now), at=now
        )
    except timetables.TimetableError:
        return fields_of(None, at=now)


def latest_automated_runs(dag_ids: Iterable[str]) -> dict[str, timetables.RunInfo]:
    """Each Dag's scheduled or backfill run with the latest logical date, counting a backfill's
    dates still waiting for their run (Airflow creates a backfill's runs all at once); Dags
    without one are absent. One statement."""
    ids = list(dag_ids)
    runs = (
        DagRun.objects.filter(
            dag_id__in=ids,
            run_type__in=AUTOMATED_RUN_TYPES,
            logical_date__isnull=False,
            data_interval_start__isnull=False,
        )
        .order_by("dag_id", "-logical_date")
        .distinct("dag_id")
        .values_list(
            "dag_id", "logical_date", "run_after", "data_interval_start", "data_interval_end"
        )
    )
    waiting = (
        BackfillDagRun.objects.filter(
            backfill__dag_id__in=ids,
            started_at__isnull=True,
            exception_reason__isnull=True,
            dag_run__isnull=True,
        )
        .order_by("backfill__dag_id", "-logical_date")
        .distinct("backfill__dag_id")
        .values_list(
            "backfill__dag_id",
            "logical_date",
            "run_after",
            "data_interval_start",
            "data_interval_end",
        )
    )
    latest: dict[str, tuple] = {}
    for row in runs.union(waiting, all=True):
        if row[0] not in latest or row[1] > latest[row[0]][1]:
            latest[row[0]] = row
    return {
        dag_id: timetables.RunInfo(
            run_after=run_after, data_interval_start=start, data_interval_end=end
        )
        for dag_id, _, run_after, start, end in latest.values()
    }


def refresh(dags: Iterable[Dag], *, now: datetime | None = None) -> list[Dag]:
    """Set the `next_dagrun*` fields of `dags` from each one's latest automated run, at `now`
    (default: the clock); a Dag without a timetable gets none. Writes nothing (the caller saves
    them); one statement."""
    now = now or timezone.now()
    dags = list(dags)
    timed = [dag.dag_id for dag in dags if dag.timetable is not None]
    latest = latest_automated_runs(timed) if timed else {}
    for dag in dags:
        for name, value in after(dag, last=latest.get(dag.dag_id), now=now).items():
            setattr(dag, name, value)
    return dags


def store(dag_ids: Iterable[str], *, now: datetime | None = None) -> int:
    """Refresh and save the stored next run of the Dags `dag_ids` that have a timetable (an
    unpause): three statements whatever their number. In the caller's transaction; returns how
    many were written."""
    timed = refresh(Dag.objects.filter(dag_id__in=list(dag_ids), timetable__isnull=False), now=now)
    if timed:
        Dag.objects.bulk_update(timed, list(FIELDS))
    return len(timed)
