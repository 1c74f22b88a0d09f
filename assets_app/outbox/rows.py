"""The asset event outbox (`AssetEventQueue`): enqueue, claim, retry, park, requeue.

Payload of a row (JSON): `payloads.OutboxPayload`, everything registration needs even after
the TI is deleted (the outlets as the worker declared them, the TI try they come from).

The drain (`outbox/drain.py`) claims due rows FOR UPDATE SKIP LOCKED (`claim_batch`), registers
their payloads (`registration`) and deletes them in the same transaction, so a crash anywhere rolls
both back and the row is retried (invariant 3). A row that fails is rescheduled with capped
exponential backoff and full jitter and parked after `ASSET_QUEUE_MAX_ATTEMPTS` (invariant 6,
`record_failure`).

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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DataError, transaction
from django.db.models import Count, Q, QuerySet
from django.utils import timezone

from ..cluster import nudges
from ..events_out import webhooks
from ..guards import exceptions
from ..models import AssetDagRunQueue, AssetEventQueue, FailureKind, TaskInstance
from ..operations import audit, metrics, observability
from ..registration import payloads
from ..registration.payloads import AssetProfile, JsonDict
from ..sql import locks
from ..sql import outbox as outbox_sql

logger = logging.getLogger(__name__)
ATTEMPT_HISTORY_KEPT = 50


def _iso(moment: datetime | None) -> str:
    return moment.isoformat() if moment is not None else "an unknown time"


def enqueue(
    *,
    ti: TaskInstance,
    outlets: list[AssetProfile],
    outlet_events: list[JsonDict],
    end_date: datetime,
) -> int:
    """Insert the outbox row for this TI try and return its id. Runs inside the caller's
    transaction (the one that sets success) so the state change and the row commit together.

    One INSERT; the (ti_id, try_number) unique constraint refuses a second row for the same try.
    On PostgreSQL the statement also counts the row (`outbox_enqueued`, one counter shard chosen
    by the TI id) in the same transaction, and the payload is encoded once with orjson and
    passed as jsonb text: the ORM's JSON encoding and a separate counter upsert after commit
    were a third of the request's cost (bench/success_breakdown.py).
    """
    payload = payloads.build(ti=ti, outlets=outlets, outlet_events=outlet_events, end_date=end_date)
    row = AssetEventQueue(
        ti_id=ti.id,
        try_number=ti.try_number,
        source_dag_id=ti.dag_id,
        source_run_id=ti.run_id,
        source_task_id=ti.task_id,
        source_map_index=ti.map_index,
        payload=payload,
        outlet_count=len(outlets) + len(outlet_events),
    )
    if not outbox_sql.insert_outbox_row(
        row, counter=metrics.ENQUEUED, shard=ti.id.int % metrics.SHARDS
    ):
        metrics.incr(metrics.ENQUEUED)
    return row.id


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


def error_text(exc: BaseException) -> str:
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


def record_failure(row: AssetEventQueue, exc: Exception, *, now: datetime) -> bool:
    """Reschedule or park one failed row (inside the batch transaction, row locked), after
    `classify_failure`: a permanent error parks at once with its reason; a transient one backs
    off and parks after ASSET_QUEUE_MAX_ATTEMPTS. Appends the attempt to `attempt_history`.
    Returns True if the row is now parked."""
    failure = classify_failure(exc)
    row.attempts += 1
    row.last_error = error_text(exc)[:10_000]
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


class DrainDied(Exception):
    """The attempt that claimed a row never ended: its drain died while registering it (the
    cluster's task timeout, a killed process, a lost database connection). Recorded like any
    failure when a later drain finds the row (`record_failure`), so a row that always kills its
    drain is parked after ASSET_QUEUE_MAX_ATTEMPTS."""


DRAIN_DIED_TYPE = f"{DrainDied.__module__}.{DrainDied.__qualname__}"
# `last_error_type` is stored: a row whose drain died before issue 37 moved this module (from
# `assets_app/outbox.py`) holds the old name and is still taken alone.
DRAIN_DIED_TYPES = frozenset({DRAIN_DIED_TYPE, "assets_app.outbox.DrainDied"})
# A drain commits a row's `claimed_at` and locks the row again a moment later for its attempt
# (a new transaction); a claimed row that no drain holds and that was claimed longer ago than
# this lost its drain. Far above that moment, and short, since it delays a dead attempt's retry.
CLAIM_GRACE_SECONDS = 2.0


@dataclass(frozen=True)
class Claim:
    stamp: datetime
    row_ids: list[int]
    more: bool
    died: int
    parked: int


def claim_batch(*, limit: int, outlet_budget: int) -> Claim:
    """Phase 1 of a drain batch (`drain.drain_batch`), its own short durable transaction:
    record the attempts that died, then pick the batch and commit its `claimed_at`, so that the
    attempt is known even if it dies with its drain.

    Locks (FOR UPDATE SKIP LOCKED, `locks.claim_due_outbox_rows`) are held only for this
    transaction. Rows are taken oldest due first while their outlets fit in `outlet_budget`
    (at least one row); a row with more outlets than that, and a row whose last attempt died,
    is taken alone (a row that kills its drain cannot take other rows' attempts with it). A dead
    attempt's row is due again at once: it is counted and parked after the maximum attempts
    like any failure, but a single death (a redeploy, a killed cluster) should not delay it.
    """
    with transaction.atomic(durable=True):
        now = timezone.now()
        abandoned = locks.claim_abandoned_outbox_rows(
            claimed_before=now - timedelta(seconds=CLAIM_GRACE_SECONDS)
        )
        parked = 0
        for row in abandoned:
            error = DrainDied(
                f"the drain registering this row (claimed at {_iso(row.claimed_at)}) "
                "died before its transaction ended: task timeout, killed process or lost "
                "database connection"
            )
            logger.warning("outbox row %s: %s", row.id, error)
            parked += record_failure(row, error, now=now)
        # The `outbox.parked` webhook messages of those parked now, in this transaction.
        webhooks.write_outbox_parked([row for row in abandoned if row.parked_at], now=now)
        if abandoned:
            metrics.incr(metrics.FAILED_ATTEMPTS, len(abandoned))
            metrics.incr(metrics.PARKED, parked)
            AssetEventQueue.objects.filter(id__in=[row.id for row in abandoned]).update(
                claimed_at=None
            )
            AssetEventQueue.objects.filter(
                id__in=[row.id for row in abandoned if row.parked_at is None]
            ).update(next_attempt_at=now)
        candidates = locks.claim_due_outbox_rows(limit=limit, now=now)
        taken: list[AssetEventQueue] = []
        used = 0
        more = len(candidates) == limit
        for row in candidates:
            weight = max(1, row.outlet_count - row.registered_count)
            alone = weight > outlet_budget or row.last_error_type in DRAIN_DIED_TYPES
            if taken and (alone or used + weight > outlet_budget):
                more = True
                break
            taken.append(row)
            used += weight
            if alone:
                more = more or len(candidates) > 1
                break
        ids = [row.id for row in taken]
        if ids:
            AssetEventQueue.objects.filter(id__in=ids).update(claimed_at=now)
    return Claim(stamp=now, row_ids=ids, more=more, died=len(abandoned), parked=parked)


# --- a claimed batch's rows (drain.drain_batch, inside its batch transaction) ------------------


def settle(rows: Sequence[AssetEventQueue], *, ends: Sequence[tuple[int, int]]) -> int:
    """After `rows` were registered, per row up to (emissions of its payload, end of the window
    registered) in `ends`: delete the rows registered to their end; keep the place of the
    others (a chunk of a big row) and release their claim. Inside the batch transaction, so
    the deletes commit with the events (invariant 3). Returns the rows deleted."""
    finished = []
    for row, (emissions, stop) in zip(rows, ends, strict=True):
        if emissions <= stop:
            finished.append(row.id)
        else:
            AssetEventQueue.objects.filter(id=row.id).update(registered_count=stop, claimed_at=None)
    if finished:
        AssetEventQueue.objects.filter(id__in=finished).delete()
    return len(finished)


def release_claims(row_ids: Sequence[int]) -> None:
    """Clear the claim of these rows (their failure recorded by `record_failure`), so the next
    drain takes them when they are due: one UPDATE, in the caller's transaction."""
    AssetEventQueue.objects.filter(id__in=list(row_ids)).update(claimed_at=None)


def count_untried_since(since: datetime) -> int:
    """Outbox rows enqueued after `since` that no drain has tried (a new row is due when it is
    enqueued): one count on the `outbox_due` index, for the drain's pacer."""
    return AssetEventQueue.objects.filter(
        parked_at__isnull=True, next_attempt_at__gt=since, attempts=0, claimed_at__isnull=True
    ).count()


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
                claimed_at=None,
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
            nudges.drain_on_commit()
        return ids


def park(*, row_ids: Iterable[int], actor: audit.Actor | None = None) -> list[int]:
    """Park rows that are not parked yet, so drains leave them alone. Own durable transaction,
    audited when any row was parked; rows a drain holds are skipped. Returns the ids parked."""
    with transaction.atomic(durable=True):
        rows = locks.lock_outbox_rows(select_rows(ids=row_ids, parked=False).defer("payload"))
        ids = [row.id for row in rows]
        if ids:
            who = (actor or audit.SYSTEM).name
            now = timezone.now()
            AssetEventQueue.objects.filter(id__in=ids).update(
                parked_at=now,
                park_reason=f"Parked by {who}.",
                claimed_at=None,
                updated_at=now,
            )
            for row in rows:
                row.park_reason = f"Parked by {who}."
            webhooks.write_outbox_parked(rows, now=now)
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
    per_source: dict[str, dict[str, int]] = {
        row["source_dag_id"]: {"pending": row["pending"], "parked": row["parked"]}
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
