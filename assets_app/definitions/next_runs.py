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

Fixed until the Dag processor's next parse: a deployed Airflow parses every file again every
`[dag_processor] min_file_process_interval` (30 s) and each parse stores the next run again
(`DagModelOperation.update_dags` calls `calculate_dagrun_date_fields` from the latest automated
run, at the parse's clock, for every Dag of the file, paused or not, whatever its runs). So a
run that stays due longer than that (its Dag at max_active_runs, the scheduler down) is not
the one Airflow creates at last: without catchup it is the latest tick (or the first event not
past, or a delta from the parse's instant), with catchup the run after the latest automated
one (a backfill's included). `reparse` plays that parse, deterministically (a deployed
Airflow's parse instants depend on when its processor started): the last parse is taken to be
TIME_SCHEDULER_PARSE_INTERVAL_SECONDS before the instant looked at, the earliest it can have
been. A Dag whose stored next run was due before then, and computed before then
(`next_dagrun_computed_at`: a sync, an unpause or a pass later than that parse is the later
computation), gets the run that parse stores; a run due for less time than that has seen no
parse and stays as stored (a pass a few seconds late creates it). The time scheduler applies it
to the Dags it claims before deciding their runs, and stores it for a Dag at max_active_runs
too. An `asset_and_time` Dag (beyond Airflow) is left out: its ticks are its own, each looked
at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from ..models import BackfillDagRun, Dag, DagRun, DagRunType, ScheduleMode
from ..sql import scheduling as scheduling_sql
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


def latest_automated_runs(
    dag_ids: Iterable[str], *, as_of: datetime | None = None
) -> dict[str, timetables.RunInfo]:
    """Each Dag's scheduled or backfill run with the latest logical date, counting a backfill's
    dates still waiting for their run (Airflow creates a backfill's runs all at once); Dags
    without one are absent. One statement.

    `as_of`: as a parse at that past instant saw them: a backfill created after it does not
    count (its runs and its waiting dates alike), one created before counts whole, its runs
    made since included. (A scheduled run made since counts: the next run stored with it was
    computed later than `as_of`, from it.)"""
    ids = list(dag_ids)
    automated = Q(run_type__in=AUTOMATED_RUN_TYPES)
    if as_of is not None:
        automated = Q(run_type=DagRunType.SCHEDULED) | Q(
            run_type=DagRunType.BACKFILL, created_at__lte=as_of
        )
    runs = (
        DagRun.objects.filter(
            automated,
            dag_id__in=ids,
            logical_date__isnull=False,
            data_interval_start__isnull=False,
        )
        .order_by("dag_id", "-logical_date")
        .distinct("dag_id")
        .values_list(
            "dag_id", "logical_date", "run_after", "data_interval_start", "data_interval_end"
        )
    )
    waiting_dates = Q(started_at__isnull=True, dag_run__isnull=True)
    if as_of is not None:
        # Waiting then: a date whose run was made since.
        waiting_dates = (waiting_dates | Q(dag_run__created_at__gt=as_of)) & Q(
            backfill__created_at__lte=as_of
        )
    waiting = (
        BackfillDagRun.objects.filter(
            waiting_dates,
            backfill__dag_id__in=ids,
            exception_reason__isnull=True,
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
    scheduling_sql.update_next_runs(timed)
    return len(timed)


def parse_interval() -> timedelta:
    """Airflow's `[dag_processor] min_file_process_interval`: how long a stored next run stands
    before the Dag processor's parse stores it again."""
    return timedelta(seconds=settings.TIME_SCHEDULER_PARSE_INTERVAL_SECONDS)


def reparse(dags: Iterable[Dag], *, now: datetime) -> list[Dag]:
    """Airflow's Dag processor's last parse before `now`, taken to be `parse_interval()` before
    it: each of `dags` (with a timetable, not `asset_and_time`) whose stored next run was
    computed before that parse and due before it gets the one the parse stores (`after` its
    latest automated run as the parse saw it: a backfill created since does not count, at the
    parse's instant). Returns those whose Airflow fields changed (their `computed_at` that
    instant); writes nothing (the caller saves them); one statement when a Dag is due that
    long, none otherwise.

    A next run computed after that parse (a sync, an unpause, a pass) stands: it is the later
    computation. The runs a pass made since the parse need no hiding: a pass that makes runs
    stores the next run with them."""
    parsed_at = now - parse_interval()
    stale = [
        dag
        for dag in dags
        if dag.timetable is not None
        and dag.schedule_mode != ScheduleMode.ASSET_AND_TIME
        and dag.next_dagrun_create_after is not None
        and dag.next_dagrun_create_after < parsed_at
        and (dag.next_dagrun_computed_at is None or dag.next_dagrun_computed_at < parsed_at)
    ]
    if not stale:
        return []
    latest = latest_automated_runs((dag.dag_id for dag in stale), as_of=parsed_at)
    changed = []
    for dag in stale:
        values = after(dag, last=latest.get(dag.dag_id), now=parsed_at)
        if any(getattr(dag, name) != values[name] for name in AIRFLOW_FIELDS):
            for name, value in values.items():
                setattr(dag, name, value)
            changed.append(dag)
    return changed
