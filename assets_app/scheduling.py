"""ADRQ -> asset-triggered DagRuns: the scheduler (the only writer of DagRun besides the manual
trigger, through `runs.create_dag_run`).

For each Dag with queued events that is not paused and below `max_active_runs`, in its own
transaction: lock the Dag row (SKIP LOCKED: another scheduler has it), re-check paused and active
runs, lock its ADRQ rows (SKIP LOCKED), evaluate its condition on the assets of exactly those rows
(an alias counts as its linked assets), and when it is met create one run consuming exactly those
events and delete exactly those rows (invariant 8). A paused Dag's rows wait; unpausing it, or a
run finishing below `max_active_runs`, lets the next sweep (or the next drain batch for the Dag)
pick them up.

A Dag the scheduler cannot evaluate (a stored schedule no door accepts now, e.g. nested deeper
than `limits.MAX_CONDITION_DEPTH`, or any other error of its own step that is not the database's)
is isolated (invariant 13): its transaction rolls back, the error is recorded on the Dag
(`schedule_error`, shown in the admin and in `/healthz`), its events wait, and the pass goes on
with the other Dags. The error is cleared the next time the Dag evaluates. A database error
still fails the pass, as it would fail every Dag after it.
"""

import json
import logging
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.db.models import Count, F, IntegerField, OuterRef, Subquery, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from . import conditions, heartbeats, limits, locks, metrics, runs
from .models import (
    AssetAliasAsset,
    AssetDagRunQueue,
    Dag,
    DagRun,
    DagRunState,
    DagRunType,
)

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


@dataclass(frozen=True)
class TriggeredRun:
    run: DagRun
    event_count: int


def candidate_dag_ids(*, dag_ids: Iterable[str] | None = None) -> list[str]:
    """Dags that have queued events, a schedule, are not paused and are below max_active_runs.

    One query, no locks: a hint for `schedule_dag`, which checks again under the Dag lock.
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
    )
    if dag_ids is not None:
        queryset = queryset.filter(dag_id__in=list(dag_ids))
    return list(
        queryset.annotate(active=Coalesce(Subquery(active, output_field=IntegerField()), Value(0)))
        .filter(active__lt=F("max_active_runs"))
        .order_by("dag_id")
        .values_list("dag_id", flat=True)
    )


LOCKED = "locked"
FAILED = "failed"
MAX_ERROR_LENGTH = 2_000
# Dags whose tasks one query reads ahead of scheduling them (see `_Pass.tasks`).
TASKS_BATCH = 200


class _Pass:
    """What one scheduler pass reuses across its Dags: the lock statements compiled once, the
    parsed conditions by schedule JSON, and (for a whole pass) the tasks of the next
    TASKS_BATCH candidates read in one query instead of one query per Dag.

    Tasks read ahead may predate a definition sync committed a moment later, as tasks read
    inside the Dag's transaction may predate one committed before its TI insert: a sync does
    not lock the Dag row for its task writes, so neither read is ordered with it.
    """

    def __init__(self, candidates: list[str] | None = None) -> None:
        self.locks = locks.SchedulingLocks(active_states=ACTIVE_RUN_STATES)
        self._candidates = candidates
        self._tasks: dict[str, list[tuple[str, int, bool]]] = {}
        self._read_ahead = 0
        self._conditions: dict[str, conditions.Condition] = {}

    def tasks(self, dag_id: str, position: int) -> list[tuple[str, int, bool]] | None:
        """The tasks of the candidate at `position`, or None (create_dag_run reads them)."""
        if self._candidates is None:
            return None
        if position >= self._read_ahead:
            batch = self._candidates[position : position + TASKS_BATCH]
            self._tasks = {dag: [] for dag in batch}
            for dag, task_id, retries, has_upstream in runs.dag_tasks(batch):
                self._tasks[dag].append((task_id, retries, has_upstream))
            self._read_ahead = position + len(batch)
        return self._tasks[dag_id]

    def condition(self, schedule: Any) -> conditions.Condition:
        """`conditions.parse(schedule)`, once per distinct schedule per pass (it is pure)."""
        key = json.dumps(schedule)
        condition = self._conditions.get(key)
        if condition is None:
            condition = self._conditions[key] = conditions.parse(schedule)
        return condition


def schedule_dag(*, dag_id: str) -> TriggeredRun | None:
    """Create at most one asset-triggered run of `dag_id` from its queued events.

    Its own durable transaction; locks the Dag row (FOR NO KEY UPDATE SKIP LOCKED) and then its
    ADRQ rows (FOR UPDATE SKIP LOCKED), in the global lock order. Returns the run and how many
    events it consumed, or None when the Dag is taken by another scheduler, paused, at
    max_active_runs, has no unlocked rows, or its condition is not met (the rows then stay).
    Safe to run concurrently and repeatedly.
    """
    outcome = _schedule_dag(dag_id, _Pass())
    if not isinstance(outcome, TriggeredRun):
        return None
    metrics.incr(metrics.RUNS_TRIGGERED)
    return outcome


class _CannotEvaluate(Exception):
    """The Dag's own step failed (not the database): roll its transaction back, record why."""


def _describe(exc: BaseException) -> str:
    if isinstance(exc, conditions.ConditionError):
        text = f"schedule cannot be evaluated: {limits.abbreviate(exc.path)}: {exc.message}"
    else:
        text = f"schedule cannot be evaluated: {type(exc).__name__}: {exc}"
    return text[:MAX_ERROR_LENGTH]


def _record_schedule_error(dag_id: str, error: str) -> None:
    """Record (or clear, with "") why the Dag could not be evaluated: one UPDATE, written only
    when the text changes, so a Dag failing every pass is not rewritten every pass. Runs in the
    caller's transaction, or in its own statement (autocommit)."""
    Dag.objects.filter(dag_id=dag_id).exclude(schedule_error=error).update(
        schedule_error=error, schedule_error_at=timezone.now() if error else None
    )


def _schedule_dag(dag_id: str, context: _Pass, position: int = 0) -> TriggeredRun | str | None:
    """`schedule_dag`, telling "another scheduler holds the Dag" (LOCKED) and "cannot be
    evaluated" (FAILED, recorded on the Dag) from the other Nones.

    Does not count the run in the metrics: the callers do, after the commit.
    """
    try:
        return _schedule_dag_in_transaction(dag_id, context, position)
    except DatabaseError:
        raise
    except Exception as exc:  # this Dag only: its transaction rolled back, the pass goes on
        logger.exception("dag %s cannot be scheduled; its events wait", dag_id)
        cause = exc.__cause__ if isinstance(exc, _CannotEvaluate) and exc.__cause__ else exc
        _record_schedule_error(dag_id, _describe(cause))
        return FAILED


def _schedule_dag_in_transaction(
    dag_id: str, context: _Pass, position: int
) -> TriggeredRun | str | None:
    with transaction.atomic(durable=True):
        claimed = context.locks.claim_dag(dag_id)
        if claimed is None:
            return LOCKED
        is_paused, schedule, max_active_runs, schedule_error = claimed
        if is_paused or schedule is None:
            return None
        # The rows and the active-run count in one statement, read once the Dag lock is held.
        rows, active = context.locks.lock_queue_entries_and_active_runs(dag_id)
        if not rows or active >= max_active_runs:
            return None
        try:
            condition = context.condition(schedule)
            aliases = conditions.referenced_aliases(condition)
        except Exception as exc:
            raise _CannotEvaluate() from exc
        event_ids = sorted({event_id for _, event_id, _, _ in rows})
        present = {name for _, _, _, name in rows}
        alias_assets: dict[str, set[str]] = defaultdict(set)
        if aliases:
            for alias_name, asset_name in AssetAliasAsset.objects.filter(
                alias__name__in=aliases
            ).values_list("alias__name", "asset__name"):
                alias_assets[alias_name].add(asset_name)
        try:
            met = conditions.evaluate(condition, present=present, alias_assets=alias_assets)
        except Exception as exc:
            raise _CannotEvaluate() from exc
        if schedule_error:
            _record_schedule_error(dag_id, "")
        if not met:
            return None
        dag = Dag.from_db(
            connection.alias,
            ["dag_id", "is_paused", "schedule", "max_active_runs"],
            [dag_id, is_paused, schedule, max_active_runs],
        )
        run = runs.create_dag_run(
            dag=dag,
            run_type=DagRunType.ASSET_TRIGGERED,
            run_after=max(timestamp for _, _, timestamp, _ in rows),
            consumed_event_ids=event_ids,
            tasks=context.tasks(dag_id, position),
        )
        # Exactly the locked rows (invariant 8). A plain DELETE, as the ORM's fast delete of
        # these rows (nothing cascades from ADRQ and no signals are connected) without building
        # a queryset per Dag.
        ids = [row[0] for row in rows]
        quote, meta = connection.ops.quote_name, AssetDagRunQueue._meta
        with connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {quote(meta.db_table)} WHERE {quote(meta.pk.column)}"
                f" IN ({', '.join(['%s'] * len(ids))})",
                ids,
            )
        return TriggeredRun(run=run, event_count=len(event_ids))


def schedule_dags(*, dag_ids: Iterable[str] | None = None) -> ScheduleResult:
    """One scheduler pass over the Dags with queued events (or only `dag_ids`): at most one new
    run per Dag, each in its own transaction (see `schedule_dag`). Records the "scheduler"
    heartbeat. Safe to run concurrently with drains and other schedulers."""
    started = time.monotonic()
    created: list[tuple[str, str]] = []
    locked: list[str] = []
    failed: list[str] = []
    consumed = 0
    checked = 0
    ok = False
    try:
        candidates = candidate_dag_ids(dag_ids=dag_ids)
        context = _Pass(candidates)
        for position, dag_id in enumerate(candidates):
            checked += 1
            outcome = _schedule_dag(dag_id, context, position)
            if isinstance(outcome, TriggeredRun):
                created.append((dag_id, outcome.run.run_id))
                consumed += outcome.event_count
            elif outcome == LOCKED:
                locked.append(dag_id)
            elif outcome == FAILED:
                failed.append(dag_id)
        ok = True
    finally:
        # One counter statement per pass rather than one per run (each is a commit of its own);
        # every run counted here is committed. A failing counter must not hide the pass's error.
        try:
            metrics.incr(metrics.RUNS_TRIGGERED, len(created))
        except DatabaseError:
            logger.exception("could not count %d triggered runs", len(created))
        seconds = time.monotonic() - started
        heartbeats.record(
            component="scheduler",
            ok=ok,
            detail={
                "dags_checked": checked,
                "runs_created": len(created),
                "dags_failed": len(failed),
                "seconds": seconds,
            },
        )
    return ScheduleResult(
        dags_checked=checked,
        run_ids=tuple(created),
        events_consumed=consumed,
        seconds=seconds,
        dags_locked=tuple(locked),
        dags_failed=tuple(failed),
    )


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
    (`task_state.fail_dead_task_instances`), then runs a crash left with ready TIs waiting, or
    with every TI finished, are evaluated and finished (`dependencies.sweep_waiting_runs`).
    Every write is conditional: safe to run concurrently with workers, finishes and other
    sweeps. Records the "repair" heartbeat."""
    from . import dependencies, task_state

    ok = False
    detail: dict[str, Any] = {}
    try:
        dead = task_state.fail_dead_task_instances()
        waiting = dependencies.sweep_waiting_runs()
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
