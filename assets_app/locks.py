"""Every row lock the service takes, in one place.

Global lock order (a transaction that takes several locks takes them in this order, and no
transaction takes a lock from an earlier step after one from a later step):

  1. TaskInstance row (task_state): alone. While it is held the only other write is inserting one
     outbox row; nothing else is locked or loaded (invariant 1). `of=("self",)` always.
  2. Outbox rows (drain): claimed FOR UPDATE SKIP LOCKED, oldest due first, in a short claim
     transaction that only stamps them (`claimed_at`); then locked again by id and stamp for the
     batch transaction (waiting, briefly, see `lock_claimed_outbox_rows`). Under them the drain
     inserts AssetEvents and then ADRQ rows sorted by (target_dag_id, asset_event_id)
     (invariant 7).
  3. Dag row (scheduler): FOR NO KEY UPDATE SKIP LOCKED, which serializes scheduling of one Dag
     without blocking the FOR KEY SHARE that ADRQ/DagRun foreign-key inserts take on it.
  4. That Dag's ADRQ rows (scheduler): FOR UPDATE SKIP LOCKED, by asset_event_id; the scheduler
     then inserts the DagRun, its consumed-event links and TIs, and deletes exactly those rows.

Outside that order, alone in their own transactions: an operator's change of an asset's uri
(`lock_asset`, one Asset row, held for one UPDATE; it briefly delays a drain inserting events of
that asset, whose foreign-key check takes FOR KEY SHARE on it), and the DAG definition sync's
advisory lock
(`lock_dag_sync`), which only serializes `sync_dags` runs with each other. Under it a sync writes
Dag rows with plain UPDATEs, which wait for a scheduler holding that Dag (step 3) but never make
a scheduler wait, since schedulers skip locked Dags.

Claiming work never waits (invariant 5): every claim uses SKIP LOCKED. All functions here must be
called inside a transaction; they say which rows they lock and return model instances.
"""

from collections.abc import Sequence
from datetime import datetime, timedelta
from uuid import UUID

from django.db import connection
from django.db.models import Count, IntegerField, Q, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce

from .models import (
    Asset,
    AssetDagRunQueue,
    AssetEventQueue,
    Dag,
    DagRun,
    TaskInstance,
    TIState,
)


def lock_task_instance(ti_id: UUID) -> TaskInstance | None:
    """Lock one TI row (waiting for a concurrent holder) and return it, or None if unknown."""
    return TaskInstance.objects.select_for_update(of=("self",)).filter(id=ti_id).first()


def lock_task_instances_to_clear(queryset: QuerySet[TaskInstance]) -> list[TaskInstance]:
    """Lock a run's finished TIs for an operator's clear, by id, skipping rows a worker holds
    (step 1 of the order, several TIs of one run: a worker only ever locks one TI, so no
    deadlock; skipping means the clear never makes a worker wait)."""
    return list(queryset.select_for_update(of=("self",), skip_locked=True).order_by("id"))


def claim_queued_task_instances(
    *, limit: int, now: datetime, claim_timeout: timedelta
) -> list[TaskInstance]:
    """Lock up to `limit` claimable queued TIs, FIFO, skipping rows another claim holds.

    Claimable: queued, past any retry delay, and never claimed or claimed longer ago than
    `claim_timeout` (a worker that claimed it and never started it).
    """
    return list(
        TaskInstance.objects.select_for_update(of=("self",), skip_locked=True)
        .filter(state=TIState.QUEUED)
        .filter(Q(retry_at__isnull=True) | Q(retry_at__lte=now))
        .filter(Q(claimed_at__isnull=True) | Q(claimed_at__lt=now - claim_timeout))
        .order_by("queued_at", "id")[:limit]
    )


def claim_due_outbox_rows(*, limit: int, now: datetime) -> list[AssetEventQueue]:
    """Lock up to `limit` due, unparked, unclaimed outbox rows, oldest due first, skipping
    locked ones. Their payloads are not read (the drain's claim only sizes the batch)."""
    return list(
        AssetEventQueue.objects.select_for_update(skip_locked=True)
        .filter(parked_at__isnull=True, claimed_at__isnull=True, next_attempt_at__lte=now)
        .defer("payload")
        .order_by("next_attempt_at", "id")[:limit]
    )


def claim_abandoned_outbox_rows(
    *, claimed_before: datetime, limit: int = 100
) -> list[AssetEventQueue]:
    """Lock up to `limit` unparked rows a drain claimed before `claimed_before` and no drain
    holds now (SKIP LOCKED): their attempt died with its drain. Payloads are not read."""
    return list(
        AssetEventQueue.objects.select_for_update(skip_locked=True)
        .filter(parked_at__isnull=True, claimed_at__lt=claimed_before)
        .defer("payload")
        .order_by("claimed_at", "id")[:limit]
    )


def lock_claimed_outbox_rows(*, ids: Sequence[int], claimed_at: datetime) -> list[AssetEventQueue]:
    """Lock, for registration, those of `ids` that are still claimed by the claim stamped
    `claimed_at` and not parked, by id.

    This one waits (no SKIP LOCKED): another drain's claim transaction may hold these rows for
    a moment without taking them (PostgreSQL keeps the lock of a row a SKIP LOCKED scan locked
    and then rejected on re-checking its condition, until that transaction ends). Skipping them
    would leave our claim behind and the rows would look abandoned. The wait is short and
    cannot be part of a cycle: claim transactions never wait, and a row is re-claimed by another
    drain only after no drain held it for the claim's grace (it is then re-checked here and
    dropped)."""
    return list(
        AssetEventQueue.objects.select_for_update()
        .filter(id__in=list(ids), claimed_at=claimed_at, parked_at__isnull=True)
        .order_by("id")
    )


def lock_outbox_rows(queryset: QuerySet[AssetEventQueue]) -> list[AssetEventQueue]:
    """Lock the given outbox rows for an operator action (requeue / park / delete), by id.

    Rows a drain is registering right now are skipped: the drain deletes or reschedules them
    itself, and an operator action must not wait on it.
    """
    return list(queryset.select_for_update(skip_locked=True).order_by("id"))


def claim_dag_for_scheduling(dag_id: str) -> Dag | None:
    """Lock a Dag row for scheduling, or None if another scheduler holds it (or it is gone)."""
    return _dag_claim_queryset(dag_id).first()


def _dag_claim_queryset(dag_id: str) -> QuerySet[Dag]:
    return Dag.objects.select_for_update(no_key=True, skip_locked=True).filter(dag_id=dag_id)


def lock_dag_queue_rows(
    dag_id: str, *, asset_ids: Sequence[int] | None = None
) -> list[AssetDagRunQueue]:
    """Lock a Dag's ADRQ rows (optionally only for some assets), by event id, skipping locked."""
    queryset = AssetDagRunQueue.objects.select_for_update(skip_locked=True).filter(
        target_dag_id=dag_id
    )
    if asset_ids is not None:
        queryset = queryset.filter(asset_id__in=asset_ids)
    return list(queryset.order_by("asset_event_id"))


def lock_asset_queue_rows(asset_id: int) -> list[AssetDagRunQueue]:
    """Lock one asset's ADRQ rows for every Dag (an operator clear), in the global ADRQ order
    (target_dag_id, asset_event_id), skipping locked ones."""
    return list(
        AssetDagRunQueue.objects.select_for_update(skip_locked=True)
        .filter(asset_id=asset_id)
        .order_by("target_dag_id", "asset_event_id")
    )


def lock_dag_queue_entries(dag_id: str) -> list[tuple[int, int, datetime, str]]:
    """`lock_dag_queue_rows` for the scheduler's hot path: the same rows, locks (only the ADRQ
    rows: `of=("self",)`) and order, as (id, asset_event_id, event timestamp, asset name)
    tuples, which is all the scheduler reads, in one query."""
    return list(
        AssetDagRunQueue.objects.select_for_update(skip_locked=True, of=("self",))
        .filter(target_dag_id=dag_id)
        .order_by("asset_event_id")
        .values_list("id", "asset_event_id", "asset_event__timestamp", "asset__name")
    )


def lock_dag_queue_entries_and_active_runs(
    dag_id: str, *, active_states: Sequence[str]
) -> tuple[list[tuple[int, int, datetime, str]], int]:
    """`lock_dag_queue_entries` and the Dag's number of runs in `active_states`, in one statement.

    Call it after `claim_dag_for_scheduling`: the count is read with this statement's snapshot,
    taken once the Dag lock is held, so it includes every run another scheduler committed before
    it released that lock (max_active_runs holds under concurrency; a count read in the Dag lock
    statement itself would use a snapshot from before the lock). With no unlocked rows the count
    is not read and 0 is returned: there is nothing to schedule anyway.
    """
    return _split_active(list(_queue_entries_and_active_runs_queryset(dag_id, active_states)))


def _queue_entries_and_active_runs_queryset(
    dag_id: str, active_states: Sequence[str]
) -> QuerySet[AssetDagRunQueue]:
    active = (
        DagRun.objects.filter(dag_id=dag_id, state__in=active_states)
        .order_by()
        .values("dag_id")
        .annotate(count=Count("*"))
        .values("count")
    )
    return (
        AssetDagRunQueue.objects.select_for_update(skip_locked=True, of=("self",))
        .filter(target_dag_id=dag_id)
        .annotate(active=Coalesce(Subquery(active, output_field=IntegerField()), Value(0)))
        .order_by("asset_event_id")
        .values_list("id", "asset_event_id", "asset_event__timestamp", "asset__name", "active")
    )


def _split_active(
    rows: Sequence[tuple[int, int, datetime, str, int]],
) -> tuple[list[tuple[int, int, datetime, str]], int]:
    if not rows:
        return [], 0
    return [row[:4] for row in rows], rows[0][4]


class _CompiledQuery:
    """A queryset compiled to SQL once and then run with another value in place of
    `placeholder` (every parameter equal to it). Rows come back through the same converters the
    ORM applies (dates, JSON), so they are what the queryset's values_list would return. Bound to
    the calling thread's connection: use it in one thread."""

    def __init__(self, queryset: QuerySet, placeholder: str) -> None:
        self._compiler = queryset.query.get_compiler(queryset.db)
        self._placeholder = placeholder
        # Compiled on the first call: compiling SELECT ... FOR UPDATE requires a transaction.
        self._sql: str | None = None

    def _compile(self) -> None:
        self._sql, params = self._compiler.as_sql()
        self._params = list(params)
        self._slots = [i for i, p in enumerate(self._params) if p == self._placeholder]
        assert self._slots, "the placeholder is not a parameter of the compiled statement"
        selected = [column[0] for column in self._compiler.select[: self._compiler.col_count]]
        self._converters = self._compiler.get_converters(selected)

    def rows(self, value: object) -> list[tuple]:
        if self._sql is None:
            self._compile()
        params = list(self._params)
        for slot in self._slots:
            params[slot] = value
        with self._compiler.connection.cursor() as cursor:
            cursor.execute(self._sql, params)
            rows = cursor.fetchall()
        if self._converters:
            return [tuple(row) for row in self._compiler.apply_converters(rows, self._converters)]
        return rows


# A Dag id that no Dag can have (it is longer than the column), standing for the one to lock.
_ANY_DAG = "\x00" * 1000


class SchedulingLocks:
    """`claim_dag_for_scheduling` and `lock_dag_queue_entries_and_active_runs` for one scheduler
    pass: the same statements, locks and order, built and compiled once per pass rather than
    once per Dag (building querysets and model instances was most of the scheduler's client
    CPU). Use one instance per pass, on one connection; call its methods inside the Dag's
    transaction, in this order, as for the functions."""

    def __init__(self, *, active_states: Sequence[str]) -> None:
        self._claim = _CompiledQuery(
            _dag_claim_queryset(_ANY_DAG).values_list(
                "is_paused", "schedule", "max_active_runs", "schedule_error"
            ),
            _ANY_DAG,
        )
        self._entries = _CompiledQuery(
            _queue_entries_and_active_runs_queryset(_ANY_DAG, active_states), _ANY_DAG
        )

    def claim_dag(self, dag_id: str) -> tuple[bool, object, int, str] | None:
        """`claim_dag_for_scheduling`, as (is_paused, schedule, max_active_runs,
        schedule_error), or None."""
        rows = self._claim.rows(dag_id)
        return rows[0] if rows else None

    def lock_queue_entries_and_active_runs(
        self, dag_id: str
    ) -> tuple[list[tuple[int, int, datetime, str]], int]:
        """`lock_dag_queue_entries_and_active_runs` (call it after `claim_dag`)."""
        return _split_active(self._entries.rows(dag_id))


# Any fixed 64-bit number; it names "the DAG definition sync" among advisory locks.
DAG_SYNC_ADVISORY_LOCK_KEY = 0x5A5D_A65C


def lock_dag_sync() -> None:
    """Take the transaction-scoped advisory lock that serializes DAG definition syncs, waiting
    for a concurrent sync to commit. Two syncs of the same new Dags would otherwise both insert
    them and the second would fail on the primary key. PostgreSQL only: SQLite serializes writers
    itself (IMMEDIATE transactions)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [DAG_SYNC_ADVISORY_LOCK_KEY])


def lock_asset(asset_id: int) -> Asset | None:
    """Lock one Asset row (FOR UPDATE: its uri, a unique key, is about to change)."""
    return Asset.objects.select_for_update().filter(pk=asset_id).first()
