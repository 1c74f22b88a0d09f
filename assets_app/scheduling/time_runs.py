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

Assets and time (`Dag.schedule_mode`): an `asset_or_time` Dag (Airflow's AssetOrTimeSchedule)
gets its scheduled runs here and its asset-triggered runs from `scheduling`, as any asset Dag.
An `asset_and_time` Dag's events are consumed here only (the asset scheduler leaves the Dag
alone): in the same batch transaction, after the Dag locks, its ADRQ rows of events up to its
last due tick are locked (FOR UPDATE SKIP LOCKED, in the global order: step 4 after step 3,
`locks.lock_tick_queue_rows`); each due tick in order evaluates the condition on the events
up to that tick not consumed yet, and a met tick gets its scheduled run consuming exactly those
events (their rows deleted, invariant 8), while an unmet one creates nothing and its events
wait for the next tick. Either way the tick is done: the Dag's stored next run moves past it,
and the next pass starts there (a tick creates no run to start from), so an unmet tick is
never looked at twice. A tick waits while the Dag is at max_active_runs.

Exactly once per (Dag, logical_date): the Dag lock serializes schedulers on a Dag, the runs
and the advanced next run commit together (a crash rolls both back), and the partial unique
constraint `dag_run_logical_date_unique` refuses a second run whatever happens. A logical
date already taken (a manual run given that date) is skipped, as Airflow's scheduler does.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Min
from django.utils import timezone

from ..definitions import conditions, timetables
from ..models import (
    AssetAliasAsset,
    Dag,
    DagRun,
    DagRunState,
    DagRunTriggeredBy,
    DagRunType,
    ScheduleMode,
)
from ..sql import locks
from ..sql import scheduling as scheduling_sql
from . import runs

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


def next_due_at(*, after: datetime | None = None) -> datetime | None:
    """The earliest next run of an unpaused Dag with a timetable (`next_dagrun_create_after`),
    later than `after` when given: the time scheduler's next look after a pass at `after`
    (a Dag due by then and left without its run waits for a wake-up: a run of it finishing,
    its schedule or pause changing). None when there is none. One read of the
    `dag_next_run_due` index."""
    dags = Dag.objects.filter(
        is_paused=False, timetable__isnull=False, next_dagrun_create_after__isnull=False
    )
    if after is not None:
        dags = dags.filter(next_dagrun_create_after__gt=after)
    return dags.aggregate(first=Min("next_dagrun_create_after"))["first"]


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
        ticks: dict[str, list[timetables.RunInfo]] = {}
        for dag in dags:
            if _with_assets(dag):
                ticks[dag.dag_id] = _due_ticks(dag, last_runs.get(dag.dag_id), now, per_dag)
            else:
                planned[dag.dag_id] = _plan(dag, last_runs.get(dag.dag_id), active, now, per_dag)
        dates = {info.logical_date for infos in planned.values() for info in infos}
        dates |= {info.logical_date for infos in ticks.values() for info in infos}
        taken = set(
            DagRun.objects.filter(dag_id__in=ids, logical_date__in=list(dates)).values_list(
                "dag_id", "logical_date"
            )
        )
        tasks = runs.dag_tasks(ids)
        items = [
            (_scheduled_run(dag_id, info), tasks[dag_id])
            for dag_id, infos in planned.items()
            for info in infos
            if (dag_id, info.logical_date) not in taken
        ]
        consumed: list[Sequence[int]] = [() for _ in items]
        done: dict[str, timetables.RunInfo] = {}
        if ticks:
            tick_runs, done, rows_done = _consume_ticks(dags, ticks, active, taken)
            items += [(run, tasks[run.dag_id]) for run, _ in tick_runs]
            consumed += [event_ids for _, event_ids in tick_runs]
        runs.create_scheduled_runs(items=items, consumed_event_ids=consumed)
        if ticks:
            scheduling_sql.delete_queue_rows(rows_done)
        for dag in dags:
            last: timetables.RunInfo | None
            if dag.dag_id in done:
                last = done[dag.dag_id]
            elif ticks.get(dag.dag_id):
                continue  # due ticks wait (max_active_runs, a schedule that cannot evaluate)
            else:
                infos = planned.get(dag.dag_id, [])
                last = infos[-1] if infos else run_info(last_runs.get(dag.dag_id))
            values = _next_or_none(dag, last, now)
            for name, value in values.items():
                setattr(dag, name, value)
        Dag.objects.bulk_update(dags, list(NEXT_FIELDS))
        batch.created = [(run.dag_id, run.run_id) for run, _ in items]
    return batch


def _scheduled_run(dag_id: str, info: timetables.RunInfo) -> DagRun:
    return DagRun(
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
    )


def _with_assets(dag: Dag) -> bool:
    """An asset-and-time Dag: its ticks consume its queued events."""
    return dag.schedule is not None and dag.schedule_mode == ScheduleMode.ASSET_AND_TIME


def _stored_next(dag: Dag) -> timetables.RunInfo | None:
    if dag.next_dagrun_create_after is None or dag.next_dagrun_data_interval_start is None:
        return None
    return timetables.RunInfo(
        run_after=dag.next_dagrun_create_after,
        data_interval_start=dag.next_dagrun_data_interval_start,
        data_interval_end=dag.next_dagrun_data_interval_end,
    )


def _due_ticks(
    dag: Dag, last_run: DagRun | None, now: datetime, limit: int
) -> list[timetables.RunInfo]:
    """The due ticks of an asset-and-time Dag, in order, at most `limit`: from its next run
    after its last scheduled run, or from its stored next run when that is later (ticks
    without a run were done since). A timetable that cannot compute is logged: none."""
    try:
        timetable = timetable_of(dag)
        if timetable is None:
            return []
        restriction = restriction_of(dag)
        info = timetable.next_run(last=run_info(last_run), restriction=restriction, now=now)
        stored = _stored_next(dag)
        if info is not None and stored is not None and stored.run_after > info.run_after:
            info = stored
        due: list[timetables.RunInfo] = []
        while info is not None and info.logical_date is not None and info.run_after <= now:
            due.append(info)
            if len(due) >= limit:
                break
            info = timetable.next_run(last=info, restriction=restriction, now=now)
        return due
    except timetables.TimetableError:
        logger.exception("dag %s: its timetable cannot compute a next run", dag.dag_id)
        return []


def _consume_ticks(
    dags: Sequence[Dag],
    ticks: dict[str, list[timetables.RunInfo]],
    active: dict[str, int],
    taken: set[tuple[str, datetime | None]],
) -> tuple[list[tuple[DagRun, list[int]]], dict[str, timetables.RunInfo], list[int]]:
    """The asset-and-time ticks of a batch, inside its transaction (the Dag rows locked): lock
    the Dags' ADRQ rows up to their last due tick (step 4), then per Dag and tick in order,
    the events up to the tick not consumed yet; a met condition (and a free run slot, and a
    logical date not taken) gives the tick its run consuming exactly them. Returns the runs
    with their event ids, each Dag's last tick done, and the ADRQ row ids consumed. A Dag whose
    condition cannot be evaluated is logged and left as it was (its ticks and events wait)."""
    rows = locks.lock_tick_queue_rows(
        {dag_id: due[-1].run_after for dag_id, due in ticks.items() if due}
    )
    by_dag: dict[str, list[locks.TickQueueRow]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: (r.timestamp, r.event_id)):
        by_dag[row.dag_id].append(row)
    parsed: dict[str, conditions.Condition] = {}
    failed: dict[str, str] = {}
    for dag in dags:
        if ticks.get(dag.dag_id):
            try:
                parsed[dag.dag_id] = conditions.parse(dag.schedule)
            except conditions.ConditionError as exc:
                logger.exception("dag %s: its schedule cannot be evaluated", dag.dag_id)
                failed[dag.dag_id] = f"schedule cannot be evaluated: {exc.path}: {exc.message}"
    if failed:
        # Shown as the asset scheduler's are (invariant 13): the Dag's ticks and events wait.
        for dag_id, error in failed.items():
            Dag.objects.filter(dag_id=dag_id).exclude(schedule_error=error).update(
                schedule_error=error[:2000], schedule_error_at=timezone.now()
            )
    cleared = [dag.dag_id for dag in dags if dag.dag_id in parsed and dag.schedule_error]
    if cleared:
        Dag.objects.filter(dag_id__in=cleared).update(schedule_error="", schedule_error_at=None)
    alias_assets = _alias_assets(parsed.values())
    created: list[tuple[DagRun, list[int]]] = []
    done: dict[str, timetables.RunInfo] = {}
    row_ids: list[int] = []
    for dag in dags:
        condition = parsed.get(dag.dag_id)
        if condition is None:
            continue
        free = dag.max_active_runs - active.get(dag.dag_id, 0)
        queued, position = by_dag[dag.dag_id], 0
        for tick in ticks[dag.dag_id]:
            if free <= 0:
                break  # this tick waits for a run slot
            while position < len(queued) and queued[position].timestamp <= tick.run_after:
                position += 1
            pending = queued[:position]
            met = bool(pending) and conditions.evaluate(
                condition, present={row.asset_name for row in pending}, alias_assets=alias_assets
            )
            if met and (dag.dag_id, tick.logical_date) not in taken:
                created.append(
                    (_scheduled_run(dag.dag_id, tick), [row.event_id for row in pending])
                )
                row_ids += [row.row_id for row in pending]
                queued, position = queued[position:], 0
                free -= 1
            done[dag.dag_id] = tick
    return created, done, row_ids


def _alias_assets(parsed: Iterable[conditions.Condition]) -> dict[str, set[str]]:
    """The assets each alias the conditions name resolves to: one query, none without aliases."""
    names = sorted({name for c in parsed for name in conditions.referenced_aliases(c)})
    resolved: dict[str, set[str]] = defaultdict(set)
    if names:
        for alias_name, asset_name in AssetAliasAsset.objects.filter(
            alias__name__in=names
        ).values_list("alias__name", "asset__name"):
            resolved[alias_name].add(asset_name)
    return resolved


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
