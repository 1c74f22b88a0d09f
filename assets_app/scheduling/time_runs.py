"""The time scheduler (issue 24): creates the due runs of Dags with a timetable.

A pass claims the due Dags (`next_dagrun_create_after <= now`, unpaused, a timetable) in
batches, each batch in one durable transaction with a fixed number of statements whatever
its number of Dags and runs: lock the Dag rows (FOR NO KEY UPDATE SKIP LOCKED,
`locks.claim_due_timetable_dags`), read their latest automated runs when one's stored run has
been due longer than the Dag processor's parse interval (below), count their active runs, read
the runs (and a backfill's dates waiting for their run) holding the planned logical dates, the
tasks; insert the runs and their TIs (`runs.create_scheduled_runs`); store each Dag's next run
(Airflow's `next_dagrun`, `next_dagrun_data_interval_*`, `next_dagrun_create_after`).

Which runs (issue 40: Airflow 3.3.2's `_create_dag_runs`): the run the Dag stored
(`definitions.next_runs`: at its previous run, at a sync of its schedule, at an unpause),
whatever instant the pass lands on, unless Airflow's Dag processor has parsed the Dag since: a
stored run due for longer than TIME_SCHEDULER_PARSE_INTERVAL_SECONDS (30, Airflow's
`min_file_process_interval`) is first replaced by the one that parse stored
(`next_runs.reparse`: the parse taken at that interval before the pass; with catchup the run
after the latest automated one, without it the latest tick, the first event not past, the delta
from the parse), stored even while the Dag is at max_active_runs; then the next one computed
from that run (its timetable's `next_run` with the pass's `now`, which only a timetable without
catchup reads: the latest tick due now, the events not past yet), again while it is due and the
Dag is under `max_active_runs` (at most TIME_SCHEDULER_RUNS_PER_DAG in one pass; Airflow makes
one per scheduler loop, the same runs in the end). Backfill runs do not count against
`max_active_runs` (Airflow's `exclude_backfill`: "their concurrency is separate"). A Dag at its
limit creates nothing, its stored next run waits (as the parses store it). So a pass one second
late still creates the 06:00 run of a 6-hour delta and stores 12:00 after it, an events
timetable without catchup gets a run for each event the scheduler is in time for, with catchup
every missed logical date gets its run, in order, and a Dag without catchup freed after hours at
its limit gets the latest tick. A stored date another run holds already (a manual run given that
date, a backfill's, or a date a backfill plans and has not made its run for yet: Airflow creates
a backfill's runs all at once) gets no run: the next one is computed from that run, as Airflow's
scheduler does.

Assets and time (`Dag.schedule_mode`): an `asset_or_time` Dag (Airflow's AssetOrTimeSchedule)
gets its scheduled runs here and its asset-triggered runs from `scheduling`, as any asset Dag.
An `asset_and_time` Dag's events are consumed here only (the asset scheduler leaves the Dag
alone): its due ticks are its stored next run and those after it while due; in the same batch
transaction, after the Dag locks, its ADRQ rows of events up to its last due tick are locked
(FOR UPDATE SKIP LOCKED, in the global order: step 4 after step 3,
`locks.lock_tick_queue_rows`); each due tick in order evaluates the condition on the events
up to that tick not consumed yet, and a met tick gets its scheduled run consuming exactly those
events (their rows deleted, invariant 8), while an unmet one creates nothing and its events
wait for the next tick. Either way the tick is done: the Dag's stored next run moves past it,
and the next pass starts there (a tick creates no run to start from), so an unmet tick is
never looked at twice. A tick waits while the Dag is at max_active_runs.

Exactly once per (Dag, logical_date): the Dag lock serializes schedulers on a Dag, the runs
and the advanced next run commit together (a crash rolls both back), and the partial unique
constraint `dag_run_logical_date_unique` refuses a second run whatever happens.
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

from ..definitions import conditions, next_runs, timetables
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


timetable_of = next_runs.timetable_of
restriction_of = next_runs.restriction_of
NEXT_FIELDS = next_runs.FIELDS


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
    return next_runs.fields_of(info, at=now)


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
        # Airflow's Dag processor has parsed these Dags since: a next run due since before
        # then is the one that parse stored (`next_runs.reparse`; none of them at most times).
        reparsed = {dag.dag_id for dag in next_runs.reparse(dags, now=now)}
        # Counted after the locks, in a statement of its own: its snapshot includes the runs
        # another scheduler committed before releasing one of these Dags. Backfill runs apart
        # (Airflow's `exclude_backfill=True`: "their concurrency is separate").
        active = dict(
            DagRun.objects.filter(dag_id__in=ids, state__in=ACTIVE_STATES)
            .exclude(run_type=DagRunType.BACKFILL)
            .order_by()
            .values("dag_id")
            .annotate(count=Count("*"))
            .values_list("dag_id", "count")
        )
        # Each Dag's runs from its stored next run on, as if no date were held; then the runs
        # holding dates in that span (one query), and the Dags that meet one planned again.
        plans: dict[str, _Plan] = {}
        for dag in dags:
            free = min(dag.max_active_runs - active.get(dag.dag_id, 0), per_dag)
            if _with_assets(dag):
                plans[dag.dag_id] = _walk(dag, now=now, limit=per_dag, ticks=True)
            elif free > 0:
                plans[dag.dag_id] = _walk(dag, now=now, limit=free)
        held = _held(plans)
        holding = {dag_id for dag_id, _ in held}
        for dag in dags:
            plan = plans.get(dag.dag_id)
            if plan is not None and not plan.ticks and dag.dag_id in holding:
                plans[dag.dag_id] = _walk(
                    dag,
                    now=now,
                    limit=len(plan.infos),
                    held=held,
                    until=plan.infos[-1].logical_date,
                )
        tasks = runs.dag_tasks(ids)
        items = [
            (_scheduled_run(dag_id, info), tasks[dag_id])
            for dag_id, plan in plans.items()
            if not plan.ticks
            for info in plan.infos
        ]
        consumed: list[Sequence[int]] = [() for _ in items]
        ticks = {dag_id: plan.infos for dag_id, plan in plans.items() if plan.ticks}
        done: dict[str, timetables.RunInfo] = {}
        if any(ticks.values()):
            tick_runs, done, rows_done = _consume_ticks(dags, ticks, active, set(held))
            items += [(run, tasks[run.dag_id]) for run, _ in tick_runs]
            consumed += [event_ids for _, event_ids in tick_runs]
        runs.create_scheduled_runs(items=items, consumed_event_ids=consumed)
        if any(ticks.values()):
            scheduling_sql.delete_queue_rows(rows_done)
        moved: list[Dag] = []
        for dag in dags:
            plan = plans.get(dag.dag_id)
            if plan is None:
                if dag.dag_id in reparsed:
                    moved.append(dag)  # at max_active_runs: the next run a parse stored
                continue  # at max_active_runs: its stored next run waits
            if plan.ticks and not (plan.failed and not plan.infos):
                if dag.dag_id not in done:
                    continue  # due ticks wait (max_active_runs, a schedule that cannot evaluate)
                values = next_runs.after(dag, last=done[dag.dag_id], now=now)
            else:
                if not plan.infos and not plan.failed and plan.following == next_runs.stored(dag):
                    # Not due after all (its stored run as a parse stored it): it stands.
                    if dag.dag_id in reparsed:
                        moved.append(dag)
                    continue
                values = next_runs.fields_of(plan.following, at=now)
            for name, value in values.items():
                setattr(dag, name, value)
            moved.append(dag)
        scheduling_sql.update_next_runs(moved)
        batch.created = [(run.dag_id, run.run_id) for run, _ in items]
    return batch


# The runs holding a Dag's logical dates, by (dag_id, logical date), as the run to compute from.
Held = dict[tuple[str, datetime | None], timetables.RunInfo]


@dataclass(frozen=True)
class _Plan:
    """A Dag's runs to create in a pass (its due ticks, for an asset-and-time Dag), in order, and
    the next run to store after them (None: none, the schedule ended or cannot compute)."""

    infos: list[timetables.RunInfo]
    following: timetables.RunInfo | None
    ticks: bool = False
    failed: bool = False  # the timetable cannot compute: no next run is stored


def _walk(
    dag: Dag,
    *,
    now: datetime,
    limit: int,
    ticks: bool = False,
    held: Held | None = None,
    until: datetime | None = None,
) -> _Plan:
    """From the Dag's stored next run, each run while it is due, at most `limit`, each next one
    computed from the previous at `now` (Airflow's `_create_dag_runs` and
    `calculate_dagrun_date_fields`, loop after loop). A date `held` by a run is not planned: the
    next one is computed from that run; with `held`, the walk stops past `until` (the dates
    after it were not looked up). A timetable that cannot compute is logged and gives no next
    run, as in Airflow (the runs before it stand; the Dag is not read again until a sync
    changes its schedule)."""
    info = next_runs.stored(dag)
    try:
        timetable = timetable_of(dag)
    except timetables.TimetableError:
        logger.exception("dag %s: its timetable cannot be read", dag.dag_id)
        return _Plan([], None, ticks, failed=True)
    if timetable is None or info is None:
        return _Plan([], None, ticks)
    restriction = restriction_of(dag)
    infos: list[timetables.RunInfo] = []
    while info is not None and info.run_after <= now and len(infos) < limit:
        assert info.logical_date is not None
        if until is not None and info.logical_date > until:
            break
        last = held.get((dag.dag_id, info.logical_date)) if held else None
        if last is None:
            infos.append(info)
            last = info
        try:
            info = timetable.next_run(last=last, restriction=restriction, now=now)
        except timetables.TimetableError:
            logger.exception("dag %s: its timetable cannot compute a next run", dag.dag_id)
            return _Plan(infos, None, ticks, failed=True)
    return _Plan(infos, info, ticks)


def _held(plans: dict[str, _Plan]) -> Held:
    """The runs holding a logical date in the span of a Dag's planned runs, and a backfill's
    dates still waiting for their run (Airflow creates a backfill's runs all at once: its dates
    are never the scheduler's), in one query: each as the run to compute the next from (its own
    dates; the planned ones when it has no data interval)."""
    spans = [
        (dag_id, first, last)
        for dag_id, p in plans.items()
        if p.infos
        and (first := p.infos[0].logical_date) is not None
        and (last := p.infos[-1].logical_date) is not None
    ]
    if not spans:
        return {}
    planned = {(dag_id, i.logical_date): i for dag_id, p in plans.items() for i in p.infos}
    found: Held = {}
    for dag_id, logical_date, run_after, start, end in scheduling_sql.held_dates(spans):
        key = (dag_id, logical_date)
        if start is not None and end is not None:
            found[key] = timetables.RunInfo(
                run_after=run_after, data_interval_start=start, data_interval_end=end
            )
        elif key in planned:
            found[key] = planned[key]
    return found


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
