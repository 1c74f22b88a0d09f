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

import functools
import json
import logging
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import orjson
from django.conf import settings
from django.db import DataError, connection, transaction
from django.db.models import Count, Q, QuerySet
from django.utils import timezone

from . import (
    audit,
    exceptions,
    heartbeats,
    locks,
    metrics,
    observability,
    prepared,
    registration,
    scheduling,
)
from .models import AssetDagRunQueue, AssetEventQueue, FailureKind, MetricCounter, TaskInstance

logger = logging.getLogger(__name__)
ATTEMPT_HISTORY_KEPT = 50


def _iso(moment: datetime | None) -> str:
    return moment.isoformat() if moment is not None else "an unknown time"


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
) -> int:
    """Insert the outbox row for this TI try and return its id. Runs inside the caller's
    transaction (the one that sets success) so the state change and the row commit together.

    One INSERT; the (ti_id, try_number) unique constraint refuses a second row for the same try.
    On PostgreSQL the statement also counts the row (`outbox_enqueued`, one counter shard chosen
    by the TI id) in the same transaction, and the payload is encoded once with orjson and
    passed as jsonb text: the ORM's JSON encoding and a separate counter upsert after commit
    were a third of the request's cost (bench/success_breakdown.py).
    """
    payload = build_payload(ti=ti, outlets=outlets, outlet_events=outlet_events, end_date=end_date)
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
    if connection.vendor != "postgresql":
        row.save(force_insert=True)
        metrics.incr(metrics.ENQUEUED)
        return row.id
    sql, fields = _enqueue_sql()
    now = timezone.now()
    row.created_at = row.updated_at = row.next_attempt_at = now
    params = [
        _json_text(payload)
        if f.attname == "payload"
        else f.get_db_prep_save(getattr(row, f.attname), connection)
        for f in fields
    ]
    with prepared.cursor() as cursor:
        cursor.execute(sql, [*params, metrics.ENQUEUED, ti.id.int % metrics.SHARDS])
        return cursor.fetchone()[0]


def _json_text(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # an integer beyond 64 bits in an event's extra: the stdlib has no limit
        return json.dumps(value)


@functools.cache
def _enqueue_sql() -> tuple[str, list[Any]]:
    """INSERT of every concrete column (defaults filled in by the model instance, so a column
    added later needs no change here) plus the counter upsert, as one statement."""
    fields = [f for f in AssetEventQueue._meta.concrete_fields if not f.primary_key]
    table = AssetEventQueue._meta.db_table
    counters = MetricCounter._meta.db_table
    columns = ", ".join(f'"{f.column}"' for f in fields)
    values = ", ".join("%s::jsonb" if f.attname == "payload" else "%s" for f in fields)
    sql = (
        f'WITH row AS (INSERT INTO "{table}" ({columns}) VALUES ({values}) RETURNING id), '
        f'counted AS (INSERT INTO "{counters}" (name, shard, value) SELECT %s, %s, 1 FROM row '
        f'ON CONFLICT (name, shard) DO UPDATE SET value = "{counters}".value + excluded.value) '
        "SELECT id FROM row"
    )
    return sql, fields


@dataclass(frozen=True)
class BatchResult:
    """One drain batch: rows claimed, registered (deleted), failed (rescheduled or parked).

    `failed` and `parked` include attempts found dead at the claim (see `DrainDied`); `chunked`
    counts rows of which only a chunk was registered (they stay due for the next batch); `more`
    says due rows were left for the next batch."""

    claimed: int
    registered: int
    failed: int
    parked: int
    events_written: int
    dag_ids: frozenset[str]
    runs_triggered: int
    chunked: int = 0
    more: bool = False


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


class DrainDied(Exception):
    """The attempt that claimed a row never ended: its drain died while registering it (the
    cluster's task timeout, a killed process, a lost database connection). Recorded like any
    failure when a later drain finds the row (`_record_failure`), so a row that always kills its
    drain is parked after ASSET_QUEUE_MAX_ATTEMPTS."""


DRAIN_DIED_TYPE = f"{DrainDied.__module__}.{DrainDied.__qualname__}"
# A drain commits a row's `claimed_at` and locks the row again a moment later for its attempt
# (a new transaction); a claimed row that no drain holds and that was claimed longer ago than
# this lost its drain. Far above that moment, and short, since it delays a dead attempt's retry.
CLAIM_GRACE_SECONDS = 2.0


def _before_commit(rows: list[AssetEventQueue]) -> None:
    """Runs last inside the batch transaction. A seam for crash tests (raise here to simulate a
    process dying after registration and before commit)."""


def _connection_unusable(exc: BaseException) -> bool:
    """Can the batch transaction go on after `exc` (raised in, or while leaving, a savepoint)?

    A terminated session surfaces in several ways, depending on where the termination caught
    the drain: an error with a connection-class SQLSTATE (08xxx, or 57P01-57P03 "terminating
    connection"), a client-side psycopg OperationalError without SQLSTATE ("server closed the
    connection unexpectedly", "consuming input failed"), a ROLLBACK TO SAVEPOINT that fails
    (Django then marks the transaction `needs_rollback`), or a connection psycopg has already
    marked closed. Any of these, or a connection that does not answer `SELECT 1`, means no
    per-row retry can run: the caller lets the error through and the whole transaction rolls
    back."""
    if connection.needs_rollback or connection.closed_in_transaction:
        return True
    raw = connection.connection
    if raw is None or getattr(raw, "closed", False) or getattr(raw, "broken", False):
        return True
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        sqlstate = getattr(error, "sqlstate", None)
        if sqlstate and (sqlstate.startswith("08") or sqlstate in {"57P01", "57P02", "57P03"}):
            return True
        if (
            sqlstate is None
            and type(error).__module__.startswith("psycopg")
            and type(error).__name__ == "OperationalError"
        ):
            return True
        error = error.__cause__ or error.__context__
    return not connection.is_usable()


@dataclass(frozen=True)
class _Claim:
    stamp: datetime
    row_ids: list[int]
    more: bool
    died: int
    parked: int


def _claim(*, limit: int, outlet_budget: int) -> _Claim:
    """Phase 1 of a batch, its own short durable transaction: record the attempts that died,
    then pick the batch and commit its `claimed_at`, so that the attempt is known even if it
    dies with its drain.

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
            parked += _record_failure(row, error, now=now)
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
            alone = weight > outlet_budget or row.last_error_type == DRAIN_DIED_TYPE
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
    return _Claim(stamp=now, row_ids=ids, more=more, died=len(abandoned), parked=parked)


def _settle(
    rows: list[AssetEventQueue],
    results: list[registration.RegistrationResult],
    windows: list[tuple[int, int]],
) -> int:
    """Delete the rows registered to their end; keep the place of the others (a chunk of a big
    row) and release their claim. Inside the batch transaction. Returns the rows deleted."""
    finished = []
    for row, result, (_, stop) in zip(rows, results, windows, strict=True):
        if result.emissions <= stop:
            finished.append(row.id)
        else:
            AssetEventQueue.objects.filter(id=row.id).update(registered_count=stop, claimed_at=None)
    if finished:
        AssetEventQueue.objects.filter(id__in=finished).delete()
    return len(finished)


def drain_batch(*, batch_size: int | None = None) -> BatchResult:
    """Register one batch: claim it (`_claim`, its own transaction), then register it in one
    durable transaction and run the scheduler for the Dags it queued events for.

    Work per transaction is bounded by outlets, not rows: a batch holds at most
    `ASSET_QUEUE_BATCH_OUTLETS` outlets (and at most `batch_size` rows), and a row with more is
    registered in chunks of that many events, one batch each, keeping its place in
    `registered_count` (committed with each chunk's events; the events' idempotency keys make a
    repeated chunk write nothing). Between chunks the row is unlocked, so an operator can park it.

    Locks: the batch's outbox rows again (FOR UPDATE, only those this claim stamped; claiming
    itself never waits), so concurrent drains never double-register. The whole batch is registered
    in one savepoint with set-based queries (a fixed number of queries whatever the batch size);
    if that fails, each row is retried in its own savepoint so one poison row only fails itself,
    unless the transaction itself is lost (`_connection_unusable`): then the error goes up and
    everything rolls back, the claims staying behind for the next drain to count.
    """
    batch_size = batch_size or int(settings.ASSET_QUEUE_BATCH_SIZE)
    budget = int(settings.ASSET_QUEUE_BATCH_OUTLETS)
    claim = _claim(limit=batch_size, outlet_budget=budget)
    if not claim.row_ids:
        return BatchResult(
            0, 0, claim.died, claim.parked, 0, frozenset(), 0, more=claim.more or claim.died > 0
        )
    with transaction.atomic(durable=True):
        now = timezone.now()
        rows = locks.lock_claimed_outbox_rows(ids=claim.row_ids, claimed_at=claim.stamp)
        if not rows:
            return BatchResult(0, 0, claim.died, claim.parked, 0, frozenset(), 0, more=True)
        registration.check_constraints_immediately()
        windows = [(row.registered_count, row.registered_count + budget) for row in rows]
        results: list[registration.RegistrationResult] = []
        failures: list[tuple[AssetEventQueue, Exception]] = []
        try:
            with transaction.atomic():
                results = registration.register_payloads(
                    payloads=[row.payload for row in rows], windows=windows
                )
                done = _settle(rows, results, windows)
        except Exception as exc:
            if _connection_unusable(exc):
                raise
            results = []
            done = 0
            for row, window in zip(rows, windows, strict=True):
                try:
                    with transaction.atomic():
                        (result,) = registration.register_payloads(
                            payloads=[row.payload], windows=[window]
                        )
                        finished = _settle([row], [result], [window])
                    results.append(result)
                    done += finished
                except Exception as row_exc:
                    if _connection_unusable(row_exc):
                        raise
                    logger.warning("outbox row %s failed: %s", row.id, _error_text(row_exc))
                    failures.append((row, row_exc))
        parked = sum(_record_failure(row, exc, now=now) for row, exc in failures)
        if failures:
            AssetEventQueue.objects.filter(id__in=[row.id for row, _ in failures]).update(
                claimed_at=None
            )
        chunked = len(results) - done
        metrics.incr(metrics.REGISTERED, done)
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
        registered=done,
        failed=len(failures) + claim.died,
        parked=parked + claim.parked,
        events_written=sum(result.events_written for result in results),
        dag_ids=dag_ids,
        runs_triggered=len(runs.run_ids) if runs else 0,
        chunked=chunked,
        more=claim.more or chunked > 0,
    )


class _Pacer:
    """Keeps success answers ahead of registration during a burst, without starving the drain.

    Rule: before a batch, the drain yields (sleeps, in steps of YIELD_STEP_SECONDS) while
    successes arrive faster than ASSET_DRAIN_YIELD_ABOVE_PER_SECOND and wait undrained (outbox
    rows enqueued in the last YIELD_WINDOW_SECONDS that no drain has tried: one count on the
    `outbox_due` index), but never longer in a row than ASSET_DRAIN_YIELD_MAX_SECONDS, and after
    yielding it works at least as long as it yielded before it may yield again. So the drain
    keeps at least half of its time whatever the load (a sustained overload halves its pace, it
    never stops it). When the drain keeps up (the end-to-end 50/s: each row is drained ~0.1 s
    after it arrives, ~5 rows in the window) it never waits. Either setting 0 turns it off.

    Why arrivals: a request's database time is a small part of it (most is Python, and on a
    saturated machine, waiting for a core), so busy sessions in `pg_stat_activity` did not show
    a saturated web tier; a burst does show as rows arriving faster than they are drained."""

    def __init__(self, *, started: float) -> None:
        self.rate = float(settings.ASSET_DRAIN_YIELD_ABOVE_PER_SECOND)
        self.max_yield = float(settings.ASSET_DRAIN_YIELD_MAX_SECONDS)
        self.owed_work = 0.0  # seconds of work owed before the next yield
        self.work_started = started

    def wait_while_busy(self, *, deadline: float) -> float:
        if self.rate <= 0 or self.max_yield <= 0:
            return 0.0
        if time.monotonic() - self.work_started < self.owed_work:
            return 0.0
        started = time.monotonic()
        limit = min(self.max_yield, deadline - started)
        slept = False
        while time.monotonic() - started < limit and _undrained_arrival_rate() > self.rate:
            time.sleep(YIELD_STEP_SECONDS)
            slept = True
        if not slept:
            return 0.0
        yielded = time.monotonic() - started
        self.owed_work = yielded
        self.work_started = time.monotonic()
        return yielded


YIELD_WINDOW_SECONDS = 0.5
YIELD_STEP_SECONDS = 0.05


def _undrained_arrival_rate() -> float:
    """Successes per second over the last YIELD_WINDOW_SECONDS that are still waiting: outbox
    rows enqueued since then that no drain has tried (a new row is due when it is enqueued)."""
    since = timezone.now() - timedelta(seconds=YIELD_WINDOW_SECONDS)
    count = AssetEventQueue.objects.filter(
        parked_at__isnull=True, next_attempt_at__gt=since, attempts=0, claimed_at__isnull=True
    ).count()
    return count / YIELD_WINDOW_SECONDS


def drain(*, batch_size: int | None = None, time_budget: float | None = None) -> DrainResult:
    """Drain batches (`drain_batch`) until one says no due rows are left or `time_budget`
    seconds (default ASSET_DRAIN_TIME_BUDGET_SECONDS) are spent (then, with rows left, it nudges
    a fresh drain task), yielding to a burst of successes before each batch (`_Pacer`).
    Records the "drain" heartbeat. Safe to run concurrently and twice (django-q2 redelivery)."""
    batch_size = batch_size or int(settings.ASSET_QUEUE_BATCH_SIZE)
    if time_budget is None:
        time_budget = float(settings.ASSET_DRAIN_TIME_BUDGET_SECONDS)
    started = time.monotonic()
    totals = dict.fromkeys(
        ("batches", "claimed", "registered", "failed", "parked", "events_written", "runs"), 0
    )
    yielded = 0.0
    ok = False
    pacer = _Pacer(started=started)
    try:
        while True:
            yielded += pacer.wait_while_busy(deadline=started + time_budget)
            batch = drain_batch(batch_size=batch_size)
            totals["batches"] += 1
            totals["claimed"] += batch.claimed
            totals["registered"] += batch.registered
            totals["failed"] += batch.failed
            totals["parked"] += batch.parked
            totals["events_written"] += batch.events_written
            totals["runs"] += batch.runs_triggered
            if not batch.more:
                break
            if time.monotonic() - started >= time_budget:
                # Out of budget with due rows left (a burst's backlog, a chunked row): hand
                # over to a fresh drain task now rather than leave them to the next success's
                # nudge or the one-minute sweep (nudges coalesce: at most one waits).
                _nudge()
                break
        ok = True
    finally:
        seconds = time.monotonic() - started
        detail = {**totals, "seconds": seconds, "yielded_seconds": yielded}
        heartbeats.record(component="drain", ok=ok, detail=detail)
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
                claimed_at=None,
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
