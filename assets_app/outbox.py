"""The asset event outbox (`AssetEventQueue`): enqueue, claim, retry, park, requeue.

Payload of a row (JSON), everything registration needs even after the TI is deleted:

    {
      "outlets":       [{"name": str, "uri": str, "type": "Asset"}  |
                        {"name": str, "type": "AssetAlias"}],        # as the worker declared them
      "outlet_events": [{"dest_asset_key": {"name", "uri"}, "extra": {...}} |
                        {"source_alias_name": str, "dest_asset_key": {"name", "uri"},
                         "dest_asset_extra": {...}, "extra": {...}}],
      "source": {"ti_id": str, "dag_id": str, "run_id": str, "task_id": str,
                 "map_index": int, "try_number": int},
      "end_date": ISO 8601 str,
    }

The drain (`drain`, `drain_batch`) claims due rows FOR UPDATE SKIP LOCKED, registers their
payloads (`registration`) and deletes them in the same transaction, so a crash anywhere rolls both
back and the row is retried (invariant 3). A row that fails is rescheduled with capped exponential
backoff and full jitter and parked after `ASSET_QUEUE_MAX_ATTEMPTS` (invariant 6). After each
batch commits, the drain runs the scheduler for the Dags that batch queued events for (DESIGN 7:
one django-q2 pickup fewer than nudging a scheduler task).

Failures are classified (`classify_failure`): a permanent one (the payload cannot be registered
as it is: invalid, or an asset key that conflicts with a stored asset) parks the row at once with
`park_reason` saying what an operator can do; a transient one (database errors, lock timeouts,
anything unknown) backs off as above. Every failed attempt is appended to `attempt_history`.

Operator actions (`requeue`, `park`, `delete_rows`, `select_rows`) are used by the admin and the
`requeue_parked` command, and each records an audit entry (`audit.record`) in its transaction.
`requeue` keeps `last_error` / `last_error_type` / `attempt_history` as history: they say why
the row was parked and are overwritten by the next failure (or vanish with the row when it is
registered).
"""

import logging
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DataError, connection, transaction
from django.db.models import Count, Q, QuerySet
from django.utils import timezone

from . import audit, exceptions, heartbeats, locks, metrics, observability, registration, scheduling
from .models import AssetDagRunQueue, AssetEventQueue, FailureKind, TaskInstance

logger = logging.getLogger(__name__)
ATTEMPT_HISTORY_KEPT = 50


def build_payload(
    *,
    ti: TaskInstance,
    outlets: list[dict[str, Any]],
    outlet_events: list[dict[str, Any]],
    end_date: datetime,
) -> dict[str, Any]:
    return {
        "outlets": outlets,
        "outlet_events": outlet_events,
        "source": {
            "ti_id": str(ti.id),
            "dag_id": ti.dag_id,
            "run_id": ti.run_id,
            "task_id": ti.task_id,
            "map_index": ti.map_index,
            "try_number": ti.try_number,
        },
        "end_date": end_date.isoformat(),
    }


def enqueue(
    *,
    ti: TaskInstance,
    outlets: list[dict[str, Any]],
    outlet_events: list[dict[str, Any]],
    end_date: datetime,
) -> AssetEventQueue:
    """Insert the outbox row for this TI try. Runs inside the caller's transaction (the one that
    holds the TI lock and sets success) so the state change and the row commit together.

    One INSERT; the (ti_id, try_number) unique constraint refuses a second row for the same try.
    """
    row = AssetEventQueue.objects.create(
        ti_id=ti.id,
        try_number=ti.try_number,
        source_dag_id=ti.dag_id,
        source_run_id=ti.run_id,
        source_task_id=ti.task_id,
        source_map_index=ti.map_index,
        payload=build_payload(
            ti=ti, outlets=outlets, outlet_events=outlet_events, end_date=end_date
        ),
    )
    metrics.incr(metrics.ENQUEUED)
    return row


@dataclass(frozen=True)
class BatchResult:
    """One drain batch: rows claimed, registered (deleted), failed (rescheduled or parked)."""

    claimed: int
    registered: int
    failed: int
    parked: int
    events_written: int
    dag_ids: frozenset[str]
    runs_triggered: int


@dataclass(frozen=True)
class DrainResult:
    batches: int
    claimed: int
    registered: int
    failed: int
    parked: int
    events_written: int
    runs_triggered: int
    seconds: float


@dataclass(frozen=True)
class DeleteResult:
    """Rows deleted and the declared outlets they carried (events that will never exist)."""

    rows: int
    outlets_lost: int


def backoff_seconds(*, attempts: int) -> float:
    """Full-jitter capped exponential backoff after the `attempts`-th failure (1-based):
    uniform(0, min(cap, base * 2 ** (attempts - 1))). Settings are read at call time."""
    base = float(settings.ASSET_QUEUE_BACKOFF_BASE_SECONDS)
    cap = float(settings.ASSET_QUEUE_BACKOFF_CAP_SECONDS)
    ceiling = min(cap, base * 2 ** min(attempts - 1, 62))
    return random.uniform(0, ceiling)


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class Failure:
    """What a registration error means for its row: `kind`, and for a permanent one the
    `reason` an operator can act on plus what it refers to (`detail`, e.g. asset ids)."""

    kind: FailureKind
    reason: str = ""
    detail: dict[str, Any] | None = None


def classify_failure(exc: BaseException) -> Failure:
    """Permanent: the payload itself cannot be registered (a domain InvalidInput such as
    `RegistrationError`, or a value the database refuses, DataError); retrying cannot help.
    Transient: everything else (connection and lock errors, serialization failures, an
    IntegrityError from a concurrent writer, unknown errors), which the next attempt may pass."""
    if isinstance(exc, exceptions.InvalidInput):
        if exc.reason == "asset_key_conflict":
            key = exc.extra.get("asset_key") or {}
            stored = exc.extra.get("conflicting_assets") or []
            described = (
                "; ".join(f"#{a['id']} name={a['name']!r} uri={a['uri']!r}" for a in stored)
                or "another asset"
            )
            return Failure(
                kind=FailureKind.PERMANENT,
                reason=(
                    f"The task declared asset name={key.get('name')!r} uri={key.get('uri')!r}, "
                    f"but the stored asset {described} has the same name or uri and not both "
                    "(names and uris are each unique). Correct the stored asset's uri or name "
                    "on its page (or fix the task's outlet and run it again), then Requeue."
                ),
                detail={"asset_ids": [a["id"] for a in stored], "asset_key": key},
            )
        return Failure(
            kind=FailureKind.PERMANENT,
            reason=(
                f"The payload cannot be registered as it is: {exc.message}. Fix the producing "
                "task and run it again (then Delete this row), or Requeue after fixing the data "
                "it refers to."
            ),
        )
    if isinstance(exc, DataError):
        return Failure(
            kind=FailureKind.PERMANENT,
            reason=(
                f"The database refused a value of the payload ({first_line(str(exc))}). Fix the "
                "producing task and run it again, then Delete this row."
            ),
        )
    return Failure(kind=FailureKind.TRANSIENT)


def first_line(text: str, *, limit: int = 300) -> str:
    line = next((part for part in (text or "").strip().splitlines() if part.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _record_failure(row: AssetEventQueue, exc: Exception, *, now: datetime) -> bool:
    """Reschedule or park one failed row (inside the batch transaction, row locked), after
    `classify_failure`: a permanent error parks at once with its reason; a transient one backs
    off and parks after ASSET_QUEUE_MAX_ATTEMPTS. Appends the attempt to `attempt_history`.
    Returns True if the row is now parked."""
    failure = classify_failure(exc)
    row.attempts += 1
    row.last_error = _error_text(exc)[:10_000]
    row.last_error_type = f"{type(exc).__module__}.{type(exc).__qualname__}"[:200]
    row.last_error_kind = failure.kind
    row.error_detail = failure.detail or {}
    row.attempt_history = [
        *(row.attempt_history or []),
        {
            "at": now.isoformat(),
            "kind": failure.kind.value,
            "error_type": row.last_error_type,
            "error": first_line(row.last_error),
        },
    ][-ATTEMPT_HISTORY_KEPT:]
    max_attempts = int(settings.ASSET_QUEUE_MAX_ATTEMPTS)
    parked = failure.kind == FailureKind.PERMANENT or row.attempts >= max_attempts
    row.parked_at = now if parked else None
    if parked:
        row.park_reason = failure.reason or (
            f"Failed {row.attempts} times with transient errors (the last one above). Requeue "
            "once its cause is fixed; the drain retries it then."
        )
        logger.error(
            "outbox row %s parked after attempt %s (%s): %s",
            row.id,
            row.attempts,
            failure.kind.value,
            first_line(row.last_error),
        )
    row.next_attempt_at = now + timedelta(seconds=backoff_seconds(attempts=row.attempts))
    row.save(
        update_fields=[
            "attempts",
            "last_error",
            "last_error_type",
            "last_error_kind",
            "error_detail",
            "attempt_history",
            "park_reason",
            "parked_at",
            "next_attempt_at",
            "updated_at",
        ]
    )
    return parked


def _before_commit(rows: list[AssetEventQueue]) -> None:
    """Runs last inside the batch transaction. A seam for crash tests (raise here to simulate a
    process dying after registration and before commit)."""


def _connection_lost() -> bool:
    raw = connection.connection
    return raw is None or bool(getattr(raw, "closed", False))


def drain_batch(*, batch_size: int | None = None) -> BatchResult:
    """Claim up to `batch_size` due rows and register them, in one durable transaction; then
    run the scheduler for the Dags the batch queued events for.

    Locks: the claimed outbox rows (FOR UPDATE SKIP LOCKED), so concurrent drains never wait or
    double-register. The whole batch is registered in one savepoint with set-based queries (a
    fixed number of queries whatever the batch size); if that fails, each row is retried in its
    own savepoint so one poison row only fails itself.
    """
    batch_size = batch_size or int(settings.ASSET_QUEUE_BATCH_SIZE)
    with transaction.atomic(durable=True):
        now = timezone.now()
        rows = locks.claim_due_outbox_rows(limit=batch_size, now=now)
        if not rows:
            return BatchResult(0, 0, 0, 0, 0, frozenset(), 0)
        registration.check_constraints_immediately()
        results: list[registration.RegistrationResult] = []
        failures: list[tuple[AssetEventQueue, Exception]] = []
        try:
            with transaction.atomic():
                results = registration.register_payloads(payloads=[row.payload for row in rows])
                AssetEventQueue.objects.filter(id__in=[row.id for row in rows]).delete()
        except Exception:
            if _connection_lost():
                # The session is gone (terminated, network): nothing can be retried on it and
                # the whole transaction is rolled back by the server. Let the caller see it.
                raise
            results = []
            for row in rows:
                try:
                    with transaction.atomic():
                        results.append(registration.register_payload(payload=row.payload))
                        AssetEventQueue.objects.filter(id=row.id).delete()
                except Exception as exc:
                    logger.warning("outbox row %s failed: %s", row.id, _error_text(exc))
                    failures.append((row, exc))
        parked = sum(_record_failure(row, exc, now=now) for row, exc in failures)
        metrics.incr(metrics.REGISTERED, len(results))
        metrics.incr(metrics.FAILED_ATTEMPTS, len(failures))
        metrics.incr(metrics.PARKED, parked)
        _before_commit(rows)
    dag_ids = frozenset(dag_id for result in results for dag_id in result.dag_ids)
    runs = scheduling.schedule_dags(dag_ids=sorted(dag_ids)) if dag_ids else None
    if runs and runs.dags_locked:
        # Another scheduler holds these Dags and may have locked their rows before ours
        # committed: one more pass soon, rather than waiting for the sweep.
        _nudge_scheduler(runs.dags_locked)
    return BatchResult(
        claimed=len(rows),
        registered=len(results),
        failed=len(failures),
        parked=parked,
        events_written=sum(result.events_written for result in results),
        dag_ids=dag_ids,
        runs_triggered=len(runs.run_ids) if runs else 0,
    )


def drain(*, batch_size: int | None = None, time_budget: float | None = None) -> DrainResult:
    """Drain batches (`drain_batch`) until a batch comes back short (the queue has no more due
    rows) or `time_budget` seconds (default ASSET_DRAIN_TIME_BUDGET_SECONDS) are spent. Records
    the "drain" heartbeat. Safe to run concurrently and twice (django-q2 redelivery)."""
    batch_size = batch_size or int(settings.ASSET_QUEUE_BATCH_SIZE)
    if time_budget is None:
        time_budget = float(settings.ASSET_DRAIN_TIME_BUDGET_SECONDS)
    started = time.monotonic()
    totals = dict.fromkeys(
        ("batches", "claimed", "registered", "failed", "parked", "events_written", "runs"), 0
    )
    ok = False
    try:
        while True:
            batch = drain_batch(batch_size=batch_size)
            totals["batches"] += 1
            totals["claimed"] += batch.claimed
            totals["registered"] += batch.registered
            totals["failed"] += batch.failed
            totals["parked"] += batch.parked
            totals["events_written"] += batch.events_written
            totals["runs"] += batch.runs_triggered
            if batch.claimed < batch_size or time.monotonic() - started >= time_budget:
                break
        ok = True
    finally:
        seconds = time.monotonic() - started
        heartbeats.record(component="drain", ok=ok, detail={**totals, "seconds": seconds})
    return DrainResult(
        batches=totals["batches"],
        claimed=totals["claimed"],
        registered=totals["registered"],
        failed=totals["failed"],
        parked=totals["parked"],
        events_written=totals["events_written"],
        runs_triggered=totals["runs"],
        seconds=seconds,
    )


def select_rows(
    *,
    ids: Iterable[int] | None = None,
    dag_id: str | None = None,
    parked: bool | None = None,
) -> QuerySet[AssetEventQueue]:
    """Outbox rows filtered by id, source Dag and parked-ness (None: either), oldest first."""
    queryset = AssetEventQueue.objects.all()
    if ids is not None:
        queryset = queryset.filter(id__in=list(ids))
    if dag_id is not None:
        queryset = queryset.filter(source_dag_id=dag_id)
    if parked is not None:
        queryset = queryset.filter(parked_at__isnull=not parked)
    return queryset.order_by("id")


def _targets(rows: Iterable[AssetEventQueue]) -> list[audit.Target]:
    return [audit.Target(kind="outbox_row", object_id=row.id, ti_id=row.ti_id) for row in rows]


def _dag_of(rows: list[AssetEventQueue]) -> str:
    dag_ids = {row.source_dag_id for row in rows}
    return dag_ids.pop() if len(dag_ids) == 1 else ""


def requeue(*, row_ids: Iterable[int], actor: audit.Actor | None = None) -> list[int]:
    """Make rows due now with a fresh attempt budget: attempts 0, not parked. `last_error` and
    `attempt_history` are kept as history. Own durable transaction, audited when any row was
    requeued; rows a drain holds right now are skipped (it is registering or rescheduling them).
    Returns the ids requeued."""
    asked = list(row_ids)
    with transaction.atomic(durable=True):
        rows = locks.lock_outbox_rows(
            select_rows(ids=asked).only("id", "ti_id", "source_dag_id", "parked_at")
        )
        ids = [row.id for row in rows]
        if ids:
            AssetEventQueue.objects.filter(id__in=ids).update(
                attempts=0,
                parked_at=None,
                park_reason="",
                next_attempt_at=timezone.now(),
                updated_at=timezone.now(),
            )
            metrics.incr(metrics.REQUEUED, len(ids))
            audit.record(
                actor=actor,
                action="outbox.requeue",
                summary=f"requeued outbox rows {audit.ids_text(ids)}",
                targets=_targets(rows),
                dag_id=_dag_of(rows),
                detail={"asked": len(asked), "were_parked": sum(1 for r in rows if r.parked_at)},
            )
            transaction.on_commit(_nudge)
        return ids


def park(*, row_ids: Iterable[int], actor: audit.Actor | None = None) -> list[int]:
    """Park rows that are not parked yet, so drains leave them alone. Own durable transaction,
    audited when any row was parked; rows a drain holds are skipped. Returns the ids parked."""
    with transaction.atomic(durable=True):
        rows = locks.lock_outbox_rows(
            select_rows(ids=row_ids, parked=False).only("id", "ti_id", "source_dag_id")
        )
        ids = [row.id for row in rows]
        if ids:
            who = (actor or audit.SYSTEM).name
            AssetEventQueue.objects.filter(id__in=ids).update(
                parked_at=timezone.now(),
                park_reason=f"Parked by {who}.",
                updated_at=timezone.now(),
            )
            metrics.incr(metrics.PARKED, len(ids))
            audit.record(
                actor=actor,
                action="outbox.park",
                summary=f"parked outbox rows {audit.ids_text(ids)}",
                targets=_targets(rows),
                dag_id=_dag_of(rows),
            )
        return ids


def delete_rows(*, row_ids: Iterable[int], actor: audit.Actor | None = None) -> DeleteResult:
    """Delete exactly these rows for good (their events will never be registered): the explicit
    operator action of invariant 6. Own durable transaction, audited with every row's TI so the
    run page can say who deleted its outputs; rows a drain holds are skipped."""
    with transaction.atomic(durable=True):
        rows = locks.lock_outbox_rows(select_rows(ids=row_ids))
        outlets = sum(len((row.payload or {}).get("outlets") or []) for row in rows)
        if rows:
            AssetEventQueue.objects.filter(id__in=[row.id for row in rows]).delete()
            audit.record(
                actor=actor,
                action="outbox.delete",
                summary=(
                    f"deleted outbox rows {audit.ids_text(row.id for row in rows)}: "
                    f"{outlets} declared outlet(s) will never be registered"
                ),
                targets=_targets(rows),
                dag_id=_dag_of(rows),
                detail={
                    "outlets_lost": outlets,
                    "rows": [
                        {
                            "id": row.id,
                            "dag_id": row.source_dag_id,
                            "run_id": row.source_run_id,
                            "task_id": row.source_task_id,
                            "try_number": row.try_number,
                            "last_error": first_line(row.last_error),
                        }
                        for row in rows[:200]
                    ],
                },
            )
        return DeleteResult(rows=len(rows), outlets_lost=outlets)


def _nudge() -> None:
    # Imported here: tasks imports this module.
    from . import tasks

    tasks.nudge_drain()


def _nudge_scheduler(dag_ids: Iterable[str]) -> None:
    from . import tasks

    tasks.nudge_scheduler(dag_ids=dag_ids)


@dataclass(frozen=True)
class DagBacklog:
    dag_id: str
    pending: int
    parked: int
    queued_events: int  # ADRQ rows waiting for this Dag as a target


@dataclass(frozen=True)
class QueueStatus:
    """Outbox backlog: `pending` (not parked), `due` (pending and due now), `parked`, the age of
    the oldest pending row, and per Dag (outbox rows by source Dag, ADRQ rows by target Dag)."""

    pending: int
    due: int
    parked: int
    oldest_pending_age_seconds: float | None
    queued_events: int
    by_dag: tuple[DagBacklog, ...]


def queue_status() -> QueueStatus:
    """Read-only snapshot of the outbox and ADRQ backlog: the totals are the /metrics gauges
    (`observability.queue_gauges`), plus two grouped queries per Dag. No locks."""
    gauges = observability.queue_gauges()
    per_source = {
        row["source_dag_id"]: row
        for row in AssetEventQueue.objects.order_by()
        .values("source_dag_id")
        .annotate(
            pending=Count("id", filter=Q(parked_at__isnull=True)),
            parked=Count("id", filter=Q(parked_at__isnull=False)),
        )
    }
    per_target = dict(
        AssetDagRunQueue.objects.order_by().values_list("target_dag_id").annotate(count=Count("id"))
    )
    by_dag = tuple(
        DagBacklog(
            dag_id=dag_id,
            pending=per_source.get(dag_id, {}).get("pending", 0),
            parked=per_source.get(dag_id, {}).get("parked", 0),
            queued_events=per_target.get(dag_id, 0),
        )
        for dag_id in sorted(set(per_source) | set(per_target))
    )
    return QueueStatus(
        pending=gauges.depth,
        due=gauges.due,
        parked=gauges.parked,
        oldest_pending_age_seconds=gauges.oldest_pending_age_seconds if gauges.depth else None,
        queued_events=gauges.queued_events,
        by_dag=by_dag,
    )
