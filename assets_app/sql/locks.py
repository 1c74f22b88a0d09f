"""Every row lock the service takes, in one place.

Global lock order (a transaction that takes several locks takes them in this order, and no
transaction takes a lock from an earlier step after one from a later step):

  0. Pool rows (a worker claim, issue 39): the pools that the claimable TIs of the Dags it may
     claim from name, FOR NO KEY UPDATE by name, waiting (the one wait of a claim: it
     serializes claimers of one pool, and so of one Dag, each for one short claim transaction,
     so each counts the slots and the run and task limits the one before it took;
     `lock_claim_pools`); then, in a new statement, those pools' claimable TI rows FOR UPDATE
     SKIP LOCKED (`claim_queued_task_instances`) and one UPDATE of them (that pair again while
     it comes back short with its bounded window of candidates full). Nothing else locks a
     pool row but an operator's edit or delete of one pool (a plain UPDATE/DELETE, alone in
     its transaction), and nothing that holds a TI row waits for a pool row.
  1. TaskInstance row (task_state): alone. While it is held the only other write is inserting one
     outbox row; nothing else is locked or loaded (invariant 1). `of=("self",)` always.
     Human-in-the-loop (`task_state.hitl`, issue 42): its HITLDetail row is read and written
     only under its TI's lock (Airflow's order: the TI, then the HITL row), so the park, a
     person's answer and the timeout sweep serialize per TI; one row, one write, no other lock.
  2. Outbox rows (drain): claimed FOR UPDATE SKIP LOCKED, oldest due first, in a short claim
     transaction that only stamps them (`claimed_at`); then locked again by id and stamp for the
     batch transaction (waiting, briefly, see `lock_claimed_outbox_rows`). Under them the drain
     inserts AssetEvents and then ADRQ rows sorted by (target_dag_id, asset_event_id)
     (invariant 7).
  3. Dag rows (scheduler): FOR NO KEY UPDATE SKIP LOCKED, a batch of Dags in one statement by
     dag_id, which serializes scheduling of one Dag without blocking the FOR KEY SHARE that
     ADRQ/DagRun foreign-key inserts take on it. The time scheduler (`time_scheduling`) takes
     the same lock on its batch of due Dags (`claim_due_timetable_dags`) and, under it, only
     inserts DagRuns and TIs and updates those Dag rows.
     The backfill pass (`backfills`) takes it too, with its Backfill rows in the same statement
     (`claim_active_backfills`), and under them only inserts DagRuns and TIs and updates those
     Backfill and plan rows. An operator's pause or cancel of a backfill locks that one Backfill
     row alone (`lock_backfill`, waiting briefly for a pass), then fails its queued runs and
     their TIs with plain UPDATEs; nothing locks a Backfill row after any other lock.
  4. Those Dags' ADRQ rows (scheduler): FOR UPDATE SKIP LOCKED, in one statement by
     (target_dag_id, asset_event_id); the scheduler then inserts the DagRuns, their
     consumed-event links and TIs, and deletes exactly those rows. The time scheduler takes
     the same step for its asset-and-time Dags (`lock_tick_queue_rows`, under step 3's locks
     of its batch) and then does the same writes for the ticks whose condition is met.

Registration fences (invariant 16, issue 41; `sql/fences.py`): one transaction-scoped advisory
lock per bounded Dag (`max_events_per_run`). A registering transaction (a drain batch, under its
step-2 outbox rows; an event posted to the REST door; a queue watcher's message) takes them
SHARED, in key order, before it inserts any event (`registration_sql.announce_events`); a
scheduler takes them
EXCLUSIVE for the bounded Dags of its batch between step 3 and step 4 without waiting
(`fence_dags_for_scheduling`), or waits for one Dag's as the first lock of a transaction of its
own (`wait_fence_for_scheduling`), holding nothing else while it waits.

Outside that order, alone in their own transactions: an operator's change of an asset's uri
(`lock_asset`, one Asset row, held for one UPDATE; it briefly delays a drain inserting events of
that asset, whose foreign-key check takes FOR KEY SHARE on it), and the DAG definition sync's
advisory lock
(`lock_dag_sync`), which only serializes `sync_dags` runs with each other. Under it a sync writes
Dag rows with plain UPDATEs, which wait for a scheduler holding that Dag (step 3) but never make
a scheduler wait, since schedulers skip locked Dags.

Retention (`retention`, issue 30), alone in its own short transaction per batch: the batch's
DagRun rows, then their TaskInstance rows, both FOR UPDATE SKIP LOCKED (`lock_runs_for_retention`):
it never waits, and a run or TI anyone holds (a clear, a worker) is skipped, not deleted.
A Dag's deletion (`retention.delete_dag`, `DELETE /api/v2/dags/{dag_id}`) takes the same two
steps for its run batches (`lock_runs_for_dag_deletion`: every TI, whatever its state, so that
a running one is seen under its lock), then, alone in its last short transaction, the Dag row
FOR UPDATE SKIP LOCKED (`lock_dag_for_deletion`: a scheduler holding it is not waited on; the
deletion tries again). A run's deletion (`retention.delete_dag_run`) takes the same two steps
for its one run; a TI's (`retention.delete_task_instance`) its one TI row, SKIP LOCKED, alone.
An operator's PATCH of a run (`scheduling.run_states`), alone in its own short transaction:
that run row FOR UPDATE, waiting (`lock_run`), then plain UPDATEs of its TIs, as run timeouts.

Events out (issue 29), alone in their own short transactions, never under any lock above:
webhook endpoints claimed FOR NO KEY UPDATE SKIP LOCKED (`claim_webhook_endpoints`) while
their due messages are stamped in flight, which serializes the in-flight bound of one endpoint
without blocking the FOR KEY SHARE that writing a message takes on its endpoint (registration,
a run's finish and a park never wait for delivery); no HTTP request is made under it. Freshness
policies claimed FOR UPDATE SKIP LOCKED by batch (`claim_freshness_policies`).

Run timeouts (issue 39, `scheduling.timeouts`), alone in their own short transaction per
batch: the due running DagRun rows FOR UPDATE SKIP LOCKED (`lock_timed_out_runs`: a run a
finish or another timer holds is skipped, never waited on), then plain UPDATEs of those runs
and of their unfinished TIs. That UPDATE may wait for a TI a worker holds for its state change,
which holds nothing else (step 1), so it cannot close a cycle; a worker's run finish (after its
TI commit, holding nothing) waits for the run row and then finds it no longer running.

Queue watchers (issue 28): a message's registration takes no explicit lock (its dedup row's
unique insert is the guard: a concurrent redelivery waits on that key, then writes nothing).
An operator's requeue locks the chosen parked WatcherMessage rows alone, FOR UPDATE SKIP LOCKED
by id (`lock_parked_watcher_messages`: a message a concurrent requeue holds is skipped), and
under them only inserts events and then ADRQ rows in lock order (invariant 7) and updates
those message rows.

Triggers (issue 42, `task_state.deferral`), alone in their own short transactions: a
triggerer's claim renews its leases (a plain UPDATE of the Trigger rows it holds) and then
locks live unleased Trigger rows FOR UPDATE SKIP LOCKED (`claim_triggers`) and stamps them; it
reads TI rows without locking them. A deferral inserts its Trigger row and then takes the TI
lock (step 1) with its one UPDATE; a resume (event, failure) and the timeout pass take the TI
lock with one UPDATE and touch no Trigger row; the timeout timer deletes unused Trigger rows
alone in its transaction, skipping those a claim holds (SKIP LOCKED). So nothing that holds a
TI row waits for a Trigger row, and a claim never waits for a TI.

Dag callback requests (issue 39, `task_state.dag_callbacks`), alone in their own short
transaction: a worker's claim locks due pending request rows FOR UPDATE SKIP LOCKED and stamps
their lease (`claim_dag_callbacks`); a report is one conditional UPDATE of one row. A run's
finish inserts its request (a plain INSERT, after its own conditional UPDATE of the run row);
nothing that holds another lock takes one of these rows.

Claiming work never waits (invariant 5): every claim uses SKIP LOCKED. All functions here must be
called inside a transaction; they say which rows they lock and return model instances.
"""

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple
from uuid import UUID

from django.db.models import BooleanField, Count, ExpressionWrapper, Q, QuerySet

from ..models import (
    Asset,
    AssetDagRunQueue,
    AssetEventQueue,
    Backfill,
    Dag,
    DagRun,
    DagRunState,
    FreshnessPolicy,
    FreshnessState,
    ScheduleMode,
    TaskInstance,
    TIState,
    WatcherMessage,
    WebhookEndpoint,
)
from ..models.runs import TI_FINISHED_STATES
from . import callbacks as callbacks_sql
from . import claims as claims_sql
from . import connection as connection_sql
from . import fences as fences_sql
from . import scheduling as scheduling_sql
from . import triggers as triggers_sql


def lock_task_instance(ti_id: UUID) -> TaskInstance | None:
    """Lock one TI row (waiting for a concurrent holder) and return it, or None if unknown."""
    return TaskInstance.objects.select_for_update(of=("self",)).filter(id=ti_id).first()


def lock_task_instances_to_clear(queryset: QuerySet[TaskInstance]) -> list[TaskInstance]:
    """Lock a run's finished TIs for an operator's clear, by id, skipping rows a worker holds
    (step 1 of the order, several TIs of one run: a worker only ever locks one TI, so no
    deadlock; skipping means the clear never makes a worker wait)."""
    return list(queryset.select_for_update(of=("self",), skip_locked=True).order_by("id"))


def lock_task_instances_to_set(queryset: QuerySet[TaskInstance]) -> list[TaskInstance]:
    """Lock TIs of one run for an operator's state change, by id, waiting (step 1 of the order,
    several TIs of one run: a worker only ever locks one TI and holds nothing else meanwhile,
    so no deadlock; it waits at most one worker's short state change)."""
    return list(queryset.select_for_update(of=("self",)).order_by("id"))


def lock_claim_pools(
    *, queues: Sequence[str], now: datetime, claim_timeout: timedelta
) -> list[str]:
    """Lock the pool rows that claimable TIs' tasks in `queues` name, FOR NO KEY UPDATE by name,
    waiting for a claimer that holds one (a claim transaction is short); their names
    (`claims_sql.lock_claim_pools`: the step before a worker claim's TI rows)."""
    return claims_sql.lock_claim_pools(queues=queues, now=now, expired=now - claim_timeout)


def claim_queued_task_instances(
    *,
    pools: Sequence[str],
    queues: Sequence[str],
    limit: int,
    now: datetime,
    claim_timeout: timedelta,
    bundles: Sequence[str] | None = None,
) -> claims_sql.ClaimedBatch:
    """Lock up to `limit` claimable queued TIs of tasks in `queues` and `pools` (whose rows the
    caller locked with `lock_claim_pools`), heaviest first, FOR UPDATE SKIP LOCKED, never more
    `pool_slots` than each pool has open, in one statement over a bounded window of candidates
    (`claims_sql.claim_task_instances`: the caller repeats it while it comes back short with
    its window full).

    Claimable: queued, past any retry delay, and never claimed or claimed longer ago than
    `claim_timeout` (a worker that claimed it and never started it). Order: Airflow's
    (`_executable_task_instances_to_queued`): the task's effective priority weight
    (`Task.priority_weight_total`, 1 for a TI whose task is gone) descending, then the run's
    logical date (none last, as PostgreSQL sorts Airflow's NULLs) and the map index, then
    FIFO (queued_at, id) where Airflow leaves the order open. With `bundles`, only TIs of Dags
    synced from one of those Dag bundles.
    """
    return claims_sql.claim_task_instances(
        pools=pools,
        queues=queues,
        limit=limit,
        now=now,
        expired=now - claim_timeout,
        bundles=bundles,
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
    return _dag_claim_queryset([dag_id]).first()


class ClaimedDag(NamedTuple):
    """What a scheduling pass reads of a Dag row it locked."""

    is_paused: bool
    schedule: Any  # its condition, as stored (None: manual only)
    max_active_runs: int
    schedule_error: str  # the error recorded by an earlier pass ("" when none)
    at_ticks: bool  # an asset-and-time Dag: its events are consumed by its ticks (time_scheduling)
    max_events_per_run: int | None  # None: batch; else at most this many events per run


def claim_dags_for_scheduling(dag_ids: Sequence[str]) -> dict[str, ClaimedDag]:
    """Lock the rows of those of `dag_ids` no other scheduler holds, by dag_id, in one statement
    (step 3 for a batch of Dags: SKIP LOCKED, so the order cannot make it wait). Returns a
    `ClaimedDag` per row locked, by dag_id; a Dag missing from it is held by another scheduler
    (or gone)."""
    at_ticks = ExpressionWrapper(
        Q(schedule_mode=ScheduleMode.ASSET_AND_TIME, timetable__isnull=False),
        output_field=BooleanField(),
    )
    return {
        dag_id: ClaimedDag(*fields)
        for dag_id, *fields in (
            _dag_claim_queryset(dag_ids)
            .annotate(at_ticks=at_ticks)
            .order_by("dag_id")
            .values_list(
                "dag_id",
                "is_paused",
                "schedule",
                "max_active_runs",
                "schedule_error",
                "at_ticks",
                "max_events_per_run",
            )
        )
    }


def _dag_claim_queryset(dag_ids: Sequence[str]) -> QuerySet[Dag]:
    return Dag.objects.select_for_update(no_key=True, skip_locked=True).filter(
        dag_id__in=list(dag_ids)
    )


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


QueuedGroup = scheduling_sql.QueuedGroup


def lock_dags_queue_entries(dag_ids: Sequence[str]) -> list[QueuedGroup]:
    """Lock the ADRQ rows of these Dags (whose rows the caller locked with
    `claim_dags_for_scheduling`) in the global ADRQ order (target_dag_id, asset_event_id),
    skipping locked ones, and only them, in one statement: step 4 for a batch of Dags
    (`scheduling_sql.lock_queue_groups`). Returns them grouped by Dag and asset: the asset's
    name, its newest event's timestamp, the row ids and event ids, which is all the scheduler
    reads."""
    if not dag_ids:
        return []
    return scheduling_sql.lock_queue_groups(dag_ids)


def fence_dags_for_scheduling(dag_ids: Sequence[str]) -> list[str]:
    """Take the exclusive registration fence of each of these bounded Dags (whose rows the
    caller locked, step 3) that no registration holds, without waiting; returns those a
    registration holds, to be left out (`fences_sql.try_for_scheduling`)."""
    return fences_sql.try_for_scheduling(dag_ids)


def wait_fence_for_scheduling(dag_id: str, *, timeout_seconds: float) -> bool:
    """Wait at most `timeout_seconds` for one bounded Dag's registration fence, exclusive, as
    the first lock of the caller's transaction (`fences_sql.wait_for_scheduling`)."""
    return fences_sql.wait_for_scheduling(dag_id, timeout_seconds=timeout_seconds)


# Any fixed 64-bit number; it names "the DAG definition sync" among advisory locks.
DAG_SYNC_ADVISORY_LOCK_KEY = 0x5A5D_A65C


def lock_dag_sync() -> None:
    """Take the transaction-scoped advisory lock that serializes DAG definition syncs, waiting
    for a concurrent sync to commit. Two syncs of the same new Dags would otherwise both insert
    them and the second would fail on the primary key. PostgreSQL only: SQLite serializes writers
    itself (IMMEDIATE transactions): `connection_sql.advisory_xact_lock`."""
    connection_sql.advisory_xact_lock(DAG_SYNC_ADVISORY_LOCK_KEY)


def lock_asset(asset_id: int) -> Asset | None:
    """Lock one Asset row (FOR UPDATE: its uri, a unique key, is about to change)."""
    return Asset.objects.select_for_update().filter(pk=asset_id).first()


def lock_runs_for_retention(queryset: QuerySet) -> tuple[list[int], list[UUID]]:
    """Lock the runs of `queryset` (retention's candidates, rechecked now) and all their task
    instances, skipping locked rows; a run is kept out unless every TI of it is locked and
    finished. Returns the run ids and TI ids to delete (ids: the caller deletes by key)."""
    runs = list(
        queryset.select_for_update(of=("self",), skip_locked=True)
        .order_by("id")
        .values_list("id", flat=True)
    )
    if not runs:
        return [], []
    totals = dict(
        TaskInstance.objects.filter(dag_run_id__in=runs)
        .values_list("dag_run_id")
        .annotate(n=Count("id"))
        .order_by()
    )
    locked = list(
        TaskInstance.objects.select_for_update(of=("self",), skip_locked=True)
        .filter(dag_run_id__in=runs, state__in=sorted(TI_FINISHED_STATES))
        .order_by("id")
        .values_list("id", "dag_run_id")
    )
    per_run: dict[int, int] = {}
    for _, run_id in locked:
        per_run[run_id] = per_run.get(run_id, 0) + 1
    ready = [r for r in runs if per_run.get(r, 0) == totals.get(r, 0)]
    ready_set = set(ready)
    return ready, [ti_id for ti_id, run_id in locked if run_id in ready_set]


def lock_runs_for_dag_deletion(run_ids: Sequence[int]) -> tuple[list[int], list[UUID], bool]:
    """Lock these runs and every TI of them, FOR UPDATE SKIP LOCKED (retention's order: runs,
    then TIs); a run is left out unless all its TIs were locked. Returns (run ids, TI ids,
    whether a locked TI of those runs is running)."""
    runs = list(
        DagRun.objects.select_for_update(of=("self",), skip_locked=True)
        .filter(id__in=list(run_ids))
        .order_by("id")
        .values_list("id", flat=True)
    )
    if not runs:
        return [], [], False
    totals = dict(
        TaskInstance.objects.filter(dag_run_id__in=runs)
        .values_list("dag_run_id")
        .annotate(n=Count("id"))
        .order_by()
    )
    locked = list(
        TaskInstance.objects.select_for_update(of=("self",), skip_locked=True)
        .filter(dag_run_id__in=runs)
        .order_by("id")
        .values_list("id", "dag_run_id", "state")
    )
    per_run: dict[int, int] = {}
    for _, run_id, _ in locked:
        per_run[run_id] = per_run.get(run_id, 0) + 1
    ready = {r for r in runs if per_run.get(r, 0) == totals.get(r, 0)}
    running = any(state == TIState.RUNNING for _, _, state in locked)
    return sorted(ready), [ti for ti, run_id, _ in locked if run_id in ready], running


def lock_run(*, dag_id: str, run_id: str) -> DagRun | None:
    """One run row FOR UPDATE, waiting (an operator's PATCH of it: its other holders, a finish,
    a timeout pass or a clear, hold it for one short transaction). The caller then updates the
    run's TIs with plain UPDATEs, run timeouts' order (run, then TIs)."""
    return (
        DagRun.objects.select_for_update(of=("self",)).filter(dag_id=dag_id, run_id=run_id).first()
    )


def lock_task_instance_for_deletion(ti_id: UUID) -> str | None:
    """One TI row FOR UPDATE SKIP LOCKED, alone (step 1); its state, None when a worker holds
    it right now (or it is gone)."""
    return (
        TaskInstance.objects.select_for_update(skip_locked=True)
        .filter(id=ti_id)
        .values_list("state", flat=True)
        .first()
    )


def lock_dag_for_deletion(dag_id: str) -> Dag | None:
    """The Dag row FOR UPDATE SKIP LOCKED (None: absent, or held by a scheduler now)."""
    return Dag.objects.select_for_update(skip_locked=True).filter(dag_id=dag_id).first()


# The Dag's stored next run (Airflow's `next_dagrun*`), read by the time scheduler.
TIMETABLE_NEXT_FIELDS = (
    "next_dagrun",
    "next_dagrun_data_interval_start",
    "next_dagrun_data_interval_end",
    "next_dagrun_create_after",
    "next_dagrun_computed_at",
)


def claim_due_timetable_dags(
    *, now: datetime, limit: int, exclude: Sequence[str] = ()
) -> list[Dag]:
    """Lock up to `limit` unpaused Dags with a timetable whose next run may be created by `now`
    (`next_dagrun_create_after <= now`, the `dag_next_run_due` index), earliest due first, not
    in `exclude` (those a pass has seen), skipping Dags another scheduler holds (step 3, SKIP
    LOCKED: claiming never waits). The rows are re-checked once locked, so a Dag another
    scheduler just advanced past `now` is not returned."""
    return list(
        Dag.objects.select_for_update(no_key=True, skip_locked=True)
        .filter(is_paused=False, timetable__isnull=False, next_dagrun_create_after__lte=now)
        .exclude(dag_id__in=list(exclude))
        .order_by("next_dagrun_create_after", "dag_id")
        .only(
            "dag_id",
            "timetable",
            "timezone",
            "start_date",
            "end_date",
            "catchup",
            "max_active_runs",
            "schedule",
            "schedule_mode",
            "schedule_error",
            *TIMETABLE_NEXT_FIELDS,
        )[:limit]
    )


class TickQueueRow(NamedTuple):
    """An ADRQ row the time scheduler locked for an asset-and-time tick."""

    row_id: int
    dag_id: str
    event_id: int
    timestamp: datetime
    asset_name: str


def lock_tick_queue_rows(cutoffs: Mapping[str, datetime]) -> list[TickQueueRow]:
    """Lock the ADRQ rows of these asset-and-time Dags (whose Dag rows the caller locked with
    `claim_due_timetable_dags`) whose event is at or before the Dag's cutoff (its last due
    tick), FOR UPDATE SKIP LOCKED, in the global ADRQ order (target_dag_id, asset_event_id), in
    one statement (step 4 for a batch of Dags). Rows of later events are neither locked nor
    read: they belong to a later tick."""
    if not cutoffs:
        return []
    match = Q()
    for dag_id, cutoff in sorted(cutoffs.items()):
        match |= Q(target_dag_id=dag_id, asset_event__timestamp__lte=cutoff)
    return [
        TickQueueRow(*row)
        for row in AssetDagRunQueue.objects.select_for_update(skip_locked=True, of=("self",))
        .filter(match)
        .order_by("target_dag_id", "asset_event_id")
        .values_list(
            "id", "target_dag_id", "asset_event_id", "asset_event__timestamp", "asset__name"
        )
    ]


def claim_active_backfills(
    *, ids: Sequence[int] | None, exclude: Sequence[int], limit: int
) -> list[Backfill]:
    """Lock up to `limit` unfinished, unpaused backfills of unpaused Dags (those of `ids` when
    given), oldest first, not in `exclude`, with their Dag rows, in one statement: FOR NO KEY
    UPDATE SKIP LOCKED of both (step 3: a Dag the time scheduler holds, or a backfill an
    operator is pausing, is skipped, never waited for)."""
    queryset = Backfill.objects.filter(
        completed_at__isnull=True, is_paused=False, dag__is_paused=False
    )
    if ids is not None:
        queryset = queryset.filter(pk__in=list(ids))
    return list(
        queryset.exclude(pk__in=list(exclude))
        .select_related("dag")
        .select_for_update(no_key=True, skip_locked=True, of=("self", "dag"))
        .order_by("id")[:limit]
    )


def lock_backfill(backfill_id: int) -> Backfill | None:
    """Lock one Backfill row (FOR NO KEY UPDATE, waiting for a pass that holds it: a pass is one
    short transaction) for an operator's pause or cancel; None when unknown."""
    return Backfill.objects.select_for_update(no_key=True).filter(pk=backfill_id).first()


def claim_webhook_endpoints(endpoint_ids: Sequence[int]) -> list[int]:
    """Lock these endpoints (FOR NO KEY UPDATE SKIP LOCKED, by id) for stamping their messages
    in flight; returns the ids locked (another deliverer holds the others: it serves them)."""
    return list(
        WebhookEndpoint.objects.select_for_update(no_key=True, skip_locked=True)
        .filter(id__in=list(endpoint_ids))
        .order_by("id")
        .values_list("id", flat=True)
    )


def claim_freshness_policies(
    *, after_id: int, limit: int, due_by: datetime | None = None, include_late: bool = True
) -> list[FreshnessPolicy]:
    """Lock the next `limit` freshness policies after `after_id` (FOR UPDATE SKIP LOCKED, by id),
    with their asset's name: one evaluator per policy at a time, none waiting. With `due_by`,
    only those due by then (never evaluated, or their `due_at` passed) and, with
    `include_late`, the late ones (an event may have made them fresh)."""
    queryset = FreshnessPolicy.objects.all()
    if due_by is not None:
        due = ~Q(state=FreshnessState.LATE) & (Q(due_at__isnull=True) | Q(due_at__lte=due_by))
        queryset = queryset.filter(due | Q(state=FreshnessState.LATE) if include_late else due)
    return list(
        queryset.select_for_update(of=("self",), skip_locked=True)
        .select_related("asset")
        .only(
            "id",
            "asset_id",
            "asset__name",
            "kind",
            "interval_seconds",
            "cron",
            "timezone",
            "state",
            "state_since",
            "due_at",
            "last_evaluated_at",
            "created_at",
        )
        .filter(id__gt=after_id)
        .order_by("id")[:limit]
    )


def lock_parked_watcher_messages(ids: Sequence[int]) -> list[WatcherMessage]:
    """Lock the parked queue-watcher messages among `ids`, FOR UPDATE SKIP LOCKED by id (one a
    concurrent requeue holds is left to it), with their watchers; in id order."""
    return list(
        WatcherMessage.objects.select_for_update(skip_locked=True, of=("self",))
        .select_related("watcher")
        .filter(id__in=list(ids), state="parked")
        .order_by("id")
    )


def lock_timed_out_runs(*, now: datetime, limit: int) -> list[tuple[int, str, str]]:
    """Lock up to `limit` running runs of unpaused Dags whose `timeout_at` passed (FOR UPDATE
    SKIP LOCKED of the run rows only, earliest first, through `dag_run_timeout_due`): (id,
    dag_id, run_id) of each. Inside the caller's transaction (see "Run timeouts" above)."""
    return list(
        DagRun.objects.filter(state=DagRunState.RUNNING, timeout_at__lte=now, dag__is_paused=False)
        .order_by("timeout_at", "id")
        .select_for_update(skip_locked=True, of=("self",))
        .values_list("id", "dag_id", "run_id")[:limit]
    )


def claim_triggers(
    *,
    triggerer: str,
    limit: int,
    queues: Sequence[str] | None,
    now: datetime,
    lease_until: datetime,
) -> list[int]:
    """Lease up to `limit` live triggers nobody holds to `triggerer`, FOR UPDATE SKIP LOCKED
    (`triggers_sql.claim_triggers`); their ids. Trigger rows only: see the header."""
    return triggers_sql.claim_triggers(
        triggerer=triggerer, limit=limit, queues=queues, now=now, lease_until=lease_until
    )


def renew_trigger_leases(
    *, triggerer: str, ids: Sequence[int], now: datetime, lease_until: datetime
) -> list[int]:
    """Extend `triggerer`'s leases on the live triggers of `ids` it still holds (a plain
    UPDATE of those Trigger rows, `triggers_sql.renew_leases`); their ids."""
    return triggers_sql.renew_leases(triggerer=triggerer, ids=ids, now=now, lease_until=lease_until)


def claim_dag_callbacks(
    *, claimed_by: str, limit: int, now: datetime, lease_until: datetime, max_attempts: int
) -> list[tuple[int, int]]:
    """Lease up to `limit` due Dag callback requests to `claimed_by`, FOR UPDATE SKIP LOCKED
    (`callbacks_sql.claim_due`); (id, attempt) of each. Request rows only: see the header."""
    return callbacks_sql.claim_due(
        claimed_by=claimed_by,
        limit=limit,
        now=now,
        lease_until=lease_until,
        max_attempts=max_attempts,
    )
