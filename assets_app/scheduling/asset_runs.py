"""ADRQ -> asset-triggered DagRuns: the scheduler (the only writer of DagRun besides the manual
trigger, through `runs.create_dag_run`).

A pass takes the Dags with queued events that are not paused and below `max_active_runs`, BATCH
at a time, each batch in its own transaction with a fixed number of statements: lock the Dag
rows (SKIP LOCKED: another scheduler has them), re-check paused and active runs, lock their ADRQ
rows (SKIP LOCKED), evaluate each Dag's condition on the assets of exactly its locked rows (an
alias counts as its linked assets), and for each Dag whose condition is met create one run
consuming exactly those events and delete exactly those rows (invariant 8). A paused Dag's rows
wait; unpausing it, or a run finishing below `max_active_runs`, lets the next sweep (or the next
drain batch for the Dag) pick them up. An asset-and-time Dag's rows are left to its ticks
(`time_scheduling`); an asset-or-time Dag is scheduled here as any asset Dag.

A Dag the scheduler cannot evaluate (a stored schedule no door accepts now, e.g. nested deeper
than `limits.MAX_CONDITION_DEPTH`, or any other error of its own step that is not the database's)
is isolated (invariant 13): it is left out of its batch before any write, the error is recorded
on the Dag (`schedule_error`, shown in the admin and in `/healthz`), its events wait, and the pass
goes on with the other Dags. The error is cleared the next time the Dag evaluates. Should a
batch's writes fail, the batch rolls back and its Dags are scheduled one per transaction, so the
failure stays with the Dag at fault. A database error still fails the pass, as it would fail
every Dag after it.
"""

import functools
import json
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import DatabaseError, transaction
from django.db.models import Count, F, IntegerField, OuterRef, Subquery, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from ..cluster import nudges
from ..definitions import conditions
from ..guards import limits
from ..models import (
    AssetAliasAsset,
    AssetDagRunQueue,
    AssetEvent,
    Dag,
    DagRun,
    DagRunState,
    DagRunType,
    ScheduleMode,
)
from ..operations import heartbeats, metrics
from ..sql import locks
from ..sql import scheduling as scheduling_sql
from . import runs

logger = logging.getLogger(__name__)

ACTIVE_RUN_STATES = (DagRunState.QUEUED, DagRunState.RUNNING)


@dataclass(frozen=True)
class ScheduleResult:
    """`run_ids`: (dag_id, run_id) of the runs created; `events_consumed`: their events."""

    dags_checked: int
    run_ids: tuple[tuple[str, str], ...]
    events_consumed: int
    seconds: float
    # Dags another scheduler held: rows committed after it took its lock wait for the next pass.
    dags_locked: tuple[str, ...] = ()
    # Dags it could not evaluate (their `schedule_error` says why): skipped, the others went on.
    dags_failed: tuple[str, ...] = ()
    # Bounded Dags whose registration fence stayed held past FENCE_WAIT_SECONDS: the
    # registration holding it schedules them after its commit (invariant 16).
    dags_fenced: tuple[str, ...] = ()


@dataclass(frozen=True)
class TriggeredRun:
    run: DagRun
    event_count: int


def candidate_dag_ids(*, dag_ids: Iterable[str] | None = None) -> list[str]:
    """Dags that have queued events, a schedule, are not paused and are below max_active_runs.

    One query, no locks: a hint for the pass, which checks again under the Dag locks.
    """
    active = (
        DagRun.objects.filter(dag=OuterRef("pk"), state__in=ACTIVE_RUN_STATES)
        .order_by()
        .values("dag")
        .annotate(count=Count("*"))
        .values("count")
    )
    queryset = Dag.objects.filter(
        is_paused=False,
        schedule__isnull=False,
        dag_id__in=AssetDagRunQueue.objects.values("target_dag_id"),
    ).exclude(schedule_mode=ScheduleMode.ASSET_AND_TIME, timetable__isnull=False)
    if dag_ids is not None:
        queryset = queryset.filter(dag_id__in=list(dag_ids))
    return list(
        queryset.annotate(active=Coalesce(Subquery(active, output_field=IntegerField()), Value(0)))
        .filter(active__lt=F("max_active_runs"))
        .order_by("dag_id")
        .values_list("dag_id", flat=True)
    )


MAX_ERROR_LENGTH = 2_000
# Dags one transaction schedules together (`_schedule_batch`): the statements of a batch are a
# fixed number, so this sets the statements per Dag; it also bounds how long a batch holds its
# Dag rows (a definition sync's UPDATE of one of them waits for the batch to commit).
BATCH = 200
# How long a pass waits for a bounded Dag's registration fence when a registration held it as
# the batch went by (`_schedule_after_fence`): about one drain batch. Past it, the registration
# schedules the Dag after its own commit.
FENCE_WAIT_SECONDS = 5.0


@dataclass
class _Outcome:
    """What scheduling some Dags did: runs created (by dag_id), Dags another scheduler held,
    Dags that could not be evaluated (their error recorded)."""

    triggered: list[TriggeredRun] = field(default_factory=list)
    locked: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    fenced: list[str] = field(default_factory=list)

    def add(self, other: "_Outcome") -> None:
        self.triggered += other.triggered
        self.locked += other.locked
        self.failed += other.failed
        self.fenced += other.fenced


class _Conditions:
    """`conditions.parse(schedule)`, once per distinct schedule per pass (it is pure)."""

    def __init__(self) -> None:
        self._parsed: dict[str, conditions.Condition] = {}

    def parse(self, schedule: Any) -> conditions.Condition:
        key = json.dumps(schedule)
        condition = self._parsed.get(key)
        if condition is None:
            condition = self._parsed[key] = conditions.parse(schedule)
        return condition


def schedule_dag(*, dag_id: str) -> TriggeredRun | None:
    """Create an asset-triggered run of `dag_id` from its queued events (a `per_event` or
    `max_events` Dag: as many as its free `max_active_runs` slots allow), returning the first.

    Its own durable transaction; locks the Dag row (FOR NO KEY UPDATE SKIP LOCKED) and then its
    ADRQ rows (FOR UPDATE SKIP LOCKED), in the global lock order. Returns the run and how many
    events it consumed, or None when the Dag is taken by another scheduler, paused, at
    max_active_runs, has no unlocked rows, its condition is not met (the rows then stay) or it
    cannot be evaluated (recorded on the Dag). Safe to run concurrently and repeatedly.
    """
    outcome = _schedule_batch([dag_id], _Conditions())
    if not outcome.triggered:
        return None
    metrics.incr(metrics.RUNS_TRIGGERED, len(outcome.triggered))
    return outcome.triggered[0]


def _describe(exc: BaseException) -> str:
    if isinstance(exc, conditions.ConditionError):
        text = f"schedule cannot be evaluated: {limits.abbreviate(exc.path)}: {exc.message}"
    else:
        text = f"schedule cannot be evaluated: {type(exc).__name__}: {exc}"
    return text[:MAX_ERROR_LENGTH]


def _record_schedule_error(dag_id: str, error: str) -> None:
    """Record why the Dag could not be evaluated: one UPDATE, written only when the text
    changes, so a Dag failing every pass is not rewritten every pass. Runs in the caller's
    transaction, or in its own statement (autocommit)."""
    Dag.objects.filter(dag_id=dag_id).exclude(schedule_error=error).update(
        schedule_error=error, schedule_error_at=timezone.now() if error else None
    )


_FAILED = object()


def _isolated(dag_id: str, step: Callable[[], Any]) -> Any:
    """`step()`, or _FAILED when it raises anything but a database error: the Dag's own step
    failed (invariant 13), so its error is recorded on it and the pass goes on without it. A
    database error still fails the pass, as it would fail every Dag after it."""
    try:
        return step()
    except DatabaseError:
        raise
    except Exception as exc:  # this Dag only: it is left out, the pass goes on
        logger.exception("dag %s cannot be scheduled; its events wait", dag_id)
        _record_schedule_error(dag_id, _describe(exc))
        return _FAILED


def _schedule_batch(dag_ids: Sequence[str], parsed: _Conditions) -> _Outcome:
    """Schedule these Dags together in one durable transaction (`_schedule_together`). A Dag
    whose condition cannot be evaluated is left out there, before any write. Should the
    batch's writes fail (which cannot be pinned on one Dag), its transaction rolls back and
    each Dag is scheduled alone in its own, so only the Dag at fault fails: recorded when the
    error is its own, the pass failing on a database error as before."""
    if len(dag_ids) > 1:
        try:
            return _schedule_together(dag_ids, parsed)
        except Exception:
            logger.warning(
                "a batch of %d dags could not be scheduled together; scheduling them one by one",
                len(dag_ids),
                exc_info=True,
            )
        outcome = _Outcome()
        for dag_id in dag_ids:
            outcome.add(_schedule_batch([dag_id], parsed))
        return outcome
    (dag_id,) = dag_ids
    outcome = _isolated(dag_id, lambda: _schedule_together(dag_ids, parsed))
    return _Outcome(failed=[dag_id]) if outcome is _FAILED else outcome


@dataclass(frozen=True)
class _RunsSoFar:
    """What a batch reads of its Dags' runs: the number in ACTIVE_RUN_STATES, and the last
    asset-triggered run's `run_after` (the newest: each is never before the one ahead of it),
    by dag_id (a Dag without any is left out of each)."""

    active: dict[str, int]
    last_run_after: dict[str, datetime]


def _runs_so_far(dag_ids: Sequence[str]) -> _RunsSoFar:
    """`_RunsSoFar` of these Dags, in one statement.

    Read after `locks.claim_dags_for_scheduling`, in a statement of its own: its snapshot is
    taken once the Dag locks are held, so it includes every run another scheduler committed
    before it released one of them (max_active_runs holds under concurrency; a count read in
    the lock statement itself would use a snapshot from before the lock)."""
    active = (
        DagRun.objects.filter(dag=OuterRef("pk"), state__in=ACTIVE_RUN_STATES)
        .order_by()
        .values("dag")
        .annotate(count=Count("*"))
        .values("count")
    )
    last = (
        DagRun.objects.filter(dag=OuterRef("pk"), run_type=DagRunType.ASSET_TRIGGERED)
        .order_by("-id")
        .values("run_after")[:1]
    )
    found = _RunsSoFar(active={}, last_run_after={})
    for dag_id, count, run_after in (
        Dag.objects.filter(dag_id__in=list(dag_ids))
        .annotate(active=Subquery(active, output_field=IntegerField()), last=Subquery(last))
        .values_list("dag_id", "active", "last")
    ):
        if count:
            found.active[dag_id] = count
        if run_after is not None:
            found.last_run_after[dag_id] = run_after
    return found


def _schedule_after_fence(dag_id: str, parsed: _Conditions) -> _Outcome:
    """Schedule a bounded Dag that a registration's fence kept out of its batch: wait for the
    fence first (at most FENCE_WAIT_SECONDS, holding nothing else), then the batch's steps for
    that Dag alone, in the same transaction (`_schedule_together`). Still held: left to the
    registration, which schedules it after its commit."""
    outcome = _isolated(dag_id, lambda: _schedule_together([dag_id], parsed, wait_for_fence=True))
    return _Outcome(failed=[dag_id]) if outcome is _FAILED else outcome


def _schedule_together(
    dag_ids: Sequence[str], parsed: _Conditions, *, wait_for_fence: bool = False
) -> _Outcome:
    """One durable transaction for these Dags, a fixed number of statements whatever their
    number: lock the Dag rows no other scheduler holds (SKIP LOCKED), count their active runs,
    lock the ADRQ rows (SKIP LOCKED) of those neither paused nor at max_active_runs, evaluate
    each one's condition on the assets of exactly its locked rows (an alias counts as its
    linked assets) in Python, then create the runs of each Dag whose condition is met
    (`_plan`), consuming exactly those events, and delete exactly those rows (invariant 8). A
    Dag whose evaluation raises is left out before any write, its error recorded, its rows
    untouched.
    """
    outcome = _Outcome()
    with transaction.atomic(durable=True):
        if wait_for_fence:
            (dag_id,) = dag_ids
            if not locks.wait_fence_for_scheduling(dag_id, timeout_seconds=FENCE_WAIT_SECONDS):
                outcome.fenced = [dag_id]
                return outcome
        claimed = locks.claim_dags_for_scheduling(dag_ids)
        outcome.locked = [dag_id for dag_id in dag_ids if dag_id not in claimed]
        # The claimed Dags neither paused nor without a schedule.
        ready = {
            dag_id: dag
            for dag_id, dag in claimed.items()
            # An asset-and-time Dag's events wait for its ticks (`time_scheduling`).
            if not dag.is_paused and dag.schedule is not None and not dag.at_ticks
        }
        if not ready:
            return outcome
        so_far = _runs_so_far(list(ready))
        active = so_far.active
        below = [
            dag_id for dag_id, dag in ready.items() if active.get(dag_id, 0) < dag.max_active_runs
        ]
        # A bounded Dag takes its events oldest first: not while a registration that may hold
        # an older one is in flight (invariant 16). Re-entrant after `wait_for_fence`.
        bounded = [dag_id for dag_id in below if ready[dag_id].max_events_per_run is not None]
        if bounded:
            outcome.fenced = locks.fence_dags_for_scheduling(bounded)
            below = [dag_id for dag_id in below if dag_id not in outcome.fenced]
        rows_by_dag: dict[str, list[locks.QueuedGroup]] = defaultdict(list)
        for group in locks.lock_dags_queue_entries(below):
            rows_by_dag[group.dag_id].append(group)
        if not rows_by_dag:
            return outcome
        met = _evaluate(rows_by_dag, ready, parsed, outcome)
        if met:
            plans = _plan(met, rows_by_dag, ready, so_far, runs.dag_tasks(list(met)))
            created = runs.create_asset_triggered_runs(planned=[plan.run for plan in plans])
            # Exactly the locked rows of the events the new runs consume (invariant 8).
            scheduling_sql.delete_queue_rows([i for plan in plans for i in plan.row_ids])
            outcome.triggered = [
                TriggeredRun(run=run, event_count=len(plan.run.consumed_event_ids))
                for plan, run in zip(plans, created, strict=True)
            ]
    return outcome


@dataclass(frozen=True)
class _Plan:
    run: runs.PlannedRun
    row_ids: list[int]  # the ADRQ rows of its events, deleted with its creation


def _plan(
    met: dict[str, set[str]],
    rows_by_dag: dict[str, list[locks.QueuedGroup]],
    ready: dict[str, locks.ClaimedDag],
    so_far: _RunsSoFar,
    tasks: dict[str, list[runs.NewTask]],
) -> list[_Plan]:
    """The runs to create for the Dags whose condition is met, each consuming the locked events
    of the assets `met` names for it (`_evaluate`). A `batch` Dag gets one run of all of them,
    its `run_after` the newest event's time. A bounded Dag (`per_event`, `max_events`: its
    `max_events_per_run` N) gets runs of the oldest events by event id, N each, as many as its
    free `max_active_runs` slots; their `run_after` is the newest time of their events, which
    costs one read of those events' timestamps when any Dag of the batch is bounded. Either
    way a run's `run_after` is never before the Dag's last asset-triggered run's (invariant
    16: an event committed late may be older than those consumed before it)."""
    plans: list[_Plan] = []
    bounded: dict[str, list[list[tuple[int, int]]]] = {}
    previous = so_far.last_run_after
    for dag_id, names in met.items():
        groups = [group for group in rows_by_dag[dag_id] if group.asset_name in names]
        limit = ready[dag_id].max_events_per_run
        if limit is None:
            plans.append(
                _Plan(
                    run=runs.PlannedRun(
                        dag_id=dag_id,
                        run_after=_not_before(
                            max(group.latest for group in groups), previous.get(dag_id)
                        ),
                        # Distinct already: ADRQ holds an event once per Dag.
                        consumed_event_ids=sorted(e for group in groups for e in group.event_ids),
                        tasks=tasks[dag_id],
                    ),
                    row_ids=[i for group in groups for i in group.row_ids],
                )
            )
            continue
        slots = ready[dag_id].max_active_runs - so_far.active.get(dag_id, 0)
        # (event id, row id), oldest event first: aligned, both arrays of one aggregate.
        events = sorted(
            pair for group in groups for pair in zip(group.event_ids, group.row_ids, strict=True)
        )[: limit * slots]
        bounded[dag_id] = [events[i : i + limit] for i in range(0, len(events), limit)]
    if bounded:
        times = _event_times([e for chunks in bounded.values() for c in chunks for e, _ in c])
        for dag_id, chunks in bounded.items():
            after = previous.get(dag_id)
            for chunk in chunks:
                after = _not_before(max(times[event_id] for event_id, _ in chunk), after)
                plans.append(
                    _Plan(
                        run=runs.PlannedRun(
                            dag_id=dag_id,
                            run_after=after,
                            consumed_event_ids=[event_id for event_id, _ in chunk],
                            tasks=tasks[dag_id],
                        ),
                        row_ids=[row_id for _, row_id in chunk],
                    )
                )
    return plans


def _not_before(when: datetime, floor: datetime | None) -> datetime:
    return when if floor is None else max(when, floor)


def _event_times(event_ids: Sequence[int]) -> dict[int, datetime]:
    """The timestamps of these events, by id: 1 statement."""
    return dict(AssetEvent.objects.filter(id__in=event_ids).values_list("id", "timestamp"))


def _evaluate(
    rows_by_dag: dict[str, list[locks.QueuedGroup]],
    ready: dict[str, locks.ClaimedDag],
    parsed: _Conditions,
    outcome: _Outcome,
) -> dict[str, set[str]]:
    """The Dags (of `rows_by_dag`, in its order) whose condition is met by the assets of their
    locked rows, each with the names of the assets whose events its runs consume: all of them
    for a `batch` Dag; for a bounded one (`max_events_per_run`), those whose event meets the
    condition alone (its runs consume a few events each; an event queued on an asset no longer
    in its schedule waits, as the sync reports), met when there is one. Reads the assets of the
    aliases the conditions name in one query (none when they name none). Pure Python
    otherwise, and before any write: a Dag whose evaluation raises is added to
    `outcome.failed` (its error recorded, in the caller's transaction) and left out; a Dag
    that evaluates clears its recorded error."""
    conditions_by_dag: dict[str, tuple[conditions.Condition, set[str]]] = {}
    for dag_id in rows_by_dag:
        step = _isolated(dag_id, functools.partial(_parse, parsed, ready[dag_id].schedule))
        if step is _FAILED:
            outcome.failed.append(dag_id)
        else:
            conditions_by_dag[dag_id] = step
    alias_assets: dict[str, set[str]] = defaultdict(set)
    wanted = set().union(*(aliases for _, aliases in conditions_by_dag.values()))
    if wanted:
        for alias_name, asset_name in AssetAliasAsset.objects.filter(
            alias__name__in=sorted(wanted)
        ).values_list("alias__name", "asset__name"):
            alias_assets[alias_name].add(asset_name)
    met: dict[str, set[str]] = {}
    cleared = []
    for dag_id, (condition, _) in conditions_by_dag.items():
        present = {group.asset_name for group in rows_by_dag[dag_id]}
        result = _isolated(
            dag_id,
            functools.partial(
                _consumable,
                condition,
                present=present,
                alias_assets=alias_assets,
                bounded=ready[dag_id].max_events_per_run is not None,
            ),
        )
        if result is _FAILED:
            outcome.failed.append(dag_id)
            continue
        if ready[dag_id].schedule_error:
            cleared.append(dag_id)
        if result:
            met[dag_id] = result
    if cleared:
        Dag.objects.filter(dag_id__in=cleared).update(schedule_error="", schedule_error_at=None)
    return met


def _consumable(
    condition: conditions.Condition,
    *,
    present: set[str],
    alias_assets: dict[str, set[str]],
    bounded: bool,
) -> set[str]:
    """Of the assets with queued events (`present`), those whose events the Dag's runs consume
    now: all of them when the condition is met (`batch`), or for a `bounded` Dag those whose
    event meets it alone; empty when none."""
    if not bounded:
        met = conditions.evaluate(condition, present=present, alias_assets=alias_assets)
        return present if met else set()
    return {
        name
        for name in present
        if conditions.evaluate(condition, present={name}, alias_assets=alias_assets)
    }


def _parse(parsed: _Conditions, schedule: Any) -> tuple[conditions.Condition, set[str]]:
    condition = parsed.parse(schedule)
    return condition, set(conditions.referenced_aliases(condition))


def schedule_nudged(*, dag_ids: Iterable[str]) -> ScheduleResult:
    """A pass for the Dags that new events were queued for (a nudge, a drain's batch), and one
    more nudge for those of them another pass held (`dags_locked`, skipped): that pass may have
    read their queue before these events committed, and they would otherwise wait for the
    minute's sweep. A Dag held by pass after pass is nudged again each time, never lost."""
    result = schedule_dags(dag_ids=dag_ids)
    if result.dags_locked:
        nudges.nudge_scheduler(dag_ids=result.dags_locked)
    return result


def schedule_dags(*, dag_ids: Iterable[str] | None = None) -> ScheduleResult:
    """One scheduler pass over the Dags with queued events (or only `dag_ids`): at most one new
    run per Dag, BATCH Dags per transaction (see `_schedule_together`; a Dag that cannot be
    evaluated is left out and recorded, the others go on). Records the "scheduler" heartbeat.
    Safe to run concurrently with drains and other schedulers."""
    started = time.monotonic()
    outcome = _Outcome()
    checked = 0
    ok = False
    try:
        candidates = candidate_dag_ids(dag_ids=dag_ids)
        parsed = _Conditions()
        for start in range(0, len(candidates), BATCH):
            batch = candidates[start : start + BATCH]
            outcome.add(_schedule_batch(batch, parsed))
            checked += len(batch)
        fenced, outcome.fenced = outcome.fenced, []
        for dag_id in fenced:
            outcome.add(_schedule_after_fence(dag_id, parsed))
        ok = True
    finally:
        # One counter statement per pass rather than one per run (each is a commit of its own);
        # every run counted here is committed. A failing counter must not hide the pass's error.
        try:
            metrics.incr(metrics.RUNS_TRIGGERED, len(outcome.triggered))
        except DatabaseError:
            logger.exception("could not count %d triggered runs", len(outcome.triggered))
        seconds = time.monotonic() - started
        heartbeats.record(
            component="scheduler",
            ok=ok,
            detail={
                "dags_checked": checked,
                "runs_created": len(outcome.triggered),
                "dags_failed": len(outcome.failed),
                "seconds": seconds,
            },
        )
    return ScheduleResult(
        dags_checked=checked,
        run_ids=tuple(
            (triggered.run.dag_id, triggered.run.run_id)
            for triggered in sorted(outcome.triggered, key=lambda t: t.run.dag_id)
        ),
        events_consumed=sum(triggered.event_count for triggered in outcome.triggered),
        seconds=seconds,
        dags_locked=tuple(outcome.locked),
        dags_failed=tuple(sorted(outcome.failed)),
        dags_fenced=tuple(sorted(outcome.fenced)),
    )
