"""Backfills (issue 24): runs of a Dag's timetable over a past range, Airflow's `backfill`.

`create_backfill` plans: the logical dates Airflow 3.3.2 gives the range (its
`iter_dagrun_infos_between`: the timetable with catchup from `from_date` to `to_date`, only
intervals that ended before now, backwards on request), each one classified against the run
that may already hold it (Airflow's rules: an unfinished run is "in flight"; a finished one is
"already exists" unless `reprocess_behavior` asks for it again, `failed` for failed runs,
`completed` for any). The plan is stored (`Backfill`, one `BackfillDagRun` per date) and
nothing else: a run here is claimable by workers as soon as it exists, so runs are created by
`start_runs`, at most `max_active_runs` of a backfill at a time, as earlier ones finish.

`start_runs` is the pass (the timers process's time scheduler, woken when a backfill's run
finishes; `run_scheduler`; and right after a create or an unpause): per batch of unfinished,
unpaused backfills of unpaused Dags, one durable transaction locks the backfill and Dag rows
(SKIP LOCKED, `locks.claim_active_backfills`), counts each one's active runs, reads its next
pending dates, inserts the runs (`backfill__` and the run's `run_after`, Airflow's run id) with
their TIs and marks those dates started; a backfill with no date left and no active run is
completed. A crash rolls a batch back whole: the plan rows are the state, so the next pass
resumes where the last commit left, and `dag_run_logical_date_unique` refuses a second run for a
date whatever happens. A date to reprocess is cleared after that commit
(`runs.clear_task_instances`, its own transaction) and then marked started; a crash between the
two leaves the run queued, which the next pass sees as active and only marks.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Count, F, Q, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from ..catalog import listing
from ..definitions import params as dag_params
from ..definitions import timetables
from ..guards import exceptions, limits
from ..models import (
    Backfill,
    BackfillDagRun,
    BackfillDagRunExceptionReason,
    Dag,
    DagRun,
    DagRunState,
    DagRunTriggeredBy,
    DagRunType,
    ReprocessBehavior,
    TaskInstance,
    TIState,
)
from ..operations import audit
from ..sql import locks
from . import runs
from . import time_runs as time_scheduling

logger = logging.getLogger(__name__)

ACTIVE_STATES = (DagRunState.QUEUED, DagRunState.RUNNING)
# Timetables with no period to fill (Airflow's `periodic` False): nothing to backfill.
NON_PERIODIC_KINDS = ("once", "events")
# A backfill plans at most this many dates (each is one row, written in one statement).
MAX_PLANNED_RUNS = 10_000
PASS_BATCH_SIZE = 100
ORDERING = listing.Ordering(keys={"id": "id"}, default=("id",))


@dataclass(frozen=True)
class PlannedDate:
    """One date of a backfill's plan, and why it gets no run (None: it gets one)."""

    info: timetables.RunInfo
    existing_run_id: int | None
    exception_reason: str | None

    @property
    def logical_date(self) -> datetime:
        assert self.info.logical_date is not None
        return self.info.logical_date


@dataclass(frozen=True)
class PassResult:
    backfills_checked: int
    run_ids: tuple[tuple[str, str], ...]
    reprocessed: tuple[tuple[str, str], ...]
    completed: tuple[int, ...]


def plan_backfill(
    *,
    dag_id: str,
    from_date: datetime,
    to_date: datetime,
    run_backwards: bool = False,
    reprocess_behavior: str = ReprocessBehavior.NONE,
    max_active_runs: int = 10,
    dag_run_conf: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> list[PlannedDate]:
    """The dates a backfill of `dag_id` over [from_date, to_date] would cover, in run order,
    each classified against the run already holding it. Reads only. NotFound for an unknown
    Dag; InvalidInput (422, as Airflow's) for a Dag without a periodic timetable, a reversed or
    future range, a bad limit, an unknown reprocess behavior, a `dag_run_conf` the Dag's params
    refuse, or a range with no date."""
    now = now or timezone.now()
    dag = Dag.objects.filter(dag_id=dag_id).first()
    if dag is None:
        raise exceptions.NotFound(f"Could not find dag {dag_id}", reason="dag_not_found")
    runs.check_run_type(dag, DagRunType.BACKFILL)
    if reprocess_behavior not in ReprocessBehavior.values:
        raise exceptions.InvalidInput(
            f"reprocess_behavior must be one of {ReprocessBehavior.values}",
            reason="invalid_reprocess_behavior",
        )
    if max_active_runs < 1:
        raise exceptions.InvalidInput(
            "max_active_runs must be at least 1", reason="invalid_max_active_runs"
        )
    if dag_run_conf is not None:
        limits.check_json_depth(dag_run_conf, field="dag_run_conf")
    timetable = time_scheduling.timetable_of(dag)
    if timetable is None or timetable.kind in NON_PERIODIC_KINDS:
        raise exceptions.InvalidInput(
            f"{dag_id} has a non-periodic schedule that does not support backfills",
            reason="non_periodic_schedule",
        )
    if from_date > to_date:
        raise exceptions.InvalidInput(
            f"from_date ({from_date.isoformat()}) must not be after to_date "
            f"({to_date.isoformat()}).",
            reason="invalid_date_range",
        )
    if from_date >= now and to_date >= now:
        raise exceptions.InvalidInput(
            "Backfill cannot be executed for future dates.", reason="future_dates"
        )
    if dag_run_conf is not None:
        try:
            dag_params.resolved(dag_params.load(dag.params), dag_run_conf)
        except dag_params.ParamError as exc:
            raise exceptions.InvalidInput(str(exc), reason="invalid_backfill_conf") from None
    infos = _dates(timetable, from_date=from_date, to_date=to_date, now=now)
    if run_backwards:
        infos.reverse()
    if not infos:
        raise exceptions.InvalidInput(
            f"No runs to create for Dag {dag_id} in the range [{from_date}, {to_date}]",
            reason="no_runs_to_create",
        )
    existing = {
        logical_date: (pk, state)
        for pk, logical_date, state in DagRun.objects.filter(
            dag_id=dag_id, logical_date__in=[info.logical_date for info in infos]
        ).values_list("pk", "logical_date", "state")
    }
    planned = []
    for info in infos:
        found = existing.get(info.logical_date)
        if found is None:
            planned.append(PlannedDate(info=info, existing_run_id=None, exception_reason=None))
            continue
        pk, state = found
        reason = _no_create_reason(state, reprocess_behavior)
        planned.append(PlannedDate(info=info, existing_run_id=pk, exception_reason=reason))
    return planned


def _dates(
    timetable: timetables.Timetable, *, from_date: datetime, to_date: datetime, now: datetime
) -> list[timetables.RunInfo]:
    """Airflow's `_get_info_list`: every run of the timetable with catchup between the dates
    whose data interval ended before now.

    Bounded by now, not by `to_date` (issue 38: a minute schedule to a year ahead walked 525,600
    future ticks in a web request): no logical date after now can have an interval ended before
    it, and a periodic timetable's intervals end in logical-date order, so the walk stops at the
    first run whose interval has not ended (at most MAX_PLANNED_RUNS + 2 ticks in all)."""
    latest = min(to_date, now)
    restriction = timetables.Restriction(earliest=from_date, latest=latest, catchup=True)
    infos: list[timetables.RunInfo] = []
    last = None
    while True:
        try:
            info = timetable.next_run(last=last, restriction=restriction, now=now)
        except timetables.TimetableError as exc:
            raise exceptions.InvalidInput(str(exc), reason="invalid_timetable") from exc
        if info is None or info.logical_date is None:
            return infos
        if info.data_interval_end is None:  # no interval: never planned, as before
            if info.run_after >= now:
                return infos
            last = info
            continue
        if info.data_interval_end >= now:
            return infos
        infos.append(info)
        if len(infos) > MAX_PLANNED_RUNS:
            raise exceptions.InvalidInput(
                f"a backfill may plan at most {MAX_PLANNED_RUNS} runs; narrow the range",
                reason="too_many_runs",
            )
        last = info


def _no_create_reason(state: str, reprocess_behavior: str) -> str | None:
    """Airflow's `_get_dag_run_no_create_reason`."""
    if state not in (DagRunState.SUCCESS, DagRunState.FAILED):
        return BackfillDagRunExceptionReason.IN_FLIGHT
    if reprocess_behavior == ReprocessBehavior.NONE:
        return BackfillDagRunExceptionReason.ALREADY_EXISTS
    if reprocess_behavior == ReprocessBehavior.FAILED and state != DagRunState.FAILED:
        return BackfillDagRunExceptionReason.ALREADY_EXISTS
    return None


def create_backfill(
    *,
    dag_id: str,
    from_date: datetime,
    to_date: datetime,
    run_backwards: bool = False,
    reprocess_behavior: str = ReprocessBehavior.NONE,
    max_active_runs: int = 10,
    dag_run_conf: dict[str, Any] | None = None,
    actor: audit.Actor | None = None,
    now: datetime | None = None,
) -> Backfill:
    """Plan a backfill (`plan_backfill`'s rules and errors) and store it, audited, in one
    durable transaction; then start its first runs (`start_runs`, after that commit). Conflict
    (409) while the Dag has an unfinished backfill (`backfill_one_active_per_dag` decides, so
    two concurrent creates make one)."""
    now = now or timezone.now()
    planned = plan_backfill(
        dag_id=dag_id,
        from_date=from_date,
        to_date=to_date,
        run_backwards=run_backwards,
        reprocess_behavior=reprocess_behavior,
        max_active_runs=max_active_runs,
        dag_run_conf=dag_run_conf,
        now=now,
    )
    with transaction.atomic(durable=True):
        try:
            with transaction.atomic():
                backfill = Backfill.objects.create(
                    dag_id=dag_id,
                    from_date=from_date,
                    to_date=to_date,
                    dag_run_conf=dag_run_conf,
                    reprocess_behavior=reprocess_behavior,
                    max_active_runs=max_active_runs,
                    run_backwards=run_backwards,
                    triggering_user_name=actor.name[:512] if actor else None,
                )
        except IntegrityError as exc:
            raise exceptions.Conflict(
                f"There is already a running backfill for dag {dag_id}",
                reason="backfill_already_running",
            ) from exc
        BackfillDagRun.objects.bulk_create(
            [
                BackfillDagRun(
                    backfill=backfill,
                    # Only a run to reprocess is the backfill's (Airflow links no other).
                    dag_run_id=None if date.exception_reason else date.existing_run_id,
                    exception_reason=date.exception_reason,
                    logical_date=date.logical_date,
                    data_interval_start=date.logical_date,
                    data_interval_end=date.info.data_interval_end or date.logical_date,
                    run_after=date.info.run_after,
                    sort_ordinal=ordinal,
                    started_at=now if date.exception_reason else None,
                )
                for ordinal, date in enumerate(planned, start=1)
            ]
        )
        audit.record(
            actor=actor,
            action="backfill.create",
            summary=f"backfill {backfill.pk} of dag {dag_id}: {len(planned)} date(s) from "
            f"{from_date.isoformat()} to {to_date.isoformat()}",
            targets=[audit.Target(kind="backfill", object_id=backfill.pk)],
            dag_id=dag_id,
            detail={
                "from_date": from_date.isoformat(),
                "to_date": to_date.isoformat(),
                "reprocess_behavior": reprocess_behavior,
                "max_active_runs": max_active_runs,
                "run_backwards": run_backwards,
                "dates": len(planned),
                "skipped": sum(1 for date in planned if date.exception_reason),
            },
        )
    start_runs(backfill_ids=[backfill.pk])
    backfill.refresh_from_db()
    return backfill


def start_runs(
    *, backfill_ids: Sequence[int] | None = None, now: datetime | None = None
) -> PassResult:
    """The pass: every unfinished, unpaused backfill (or those of `backfill_ids`) once,
    PASS_BATCH_SIZE per durable transaction with a fixed number of statements; then the dates
    to reprocess. Safe to run concurrently (SKIP LOCKED: a backfill or Dag another holds is
    left to it) and again after a crash (module docstring)."""
    now = now or timezone.now()
    seen: list[int] = []
    created: list[tuple[str, str]] = []
    completed: list[int] = []
    reprocess: list[tuple[int, int, bool]] = []
    while True:
        batch = _start_batch(now=now, ids=backfill_ids, exclude=seen)
        seen += batch.checked
        created += batch.created
        completed += batch.completed
        reprocess += batch.reprocess
        if len(batch.checked) < PASS_BATCH_SIZE:
            break
    reprocessed = [
        _reprocess(row_pk, run_pk, only_failed) for row_pk, run_pk, only_failed in reprocess
    ]
    return PassResult(
        backfills_checked=len(seen),
        run_ids=tuple(created),
        reprocessed=tuple(r for r in reprocessed if r is not None),
        completed=tuple(completed),
    )


@dataclass
class _Batch:
    checked: list[int]
    created: list[tuple[str, str]]
    completed: list[int]
    reprocess: list[tuple[int, int, bool]]


def _start_batch(*, now: datetime, ids: Sequence[int] | None, exclude: list[int]) -> _Batch:
    batch = _Batch(checked=[], created=[], completed=[], reprocess=[])
    with transaction.atomic(durable=True):
        claimed = locks.claim_active_backfills(ids=ids, exclude=exclude, limit=PASS_BATCH_SIZE)
        if not claimed:
            return batch
        batch.checked = [b.pk for b in claimed]
        active = dict(
            BackfillDagRun.objects.filter(
                backfill_id__in=batch.checked,
                started_at__isnull=False,
                exception_reason__isnull=True,
                dag_run__state__in=ACTIVE_STATES,
            )
            .order_by()
            .values("backfill_id")
            .annotate(count=Count("*"))
            .values_list("backfill_id", "count")
        )
        free = {b.pk: b.max_active_runs - active.get(b.pk, 0) for b in claimed}
        pending = list(
            BackfillDagRun.objects.filter(
                backfill_id__in=batch.checked,
                started_at__isnull=True,
                exception_reason__isnull=True,
            )
            .annotate(
                rank=Window(
                    RowNumber(), partition_by=[F("backfill_id")], order_by=F("sort_ordinal").asc()
                )
            )
            .filter(rank__lte=max(max(free.values()), 1))
            .select_related("dag_run")
            .order_by("backfill_id", "sort_ordinal")
        )
        by_backfill: dict[int, list[Any]] = {}
        for row in pending:
            by_backfill.setdefault(row.backfill_id, []).append(row)
        dates = [row.logical_date for row in pending if row.dag_run_id is None]
        dag_ids = sorted({b.dag_id for b in claimed})
        taken = set(
            DagRun.objects.filter(dag_id__in=dag_ids, logical_date__in=dates).values_list(
                "dag_id", "logical_date"
            )
        )
        tasks = runs.dag_tasks(dag_ids)
        items: list[tuple[DagRun, Sequence[runs.NewTask]]] = []
        started: list[tuple[Any, DagRun | None]] = []
        converted: list[int] = []
        finished: list[Backfill] = []
        for backfill in claimed:
            rows = by_backfill.get(backfill.pk, [])
            if not rows and not active.get(backfill.pk):
                backfill.completed_at = now
                finished.append(backfill)
                continue
            for row in rows[: max(free[backfill.pk], 0)]:
                if row.dag_run is not None:
                    if row.dag_run.state in ACTIVE_STATES:
                        # Cleared by a pass that crashed before marking it (or running anyway).
                        started.append((row, None))
                        converted.append(row.dag_run.pk)
                    else:
                        only_failed = backfill.reprocess_behavior == ReprocessBehavior.FAILED
                        batch.reprocess.append((row.pk, row.dag_run.pk, only_failed))
                    continue
                if (backfill.dag_id, row.logical_date) in taken:
                    # A run appeared for that date since the plan (the time scheduler, a
                    # manual trigger): Airflow records it as in flight.
                    row.exception_reason = BackfillDagRunExceptionReason.IN_FLIGHT
                    started.append((row, None))
                    continue
                run = DagRun(
                    dag_id=backfill.dag_id,
                    run_id=backfill_run_id(row.run_after),
                    run_type=DagRunType.BACKFILL,
                    triggered_by=DagRunTriggeredBy.BACKFILL,
                    triggering_user_name=backfill.triggering_user_name,
                    state=DagRunState.QUEUED,
                    run_after=row.run_after,
                    logical_date=row.logical_date,
                    data_interval_start=row.data_interval_start,
                    data_interval_end=row.data_interval_end,
                    conf=backfill.dag_run_conf or {},
                )
                items.append((run, tasks[backfill.dag_id]))
                started.append((row, run))
        runs.create_scheduled_runs(items=items)
        for marked, created in started:
            marked.started_at = now
            if created is not None:
                marked.dag_run_id = created.pk
        if started:
            BackfillDagRun.objects.bulk_update(
                [row for row, _ in started], ["started_at", "dag_run_id", "exception_reason"]
            )
        if converted:
            _convert_runs(converted)
        if finished:
            Backfill.objects.filter(pk__in=[b.pk for b in finished]).update(
                completed_at=now, updated_at=now
            )
        batch.created = [(run.dag_id, run.run_id) for run, _ in items]
        batch.completed = [b.pk for b in finished]
    return batch


def _convert_runs(run_pks: Sequence[int]) -> None:
    """Make existing runs the backfill's (Airflow's `_handle_clear_run`). In the caller's
    transaction."""
    DagRun.objects.filter(pk__in=list(run_pks)).update(
        run_type=DagRunType.BACKFILL, triggered_by=DagRunTriggeredBy.BACKFILL
    )


def _reprocess(row_pk: int, run_pk: int, only_failed: bool) -> tuple[str, str] | None:
    """Clear an existing run for its backfill (its own transaction), then mark its date started
    and the run the backfill's. A run deleted meanwhile: the date is marked unknown."""
    try:
        runs.clear_task_instances(dag_run_id=run_pk, only_failed=only_failed)
    except exceptions.NotFound:
        BackfillDagRun.objects.filter(pk=row_pk, started_at__isnull=True).update(
            exception_reason=BackfillDagRunExceptionReason.UNKNOWN, started_at=timezone.now()
        )
        return None
    with transaction.atomic(durable=True):
        marked = BackfillDagRun.objects.filter(pk=row_pk, started_at__isnull=True).update(
            started_at=timezone.now()
        )
        if marked:
            _convert_runs([run_pk])
    run = DagRun.objects.filter(pk=run_pk).values_list("dag_id", "run_id").first()
    return run


def backfill_run_id(run_after: datetime) -> str:
    """Airflow's run id of a backfill run with a logical date: `backfill__` and its run_after
    (`DagRun.generate_run_id`), in UTC ISO 8601."""
    return f"{DagRunType.BACKFILL}__{run_after.astimezone(timetables.UTC).isoformat()}"


# ---- operator actions -------------------------------------------------------------------------


def get_backfill(*, backfill_id: int) -> Backfill:
    backfill = Backfill.objects.filter(pk=backfill_id).first()
    if backfill is None:
        raise exceptions.NotFound("Backfill not found", reason="backfill_not_found")
    return backfill


def list_backfills(
    *, dag_id: str, limit: int, offset: int, order_by: Sequence[str] | None = None
) -> listing.Page:
    """A Dag's backfills, a page by offset (Airflow: ordered by `id` only)."""
    return listing.offset_page(
        Backfill.objects.filter(dag_id=dag_id),
        ORDERING,
        order_by=order_by,
        limit=limit,
        offset=offset,
    )


def set_paused(*, backfill_id: int, is_paused: bool, actor: audit.Actor | None = None) -> Backfill:
    """Pause (no new runs; those created go on) or unpause a backfill, audited; an unpause then
    starts its next runs. Own durable transaction, waiting briefly for a pass holding the row.
    NotFound; InvalidState (409) once it completed. Idempotent."""
    action = "backfill.pause" if is_paused else "backfill.unpause"
    with transaction.atomic(durable=True):
        backfill = _lock_unfinished(backfill_id)
        if backfill.is_paused != is_paused:
            backfill.is_paused = is_paused
            backfill.save(update_fields=["is_paused", "updated_at"])
            audit.record(
                actor=actor,
                action=action,
                summary=f"{action} {backfill.pk} of dag {backfill.dag_id}",
                targets=[audit.Target(kind="backfill", object_id=backfill.pk)],
                dag_id=backfill.dag_id,
            )
    if not is_paused:
        start_runs(backfill_ids=[backfill.pk])
        backfill.refresh_from_db()
    return backfill


def cancel(*, backfill_id: int, actor: audit.Actor | None = None) -> Backfill:
    """Airflow's cancel: pause, fail the backfill's runs still queued (here their TIs not yet
    running are skipped too, as they are claimable), complete it; running runs go on. One durable
    transaction, audited. NotFound; InvalidState (409) once it completed."""
    now = timezone.now()
    with transaction.atomic(durable=True):
        backfill = _lock_unfinished(backfill_id)
        queued = list(
            DagRun.objects.filter(
                pk__in=BackfillDagRun.objects.filter(
                    backfill=backfill,
                    dag_run__isnull=False,
                    started_at__isnull=False,
                    exception_reason__isnull=True,
                ).values("dag_run_id"),
                state=DagRunState.QUEUED,
            ).values_list("pk", flat=True)
        )
        if queued:
            TaskInstance.objects.filter(
                dag_run_id__in=queued,
                state__in=[TIState.QUEUED, TIState.SCHEDULED, TIState.UP_FOR_RETRY],
            ).update(state=TIState.SKIPPED, end_date=now, updated_at=now)
            DagRun.objects.filter(pk__in=queued).update(state=DagRunState.FAILED, end_date=now)
        backfill.is_paused = True
        backfill.completed_at = now
        backfill.save(update_fields=["is_paused", "completed_at", "updated_at"])
        audit.record(
            actor=actor,
            action="backfill.cancel",
            summary=f"cancelled backfill {backfill.pk} of dag {backfill.dag_id}: "
            f"{len(queued)} queued run(s) failed",
            targets=[audit.Target(kind="backfill", object_id=backfill.pk)]
            + [audit.Target(kind="dag_run", object_id=pk) for pk in queued],
            dag_id=backfill.dag_id,
        )
    return backfill


def _lock_unfinished(backfill_id: int) -> Backfill:
    backfill = locks.lock_backfill(backfill_id)
    if backfill is None:
        raise exceptions.NotFound("Backfill not found", reason="backfill_not_found")
    if backfill.completed_at is not None:
        raise exceptions.InvalidState("Backfill is already completed.", reason="backfill_completed")
    return backfill


def summary(backfill: Backfill) -> dict[str, int]:
    """How many dates are pending, created (and of those active), or skipped, for a command's
    report: one query."""
    counts = BackfillDagRun.objects.filter(backfill=backfill).aggregate(
        pending=Count("pk", filter=Q(started_at__isnull=True, exception_reason__isnull=True)),
        created=Count("pk", filter=Q(started_at__isnull=False, exception_reason__isnull=True)),
        active=Count(
            "pk",
            filter=Q(
                started_at__isnull=False,
                exception_reason__isnull=True,
                dag_run__state__in=ACTIVE_STATES,
            ),
        ),
        skipped=Count("pk", filter=Q(exception_reason__isnull=False)),
    )
    return {name: int(value or 0) for name, value in counts.items()}
