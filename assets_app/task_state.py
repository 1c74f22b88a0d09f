"""Worker-facing task instance state changes: start, succeed, finish, retry, heartbeat, claim.

This module owns the TI row lock (`locks.lock_task_instance`, `of=("self",)`). While it is held a
function only reads the TI and writes its new state (invariant 1): the SELECT ... FOR UPDATE, one
UPDATE, then COMMIT, whatever the number of outlets or consumed events. A success in queue mode
takes the lock with its conditional UPDATE itself (UPDATE, then COMMIT) and inserts its outbox row
in the same transaction just before (see `_succeed_queued`), so the payload's size never
lengthens the hold. Everything else happens after the commit, without
the lock:

- the DagRun follows its TIs in its own short statement (conditional UPDATE, no lock): `running`
  when a TI starts, `success` / `failed` once every TI is finished (failed if any TI is `failed`
  or `upstream_failed`). Because each finishing TI checks after its own commit, the last one to
  commit always sees all the others finished. That follow-up (downstream evaluation, then the
  run's finish) is `dependencies.after_ti_finished`, imported here under its name.
- the run context of `start` is loaded with a fixed number of queries (invariant 9).

One try per token (invariant 12): every function takes the `try_number` the worker's token was
issued for and refuses any other try than the TI's current one with `StaleTry` (HTTP 409,
`stale_try`), writing nothing. The check compares the row already read under the lock (start,
finish, retry), or sits in the conditional UPDATE's WHERE (success, heartbeat) and explains a
miss from the row read anyway, so it adds no statement under the TI lock. It comes before the
replay rule: a success of try 1 arriving after try 2 started is stale, never a "replay" of try 2.

Idempotency (invariant 4): a replayed start from the same hostname/unixname/pid while running, a
replayed success of a TI already in success, and a replayed failed/skipped/... of a TI already in
that state return "replayed" and write nothing. Any other transition from a non-running TI raises
`InvalidState` with `previous_state` (HTTP 409) and writes nothing.

Retries: `retry` follows Airflow's eligibility rule (`max_tries != 0 and try_number <= max_tries`).
An eligible TI goes straight back to `queued` with `try_number + 1`, `retry_at = now + delay`
(the body's `retry_delay_seconds`, else its task's delay and backoff, `retry_delay_for`) and
its claim cleared, so
workers claim it again after the delay; an ineligible one becomes `failed`. A TI is therefore
never left in `up_for_retry`, so a replayed retry request finds it queued and gets 409.
"""

import hashlib
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import OuterRef, Q, Subquery, TextField
from django.db.models.functions import Cast
from django.utils import timezone

from . import (
    dependencies,
    exceptions,
    locks,
    nudges,
    outbox,
    payloads,
    registration,
    xcoms,
)
from .dependencies import after_ti_finished  # one home; `task_state.after_ti_finished` for callers
from .models import (
    AssetAliasEvent,
    AssetEvent,
    Dag,
    DagRun,
    DagRunState,
    Task,
    TaskInstance,
    TaskReschedule,
    TIState,
)
from .models.dags import DEFAULT_RETRY_DELAY_SECONDS
from .models.runs import fresh_try_values
from .payloads import AssetProfile, JsonDict
from .sql import task_instances as task_instances_sql

# Airflow's `[core] max_task_retry_delay` default: the cap of an exponential backoff.
MAX_RETRY_DELAY_SECONDS = 24 * 60 * 60

TERMINAL_NON_SUCCESS = frozenset(
    {TIState.FAILED, TIState.SKIPPED, TIState.REMOVED, TIState.UPSTREAM_FAILED}
)


@dataclass(frozen=True, slots=True)
class ConsumedEvent:
    """A consumed asset event as the run context shows it: the event's fields, its asset's
    name, uri and extra, and the names of the aliases it was emitted through (sorted).

    The two extras are the JSON text the database stores (a JSON object), not decoded: the
    worker API passes them through, and decoding thousands only to encode them again was a
    third of the response time."""

    id: int
    asset_name: str
    asset_uri: str
    asset_extra_json: str
    extra_json: str
    source_task_id: str | None
    source_dag_id: str | None
    source_run_id: str | None
    source_map_index: int | None
    timestamp: datetime
    source_alias_names: tuple[str, ...]


@dataclass(frozen=True)
class RunContext:
    """What `start` returns: the TI as it is now, its DagRun and the run's consumed events,
    oldest first."""

    ti: TaskInstance
    dag_run: DagRun
    consumed_events: list[ConsumedEvent]
    should_retry: bool
    replayed: bool
    # XCom keys an earlier try of this TI pushed (the SDK clears them before running again) and
    # how often this try was rescheduled (a sensor in reschedule mode).
    xcom_keys_to_clear: list[str] = field(default_factory=list)
    task_reschedule_count: int = 0


@dataclass(frozen=True)
class StateChange:
    """What succeed / finish / retry did. `replayed`: the TI was already in the requested state
    and nothing was written."""

    ti_id: UUID
    state: str
    replayed: bool
    try_number: int


@dataclass(frozen=True)
class Workload:
    """A claimed TI and the outlets its Task declares (`{"name", "uri", "type": "Asset"}` or
    `{"name", "type": "AssetAlias"}`)."""

    ti: TaskInstance
    task_outlets: list[dict[str, Any]] = field(default_factory=list)
    # Where the Dag's file is, relative to its folder (Dag.fileloc; "" for JSON definitions).
    dag_rel_path: str = ""


def _not_found(ti_id: UUID) -> exceptions.NotFound:
    return exceptions.NotFound(f"task instance {ti_id} not found")


def _not_running(ti: TaskInstance, action: str) -> exceptions.InvalidState:
    return exceptions.InvalidState(
        f"task instance is {ti.state}, not running, so it cannot be {action}",
        previous_state=ti.state,
    )


def _check_try(ti: TaskInstance, try_number: int) -> None:
    if ti.try_number != try_number:
        raise exceptions.StaleTry.of(ti_id=ti.id, token_try=try_number, current_try=ti.try_number)


def _is_eligible_to_retry(*, try_number: int, max_tries: int) -> bool:
    return max_tries != 0 and try_number <= max_tries


# --- DagRun follows its TIs (after the TI commit, no locks) -----------------------------------


def _mark_run_running(dag_run_id: int, *, now: datetime) -> None:
    DagRun.objects.filter(id=dag_run_id, state=DagRunState.QUEUED).update(
        state=DagRunState.RUNNING, start_date=now
    )


# --- start ------------------------------------------------------------------------------------


def start(
    *,
    ti_id: UUID,
    try_number: int,
    hostname: str,
    unixname: str,
    pid: int,
    start_date: datetime,
) -> RunContext:
    """queued -> running, then load the run context.

    Transaction: one durable transaction holding the TI lock for SELECT FOR UPDATE + UPDATE.
    A replay (running, same hostname/unixname/pid) writes nothing and returns the context again.
    After the commit: the DagRun becomes running (if queued) and the context is loaded with a
    fixed number of queries (DagRun; events + assets; aliases).
    """
    now = timezone.now()
    with transaction.atomic(durable=True):
        ti = locks.lock_task_instance(ti_id)
        if ti is None:
            raise _not_found(ti_id)
        _check_try(ti, try_number)
        previous_state = ti.state
        replayed = previous_state == TIState.RUNNING and (ti.hostname, ti.unixname, ti.pid) == (
            hostname,
            unixname,
            pid,
        )
        if not replayed:
            if previous_state != TIState.QUEUED:
                raise exceptions.InvalidState(
                    "TI was not in a state where it could be marked as running",
                    previous_state=previous_state,
                )
            ti.state = TIState.RUNNING
            ti.hostname = hostname
            ti.unixname = unixname
            ti.pid = pid
            ti.start_date = start_date
            ti.end_date = None
            ti.last_heartbeat_at = now
            ti.save(
                update_fields=[
                    "state",
                    "hostname",
                    "unixname",
                    "pid",
                    "start_date",
                    "end_date",
                    "last_heartbeat_at",
                    "updated_at",
                ]
            )
    if not replayed:
        _mark_run_running(ti.dag_run_id, now=now)
    return load_run_context(ti=ti, replayed=replayed)


def load_run_context(*, ti: TaskInstance, replayed: bool = False) -> RunContext:
    """Load the run context of a TI: 3 queries whatever the number of consumed events (DagRun;
    consumed events joined with their assets; their source aliases). No lock, no transaction.

    The events are read as value rows, not model instances: a run may have consumed thousands
    (5,000 AssetEvents with their assets and prefetched aliases took ~300 ms to build), and
    their extras stay JSON text (see `ConsumedEvent`)."""
    dag_run = DagRun.objects.get(id=ti.dag_run_id)
    aliases: dict[int, list[str]] = {}
    for event_id, alias_name in (
        AssetAliasEvent.objects.filter(asset_event__consumed_links__dag_run_id=dag_run.id)
        .order_by("asset_event_id", "alias__name")
        .values_list("asset_event_id", "alias__name")
    ):
        aliases.setdefault(event_id, []).append(alias_name)
    rows = (
        AssetEvent.objects.filter(consumed_links__dag_run_id=dag_run.id)
        .annotate(asset_extra_json=Cast("asset__extra", TextField()))
        .annotate(extra_json=Cast("extra", TextField()))
        .order_by("timestamp", "id")
        .values_list(
            "id",
            "asset__name",
            "asset__uri",
            "asset_extra_json",
            "extra_json",
            "source_task_id",
            "source_dag_id",
            "source_run_id",
            "source_map_index",
            "timestamp",
        )
    )
    events = [ConsumedEvent(*row, tuple(aliases.get(row[0], ()))) for row in rows]
    return RunContext(
        ti=ti,
        dag_run=dag_run,
        consumed_events=events,
        should_retry=_is_eligible_to_retry(try_number=ti.try_number, max_tries=ti.max_tries),
        replayed=replayed,
        xcom_keys_to_clear=xcoms.keys_of(ti),
        task_reschedule_count=TaskReschedule.objects.filter(
            ti_id=ti.id, try_number=ti.try_number
        ).count(),
    )


# --- success ----------------------------------------------------------------------------------


def succeed(
    *,
    ti_id: UUID,
    try_number: int,
    end_date: datetime,
    task_outlets: list[AssetProfile],
    outlet_events: list[JsonDict],
) -> StateChange:
    """running -> success, handing the outlets to registration.

    `queue` mode (default): one durable transaction: read the TI, INSERT its outbox row
    (`outbox.enqueue`), then one conditional UPDATE that locks and re-checks it, commit; the drain
    is nudged on commit.
    `inline` mode (`ASSET_REGISTRATION_MODE`, read at call time): one durable transaction that
    first registers the events (`registration.register_payload`, before the lock), then locks and
    re-checks the TI; if it is no longer running the whole transaction rolls back. After the
    commit the scheduler is nudged for the Dags that got queued events.
    Either way a TI already in success (same try) returns `replayed=True` and nothing is written;
    a TI at another try than `try_number` raises `StaleTry`.
    """
    succeed_in_mode = (
        _succeed_inline if settings.ASSET_REGISTRATION_MODE == "inline" else _succeed_queued
    )
    change = succeed_in_mode(
        ti_id=ti_id,
        try_number=try_number,
        end_date=end_date,
        task_outlets=task_outlets,
        outlet_events=outlet_events,
    )
    return change


def _set_success(ti: TaskInstance, *, end_date: datetime) -> None:
    ti.state = TIState.SUCCESS
    ti.end_date = end_date
    ti.save(update_fields=["state", "end_date", "updated_at"])


def _succeed_queued(
    *,
    ti_id: UUID,
    try_number: int,
    end_date: datetime,
    task_outlets: list[AssetProfile],
    outlet_events: list[JsonDict],
) -> StateChange:
    """Read the TI, insert the outbox row, then take the lock with the state change itself.

    The outbox INSERT carries the whole payload (100 KB for 1,000 outlets, compressed by
    PostgreSQL as it is stored), so it runs before the lock. The lock is then taken by one
    conditional UPDATE (running, same try -> success), which waits for a concurrent holder and
    re-checks its condition on the row it finds: the hold is that UPDATE and COMMIT. It is still
    one transaction with the outbox row (invariant 2): if the UPDATE matches nothing (the TI left
    `running` or was retried meanwhile), everything rolls back. A concurrent success of the same
    try waits on the outbox row's (ti_id, try_number) unique index and then fails with an
    IntegrityError. Both are answered from the committed state (replay or 409).

    On PostgreSQL the three statements are plain SQL built once (`_read_task_instance`,
    `outbox.enqueue`, `_set_success_if_running`): building them with the ORM on every request
    was most of the request's CPU (bench/success_breakdown.py).
    """
    try:
        with transaction.atomic(durable=True):
            seen = _read_task_instance(ti_id)
            if seen is None:
                raise _not_found(ti_id)
            # The UPDATE below matches `seen.try_number` only: the token's try is checked here.
            if seen.state != TIState.RUNNING or seen.try_number != try_number:
                return _replay_or_conflict(seen, try_number=try_number, action="marked success")
            outbox.enqueue(
                ti=seen, outlets=task_outlets, outlet_events=outlet_events, end_date=end_date
            )
            if not _set_success_if_running(ti=seen, end_date=end_date):
                raise _ChangedUnderUs(_read_task_instance(ti_id))
            nudges.drain_on_commit()
    except _ChangedUnderUs as changed:
        if changed.ti is None:
            raise _not_found(ti_id) from None
        return _replay_or_conflict(changed.ti, try_number=try_number, action="marked success")
    except IntegrityError:
        current = TaskInstance.objects.filter(id=ti_id).first()
        if current is None:
            raise _not_found(ti_id) from None
        return _replay_or_conflict(current, try_number=try_number, action="marked success")
    after_ti_finished(seen)
    return StateChange(ti_id=seen.id, state=seen.state, replayed=False, try_number=seen.try_number)


class _ChangedUnderUs(Exception):
    """The TI left `running` between the unlocked read and the lock: roll back the outbox row.
    Carries the TI as the transaction sees it after the locking UPDATE (None: deleted)."""

    def __init__(self, ti: TaskInstance | None) -> None:
        super().__init__(ti.state if ti is not None else "deleted")
        self.ti = ti


def _read_task_instance(ti_id: UUID) -> TaskInstance | None:
    """The TI, unlocked (`task_instances_sql.read_task_instance`: the SELECT built once on
    PostgreSQL)."""
    return task_instances_sql.read_task_instance(ti_id)


def _set_success_if_running(*, ti: TaskInstance, end_date: datetime) -> bool:
    """running (same try) -> success in one UPDATE, which takes the TI row lock (invariant 1:
    the lock covers this statement and COMMIT). Updates `ti` and returns True when it matched;
    False when the TI is no longer running that try. Runs inside the caller's transaction."""
    now = timezone.now()
    matched = task_instances_sql.set_success_if_running(
        ti_id=ti.id, try_number=ti.try_number, end_date=end_date, now=now
    )
    if matched:
        ti.state, ti.end_date, ti.updated_at = TIState.SUCCESS, end_date, now
    return bool(matched)


def _replay_or_conflict(ti: TaskInstance, *, try_number: int, action: str) -> StateChange:
    """A success for a TI that is not running that try: another try is stale (409); a replay
    (already success, same try) writes nothing and is answered 200; any other state is a 409."""
    _check_try(ti, try_number)
    if ti.state == TIState.SUCCESS:
        return StateChange(ti_id=ti.id, state=ti.state, replayed=True, try_number=ti.try_number)
    raise _not_running(ti, action)


def _succeed_inline(
    *,
    ti_id: UUID,
    try_number: int,
    end_date: datetime,
    task_outlets: list[AssetProfile],
    outlet_events: list[JsonDict],
) -> StateChange:
    with transaction.atomic(durable=True):
        registration.check_constraints_immediately()
        # Unlocked read: the payload's source fields, and a cheap refusal before registering.
        ti = TaskInstance.objects.filter(id=ti_id).first()
        if ti is None:
            raise _not_found(ti_id)
        if ti.state != TIState.RUNNING or ti.try_number != try_number:
            return _replay_or_conflict(ti, try_number=try_number, action="marked success")
        registered = registration.register_payload(
            payload=payloads.build(
                ti=ti, outlets=task_outlets, outlet_events=outlet_events, end_date=end_date
            )
        )
        locked = locks.lock_task_instance(ti_id)
        if locked is None:
            raise _not_found(ti_id)
        if locked.try_number != try_number:  # rolls back the events registered above
            raise exceptions.StaleTry.of(
                ti_id=ti_id, token_try=try_number, current_try=locked.try_number
            )
        if locked.state == TIState.SUCCESS and locked.try_number == ti.try_number:
            # A concurrent success of the same try won: drop the events we registered.
            transaction.set_rollback(True)
            return StateChange(
                ti_id=locked.id, state=locked.state, replayed=True, try_number=locked.try_number
            )
        if locked.state != TIState.RUNNING or locked.try_number != ti.try_number:
            raise _not_running(locked, "marked success")
        _set_success(locked, end_date=end_date)
        if registered.dag_ids:
            # No drain runs in this mode, so the scheduler hears about the new ADRQ rows here.
            nudges.scheduler_on_commit(dag_ids=registered.dag_ids)
    after_ti_finished(locked)
    return StateChange(
        ti_id=locked.id, state=locked.state, replayed=False, try_number=locked.try_number
    )


# --- failed / skipped / removed / upstream_failed ----------------------------------------------


def finish(*, ti_id: UUID, try_number: int, state: str, end_date: datetime) -> StateChange:
    """running -> a terminal state other than success. Lock, check, one UPDATE, commit; then the
    DagRun may finish. A TI already in `state` is a replay (nothing written)."""
    if state not in TERMINAL_NON_SUCCESS:
        raise exceptions.InvalidInput(f"{state!r} is not a terminal non-success state")
    with transaction.atomic(durable=True):
        ti = locks.lock_task_instance(ti_id)
        if ti is None:
            raise _not_found(ti_id)
        _check_try(ti, try_number)
        if ti.state == state:
            return StateChange(ti_id=ti.id, state=ti.state, replayed=True, try_number=ti.try_number)
        if ti.state != TIState.RUNNING:
            raise _not_running(ti, f"marked {state}")
        ti.state = state
        ti.end_date = end_date
        ti.save(update_fields=["state", "end_date", "updated_at"])
    after_ti_finished(ti)
    return StateChange(ti_id=ti.id, state=ti.state, replayed=False, try_number=ti.try_number)


# --- up_for_retry -------------------------------------------------------------------------------


def retry(
    *,
    ti_id: UUID,
    try_number: int,
    end_date: datetime,
    retry_delay_seconds: float | None = None,
) -> StateChange:
    """running -> queued again (try_number + 1, claimable after the delay) while retries remain,
    else failed (and its downstream evaluated). The delay is the body's `retry_delay_seconds`
    when given, else the task's (`retry_delay`) with its exponential backoff
    (`retry_delay_for`). The task's policy is read before the lock (one unlocked query); then
    lock, check, one UPDATE, commit (see the module docstring)."""
    policy = None if retry_delay_seconds is not None else _retry_policy(ti_id)
    now = timezone.now()
    with transaction.atomic(durable=True):
        ti = locks.lock_task_instance(ti_id)
        if ti is None:
            raise _not_found(ti_id)
        _check_try(ti, try_number)
        if ti.state != TIState.RUNNING:
            raise _not_running(ti, "marked up_for_retry")
        changed = _requeue_or_fail(
            ti, now=now, end_date=end_date, delay=retry_delay_seconds, policy=policy
        )
        ti.save(update_fields=changed)
    if ti.state == TIState.FAILED:
        after_ti_finished(ti)
    return StateChange(ti_id=ti.id, state=ti.state, replayed=False, try_number=ti.try_number)


@dataclass(frozen=True)
class RetryPolicy:
    """A task's retry delay settings (Airflow's `retry_delay`, `retry_exponential_backoff` (a
    multiplier; 0 or 1 = constant), `max_retry_delay`) and what the backoff hash reads."""

    delay_seconds: float = DEFAULT_RETRY_DELAY_SECONDS
    backoff: float = 0.0
    max_delay_seconds: float | None = None
    logical_date: datetime | None = None


def _retry_policy(ti_id: UUID) -> RetryPolicy:
    """The TI's task's retry policy, unlocked, one query (defaults for a TI whose task is gone)."""
    task = Task.objects.filter(dag_id=OuterRef("dag_id"), task_id=OuterRef("task_id"))
    row = (
        TaskInstance.objects.filter(id=ti_id)
        .annotate(
            delay=Subquery(task.values("retry_delay_seconds")[:1]),
            backoff=Subquery(task.values("retry_exponential_backoff")[:1]),
            max_delay=Subquery(task.values("max_retry_delay_seconds")[:1]),
        )
        .values_list("delay", "backoff", "max_delay", "dag_run__logical_date", named=True)
        .first()
    )
    if row is None or row.delay is None:
        return RetryPolicy(logical_date=row.dag_run__logical_date if row else None)
    return RetryPolicy(
        delay_seconds=row.delay,
        backoff=row.backoff,
        max_delay_seconds=row.max_delay,
        logical_date=row.dag_run__logical_date,
    )


def retry_delay_for(*, policy: RetryPolicy, dag_id: str, task_id: str, try_number: int) -> float:
    """Seconds before try `try_number + 1` may start, by Airflow's rule (`next_retry_datetime`):
    the task's delay; with a backoff multiplier m (not 0 or 1), a deterministic value between
    ceil(delay * m ** (try_number - 1)) (at least 1) and twice that, from a hash of the TI,
    capped at 24 h and at `max_delay_seconds`."""
    delay = float(policy.delay_seconds)
    multiplier = policy.backoff or 1.0
    if multiplier != 1.0 and multiplier > 0:
        try:
            min_backoff = math.ceil(delay * multiplier ** (try_number - 1))
        except OverflowError:
            min_backoff = MAX_RETRY_DELAY_SECONDS
        min_backoff = max(min_backoff, 1)
        key = f"{dag_id}#{task_id}#{policy.logical_date}#{try_number}".encode()
        ti_hash = int(hashlib.sha1(key, usedforsecurity=False).hexdigest(), 16)
        delay = float(min(min_backoff + ti_hash % min_backoff, MAX_RETRY_DELAY_SECONDS))
        if policy.max_delay_seconds:
            delay = min(float(policy.max_delay_seconds), delay)
    return delay


def _requeue_or_fail(
    ti: TaskInstance,
    *,
    now: datetime,
    end_date: datetime,
    delay: float | None,
    policy: RetryPolicy | None,
) -> list[str]:
    """Set a running TI's failed try to queued again (next try, claimable after the delay) when
    it has tries left, else failed. No query; the caller saves it under the TI lock, with the
    fields returned (`update_fields`: a hot row's save writes only what changed)."""
    if _is_eligible_to_retry(try_number=ti.try_number, max_tries=ti.max_tries):
        if delay is None:
            delay = retry_delay_for(
                policy=policy or RetryPolicy(),
                dag_id=ti.dag_id,
                task_id=ti.task_id,
                try_number=ti.try_number,
            )
        ti.state = TIState.QUEUED
        ti.try_number += 1
        fresh = fresh_try_values(queued_at=now, retry_at=now + timedelta(seconds=delay))
        for name, value in fresh.items():
            setattr(ti, name, value)
        return ["state", "try_number", *fresh, "updated_at"]
    ti.state = TIState.FAILED
    ti.end_date = end_date
    return ["state", "end_date", "updated_at"]


# --- workers that died ------------------------------------------------------------------------


@dataclass(frozen=True)
class HeartbeatSweep:
    """TIs the heartbeat-timeout sweep found dead: retried (queued again) and failed."""

    retried: tuple[UUID, ...]
    failed: tuple[UUID, ...]


def fail_dead_task_instances(*, limit: int = 500) -> HeartbeatSweep:
    """Running TIs whose heartbeat stopped for `TASK_HEARTBEAT_TIMEOUT_SECONDS` (read at call
    time; Airflow's `task_instance_heartbeat_timeout`, 300 s) are failed, or retried when they
    have tries left (with their task's retry delay), as a worker's `up_for_retry` would; a
    failed one's downstream is then evaluated. Each TI in its own short transaction: its lock,
    re-checked still running with the same try and stale heartbeat, one UPDATE, commit. The
    dead worker's late heartbeat or success then finds it not running: 409, nothing written."""
    now = timezone.now()
    cutoff = now - timedelta(seconds=float(settings.TASK_HEARTBEAT_TIMEOUT_SECONDS))
    stale = list(
        TaskInstance.objects.filter(state=TIState.RUNNING, last_heartbeat_at__lt=cutoff)
        .order_by("last_heartbeat_at")
        .values_list("id", "try_number")[:limit]
    )
    retried: list[UUID] = []
    failed: list[UUID] = []
    for ti_id, try_number in stale:
        policy = _retry_policy(ti_id)
        with transaction.atomic(durable=True):
            ti = locks.lock_task_instance(ti_id)
            if (
                ti is None
                or ti.state != TIState.RUNNING
                or ti.try_number != try_number
                or ti.last_heartbeat_at is None
                or ti.last_heartbeat_at >= cutoff
            ):
                continue
            changed = _requeue_or_fail(ti, now=now, end_date=now, delay=None, policy=policy)
            ti.save(update_fields=changed)
        if ti.state == TIState.FAILED:
            failed.append(ti.id)
            after_ti_finished(ti)
        else:
            retried.append(ti.id)
    return HeartbeatSweep(retried=tuple(retried), failed=tuple(failed))


# --- skip-downstream --------------------------------------------------------------------------


# Airflow's skip-downstream leaves TIs that are executing or finished this way alone.
_NOT_SKIPPABLE = (TIState.RUNNING, TIState.SUCCESS, TIState.FAILED)


def skip_downstream(*, ti_id: UUID, try_number: int, tasks: list[tuple[str, int]]) -> int:
    """A branching TI skips tasks of its run (Airflow's `PATCH .../skip-downstream`): those of
    `tasks` ((task_id, map_index)) not running, success or failed become skipped, in one
    conditional UPDATE (autocommit; the TI's own row is not locked: it only names the run).
    Then, as after any finish, their downstream are evaluated and the run may finish. Returns
    how many TIs were skipped; replaying it skips nothing more. Unknown TI: NotFound; another
    try than the token's: StaleTry (checked on the row it reads anyway)."""
    source = (
        TaskInstance.objects.filter(id=ti_id).values("dag_run_id", "dag_id", "try_number").first()
    )
    if source is None:
        raise _not_found(ti_id)
    if source["try_number"] != try_number:
        raise exceptions.StaleTry.of(
            ti_id=ti_id, token_try=try_number, current_try=source["try_number"]
        )
    wanted = sorted(set(tasks))
    if not wanted:
        return 0
    now = timezone.now()
    keys = Q()
    for task_id, map_index in wanted:
        keys |= Q(task_id=task_id, map_index=map_index)
    count = (
        TaskInstance.objects.filter(keys, dag_run_id=source["dag_run_id"])
        .exclude(state__in=_NOT_SKIPPABLE)
        .exclude(state=TIState.SKIPPED)
        .update(state=TIState.SKIPPED, start_date=now, end_date=now, updated_at=now)
    )
    if not count:
        return 0
    dependencies.follow_finishes(
        dag_run_id=source["dag_run_id"],
        dag_id=source["dag_id"],
        finished_task_ids=sorted({t for t, _ in wanted}),
    )
    return count


# --- up_for_reschedule --------------------------------------------------------------------------


def reschedule(
    *, ti_id: UUID, try_number: int, reschedule_date: datetime, end_date: datetime
) -> StateChange:
    """running -> queued again for the same try, claimable from `reschedule_date` (a sensor in
    reschedule mode), with a TaskReschedule row recording this poke.

    One durable transaction: read the TI, insert the TaskReschedule row, then one conditional
    UPDATE (running, same try -> queued) that takes the TI lock, commit; if the UPDATE matches
    nothing the row rolls back and the answer is 409 (a replay finds the TI queued, as retry)."""
    now = timezone.now()
    with transaction.atomic(durable=True):
        seen = TaskInstance.objects.filter(id=ti_id).first()
        if seen is None:
            raise _not_found(ti_id)
        _check_try(seen, try_number)
        if seen.state != TIState.RUNNING:
            raise _not_running(seen, "marked up_for_reschedule")
        TaskReschedule.objects.create(
            ti_id=seen.id,
            try_number=seen.try_number,
            start_date=seen.start_date or now,
            end_date=end_date,
            reschedule_date=reschedule_date,
        )
        matched = TaskInstance.objects.filter(
            id=ti_id, state=TIState.RUNNING, try_number=seen.try_number
        ).update(
            state=TIState.QUEUED,
            **fresh_try_values(queued_at=now, retry_at=reschedule_date),
            updated_at=now,
        )
        if not matched:
            current = TaskInstance.objects.filter(id=ti_id).first()
            if current is None:
                raise _not_found(ti_id)
            raise _not_running(current, "marked up_for_reschedule")
    return StateChange(
        ti_id=seen.id, state=TIState.QUEUED, replayed=False, try_number=seen.try_number
    )


# --- heartbeat ----------------------------------------------------------------------------------


def heartbeat(*, ti_id: UUID, try_number: int, hostname: str, pid: int) -> None:
    """Record that the TI is alive. One conditional UPDATE (running, same try, hostname and pid),
    no lock; when it matches nothing, one plain read says why: NotFound, StaleTry, or
    InvalidState with reason `running_elsewhere` (current_hostname, current_pid) or
    `not_running` (current_state)."""
    updated = TaskInstance.objects.filter(
        id=ti_id, state=TIState.RUNNING, try_number=try_number, hostname=hostname, pid=pid
    ).update(last_heartbeat_at=timezone.now())
    if updated:
        return
    current = (
        TaskInstance.objects.filter(id=ti_id)
        .values("state", "hostname", "pid", "try_number")
        .first()
    )
    if current is None:
        raise _not_found(ti_id)
    if current["try_number"] != try_number:
        raise exceptions.StaleTry.of(
            ti_id=ti_id, token_try=try_number, current_try=current["try_number"]
        )
    if (current["hostname"], current["pid"]) != (hostname, pid):
        raise exceptions.InvalidState(
            "TI is already running elsewhere",
            reason="running_elsewhere",
            current_hostname=current["hostname"],
            current_pid=current["pid"],
        )
    raise exceptions.InvalidState(
        "TI is no longer in the running state and task should terminate",
        reason="not_running",
        current_state=current["state"],
    )


# --- claiming -----------------------------------------------------------------------------------


def claim_workloads(*, hostname: str, limit: int) -> list[Workload]:
    """Claim up to `limit` queued TIs for `hostname`, FIFO, never waiting on another claimer.

    Transaction: one durable transaction: `locks.claim_queued_task_instances` (SKIP LOCKED) and one
    UPDATE setting claimed_by/claimed_at. A claimed TI that is not started within
    `WORKLOAD_CLAIM_TIMEOUT_SECONDS` becomes claimable again. The declared outlets of the claimed
    TIs' Tasks and their Dags' files are read with 3 queries whatever `limit` is, inside the same
    transaction: a read that fails (the database went away) rolls the claim back, so a claim whose
    answer is an error never strands its TIs for the claim timeout. The claimed TI rows are
    locked by nobody else (they were queued and SKIP LOCKED), so the longer hold costs no waiter.
    """
    now = timezone.now()
    timeout = timedelta(seconds=settings.WORKLOAD_CLAIM_TIMEOUT_SECONDS)
    with transaction.atomic(durable=True):
        tis = locks.claim_queued_task_instances(limit=limit, now=now, claim_timeout=timeout)
        if not tis:
            return []
        TaskInstance.objects.filter(id__in=[ti.id for ti in tis]).update(
            claimed_by=hostname, claimed_at=now
        )
        outlets = _declared_outlets({(ti.dag_id, ti.task_id) for ti in tis})
        files = dict(
            Dag.objects.filter(dag_id__in={ti.dag_id for ti in tis}).values_list(
                "dag_id", "fileloc"
            )
        )
    for ti in tis:
        ti.claimed_by = hostname
        ti.claimed_at = now
    return [
        Workload(
            ti=ti,
            task_outlets=outlets.get((ti.dag_id, ti.task_id), []),
            dag_rel_path=files.get(ti.dag_id, ""),
        )
        for ti in tis
    ]


def _declared_outlets(keys: set[tuple[str, str]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    dag_ids = {dag_id for dag_id, _ in keys}
    task_ids = {task_id for _, task_id in keys}
    tasks = Task.objects.filter(dag_id__in=dag_ids, task_id__in=task_ids).prefetch_related(
        "outlet_assets", "outlet_aliases"
    )
    result: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for task in tasks:
        key = (task.dag_id, task.task_id)
        if key not in keys:
            continue
        result[key] = [
            {"name": asset.name, "uri": asset.uri, "type": "Asset"}
            for asset in sorted(task.outlet_assets.all(), key=lambda a: a.name)
        ] + [
            {"name": alias.name, "type": "AssetAlias"}
            for alias in sorted(task.outlet_aliases.all(), key=lambda a: a.name)
        ]
    return result
