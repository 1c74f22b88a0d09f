"""The drain: registers the outbox's rows in batches, after the web tier's successes.

A drain (`drain`, the django-q2 task `tasks.drain`, nudged on each success and swept every
minute) runs batches (`drain_batch`) until none is left or its time budget
(ASSET_DRAIN_TIME_BUDGET_SECONDS) is spent, yielding to a burst of successes before each batch
(`_Pacer`). A batch claims due rows (`outbox.claim_batch`: at most ASSET_QUEUE_BATCH_SIZE rows
and ASSET_QUEUE_BATCH_OUTLETS outlets), registers their payloads (`registration`) and deletes
them in the same transaction, so a crash anywhere rolls both back and the row is retried
(invariant 3); a row that fails is rescheduled or parked (`outbox.record_failure`, invariant 6).
After each batch commits, the drain runs the scheduler for the Dags that batch queued events for
(DESIGN 7: one django-q2 pickup fewer than nudging a scheduler task).

The outbox rows themselves (enqueue, claim, settle after registration, release claims, retry,
park, requeue, reads) are `outbox/rows.py`'s: the drain writes none itself.
"""

import logging
import time
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from ..cluster import nudges
from ..events_out import webhooks
from ..models import AssetEventQueue
from ..operations import heartbeats, metrics
from ..registration import outlets as registration
from ..scheduling import asset_runs as scheduling
from ..sql import locks
from . import rows as outbox

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchResult:
    """One drain batch: rows claimed, registered (deleted), failed (rescheduled or parked).

    `failed` and `parked` include attempts found dead at the claim (see `outbox.DrainDied`);
    `chunked` counts rows of which only a chunk was registered (they stay due for the next
    batch); `more` says due rows were left for the next batch."""

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


def _ends(
    results: list[registration.RegistrationResult], windows: list[tuple[int, int]]
) -> list[tuple[int, int]]:
    """(emissions of the row's payload, end of the window registered) per row, for
    `outbox.settle`."""
    return [(result.emissions, stop) for result, (_, stop) in zip(results, windows, strict=True)]


def drain_batch(*, batch_size: int | None = None, outlet_budget: int | None = None) -> BatchResult:
    """Register one batch: claim it (`outbox.claim_batch`, its own transaction), then register
    it in one durable transaction and run the scheduler for the Dags it queued events for.

    Work per transaction is bounded by outlets, not rows: a batch holds at most
    `outlet_budget` (default `ASSET_QUEUE_BATCH_OUTLETS`) outlets and at most `batch_size`
    rows, and a row with more is registered in chunks of that many events, one batch each,
    keeping its place in `registered_count` (committed with each chunk's events; the events'
    idempotency keys make a repeated chunk write nothing). Between chunks the row is unlocked,
    so an operator can park it.

    Locks: the batch's outbox rows again (FOR UPDATE, only those this claim stamped; claiming
    itself never waits), so concurrent drains never double-register. The whole batch is registered
    in one savepoint with set-based queries (a fixed number of queries whatever the batch size);
    if that fails, each row is retried in its own savepoint so one poison row only fails itself,
    unless the transaction itself is lost (`_connection_unusable`): then the error goes up and
    everything rolls back, the claims staying behind for the next drain to count.
    """
    batch_size = batch_size or int(settings.ASSET_QUEUE_BATCH_SIZE)
    budget = outlet_budget or int(settings.ASSET_QUEUE_BATCH_OUTLETS)
    claim = outbox.claim_batch(limit=batch_size, outlet_budget=budget)
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
                done = outbox.settle(rows, ends=_ends(results, windows))
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
                        finished = outbox.settle([row], ends=_ends([result], [window]))
                    results.append(result)
                    done += finished
                except Exception as row_exc:
                    if _connection_unusable(row_exc):
                        raise
                    logger.warning("outbox row %s failed: %s", row.id, outbox.error_text(row_exc))
                    failures.append((row, row_exc))
        parked_rows = [row for row, exc in failures if outbox.record_failure(row, exc, now=now)]
        parked = len(parked_rows)
        # Their `outbox.parked` webhook messages, in this transaction (one statement, if any).
        webhooks.write_outbox_parked(parked_rows, now=now)
        if failures:
            outbox.release_claims([row.id for row, _ in failures])
        chunked = len(results) - done
        metrics.incr(metrics.REGISTERED, done)
        metrics.incr(metrics.FAILED_ATTEMPTS, len(failures))
        metrics.incr(metrics.PARKED, parked)
        _before_commit(rows)
    dag_ids = frozenset(dag_id for result in results for dag_id in result.dag_ids)
    runs = scheduling.schedule_nudged(dag_ids=sorted(dag_ids)) if dag_ids else None
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


class _Ramp:
    """Outlets per batch: a drain's first batch takes 1/RAMP_START_DIVISOR of
    ASSET_QUEUE_BATCH_OUTLETS, and each batch after it twice the one before, up to the whole.

    Why: the first success of a burst nudges a drain before the burst shows in the arrival rate
    (`_Pacer` counts the last YIELD_WINDOW_SECONDS), and a full batch (5,000 outlets, about a
    second of the drain and its PostgreSQL backend on a loaded machine) would then run beside
    the answers before the pacer looks again. A short first batch lets the pacer see the burst
    within a fraction of a second; a backlog with no arrivals reaches full batches by the fourth.
    After a yield the drain starts small again, since the burst may not be over."""

    def __init__(self) -> None:
        self.full = int(settings.ASSET_QUEUE_BATCH_OUTLETS)
        self.current = 0

    def next(self, *, yielded: bool) -> int:
        start = max(1, self.full // RAMP_START_DIVISOR)
        if yielded or self.current == 0:
            self.current = start
        else:
            self.current = min(self.full, self.current * 2)
        return self.current


RAMP_START_DIVISOR = 8
YIELD_WINDOW_SECONDS = 0.5
YIELD_STEP_SECONDS = 0.05


def _undrained_arrival_rate() -> float:
    """Successes per second over the last YIELD_WINDOW_SECONDS that are still waiting: outbox
    rows enqueued since then that no drain has tried (a new row is due when it is enqueued)."""
    since = timezone.now() - timedelta(seconds=YIELD_WINDOW_SECONDS)
    return outbox.count_untried_since(since) / YIELD_WINDOW_SECONDS


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
    ramp = _Ramp()
    try:
        while True:
            waited = pacer.wait_while_busy(deadline=started + time_budget)
            yielded += waited
            batch = drain_batch(batch_size=batch_size, outlet_budget=ramp.next(yielded=waited > 0))
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
                nudges.nudge_drain()
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
