"""Deferral (issue 42): a running TI hands its wait to a trigger (`defer`), a triggerer runs the
trigger (`claim_triggers`) and reports its event or failure (`resume_with_event`,
`resume_with_failure`), or its timeout passes (`time_out_triggers`); each of those queues the
TI again for a worker, which resumes the task in its `next_method`.

As Airflow 3.3.2 does it:
- `defer` is the execution API's deferred state update
  (`api_fastapi/execution_api/routes/task_instances.py`, `TIDeferredStatePayload`): a Trigger
  row with the classpath and the kwargs as sent (a dict is stored as its JSON text, a string
  as it is: the server handles neither), and on the TI `state = deferred`, `trigger_id`,
  `next_method`, `next_kwargs` (as the Task SDK serialized them) and `trigger_timeout = now +
  the payload's timeout`. `rendered_map_index` is dropped there, as Airflow's update drops it.
- an event resumes the TI as `airflow/models/trigger.py` `handle_event_submit` does:
  `next_kwargs["event"] = the event's payload` (serialized by the triggerer with the Task
  SDK's serde, which leaves a dict of string keys a plain dict, so adding a key to the stored
  dict is what Airflow's decode, add and re-encode gives), the trigger pointer cleared, and
  the TI back in line for a worker with the same try. Airflow's TI becomes `scheduled` and
  its scheduler queues it; here it becomes `queued` at once (this service's `queued` is
  Airflow's scheduled-then-queued, see `claims`).
- a failure is `Trigger.submit_failure`: `next_method = "__fail__"`, `next_kwargs = {"error":
  "Trigger failure", "traceback": [...]}`; a timeout is the scheduler's
  `check_trigger_timeouts`: `next_method = "__fail__"`, `next_kwargs = {"error": "Trigger
  timeout"}`. The Task SDK's `BaseOperator.resume_execution` then raises
  `TaskDeferralError` / `TaskDeferralTimeout` in the worker, which fails or retries the try.

Locks: `defer` inserts the Trigger row and then takes the TI lock with its conditional UPDATE
(running, same try -> deferred), commit: the TI lock is held for that one UPDATE. A resume is
one conditional UPDATE of the TI (deferred, this trigger -> queued), which takes and releases
the TI lock with its commit; the unused Trigger row is deleted later by the timeout timer
(`delete_unused_triggers`, Airflow's `clean_unused`). Claims lock Trigger rows only, SKIP
LOCKED (`locks.claim_triggers`).

Idempotency: a replayed deferral of a TI already deferred (same try) writes nothing and
answers 200; a deferral of a TI not running is 409. An event or failure for a trigger whose TI
has already resumed (a second triggerer's, a replay) changes nothing (`resumed` False), as
Airflow's `submit_event` finds no deferred TI for it.
"""

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import transaction
from django.db.models import Min
from django.utils import timezone

from ..models import TaskInstance, TIState, Trigger
from ..runtime import xcoms as xcoms_store
from ..scheduling.dependencies import after_ti_finished
from ..sql import locks, wakeups
from ..sql import triggers as triggers_sql
from . import StateChange, check_try, is_eligible_to_retry, not_found, not_running, retries

# Airflow's `TRIGGER_FAIL_REPR` and `TriggerFailureReason` values (`airflow/models/trigger.py`).
TRIGGER_FAIL_REPR = "__fail__"
TRIGGER_TIMEOUT = "Trigger timeout"
TRIGGER_FAILURE = "Trigger failure"


# --- running -> deferred ------------------------------------------------------------------------


def defer(
    *,
    ti_id: UUID,
    try_number: int,
    classpath: str,
    trigger_kwargs: dict[str, Any] | str,
    trigger_timeout: timedelta | None,
    queue: str | None,
    next_method: str,
    next_kwargs: dict[str, Any],
) -> StateChange:
    """running -> deferred, with its Trigger row (see the module docstring). One durable
    transaction: read the TI, insert the Trigger, one conditional UPDATE (running, same try)
    that takes the TI lock, commit; a miss rolls the Trigger back (409, or 200 for a replay
    of a TI already deferred). A trigger with a timeout wakes the trigger timer on commit."""
    now = timezone.now()
    kwargs_text = trigger_kwargs if isinstance(trigger_kwargs, str) else json.dumps(trigger_kwargs)
    timeout_at = now + trigger_timeout if trigger_timeout is not None else None
    with transaction.atomic(durable=True):
        seen = TaskInstance.objects.filter(id=ti_id).only("id", "state", "try_number").first()
        if seen is None:
            raise not_found(ti_id)
        check_try(seen, try_number)
        if seen.state == TIState.DEFERRED:
            return StateChange(
                ti_id=seen.id, state=seen.state, replayed=True, try_number=seen.try_number
            )
        if seen.state != TIState.RUNNING:
            raise not_running(seen, "deferred")
        trigger = Trigger.objects.create(
            classpath=classpath, kwargs=kwargs_text, queue=queue, created_at=now
        )
        if timeout_at is not None:
            # Before the UPDATE (delivered on commit only), so nothing follows it under the lock.
            wakeups.wake(wakeups.TRIGGERS)
        matched = TaskInstance.objects.filter(
            id=ti_id, state=TIState.RUNNING, try_number=seen.try_number
        ).update(
            state=TIState.DEFERRED,
            trigger=trigger,
            next_method=next_method,
            next_kwargs=next_kwargs,
            trigger_timeout=timeout_at,
            updated_at=now,
        )
        if not matched:
            current = TaskInstance.objects.filter(id=ti_id).first()
            if current is None:
                raise not_found(ti_id)
            raise not_running(current, "deferred")
    return StateChange(
        ti_id=seen.id, state=TIState.DEFERRED, replayed=False, try_number=seen.try_number
    )


# --- deferred -> queued (resume) ---------------------------------------------------------------


def _resume_values(now: datetime) -> dict[str, Any]:
    """What a resume writes besides next_method / next_kwargs: queued again for a worker (same
    try, no claim left), no trigger. The start date stays (the resumed try keeps its first
    start, as Airflow's `ti_run` keeps it)."""
    return {
        "state": TIState.QUEUED,
        "trigger": None,
        "trigger_timeout": None,
        "queued_at": now,
        "retry_at": None,
        "claimed_by": "",
        "claimed_at": None,
        "updated_at": now,
    }


def resume_with_event(*, trigger_id: int, payload: Any) -> bool:
    """The trigger fired: its deferred TI is queued again with `next_kwargs["event"] =
    payload` (Airflow's `handle_event_submit`). One unlocked read of the TI (its next_kwargs
    cannot change while it waits for this trigger), then one conditional UPDATE (deferred,
    this trigger) that takes the TI lock, commit. False when no deferred TI waits for it any
    more (already resumed, timed out, cleared): nothing written."""
    waiting = (
        TaskInstance.objects.filter(trigger_id=trigger_id, state=TIState.DEFERRED)
        .values("id", "next_method", "next_kwargs")
        .first()
    )
    if waiting is None:
        return False
    next_method = waiting["next_method"]
    next_kwargs = waiting["next_kwargs"] if waiting["next_kwargs"] is not None else {}
    if isinstance(next_kwargs, dict):
        next_kwargs = {**next_kwargs, "event": payload}
    else:
        # Airflow's `_fail_unresumable_task_instance`: kwargs that are not a dict cannot take
        # the event; the task fails in the worker instead of waiting for ever.
        next_method = TRIGGER_FAIL_REPR
        next_kwargs = {
            "error": "Could not resume the task: its stored next_kwargs could not be decoded "
            "(ValueError: next_kwargs decoded to "
            f"{type(next_kwargs).__name__}, expected a dict)",
            "traceback": [],
        }
    return _resume(
        trigger_id=trigger_id, ti_id=waiting["id"], next_method=next_method, next_kwargs=next_kwargs
    )


def resume_with_failure(*, trigger_id: int, traceback: list[str] | None) -> bool:
    """The trigger failed (raised, could not load, or ended without an event): its deferred TI
    is queued again to fail in the worker (Airflow's `Trigger.submit_failure`). False when no
    deferred TI waits for it any more. One conditional UPDATE."""
    ti_id = (
        TaskInstance.objects.filter(trigger_id=trigger_id, state=TIState.DEFERRED)
        .values_list("id", flat=True)
        .first()
    )
    if ti_id is None:
        return False
    return _resume(
        trigger_id=trigger_id,
        ti_id=ti_id,
        next_method=TRIGGER_FAIL_REPR,
        next_kwargs={"error": TRIGGER_FAILURE, "traceback": traceback},
    )


def _resume(*, trigger_id: int, ti_id: UUID, next_method: str | None, next_kwargs: Any) -> bool:
    now = timezone.now()
    with transaction.atomic(durable=True):
        # The trigger timer deletes the unused Trigger row (woken on commit; before the UPDATE
        # so that nothing follows it under the TI lock).
        wakeups.wake(wakeups.TRIGGERS)
        matched = TaskInstance.objects.filter(
            id=ti_id, trigger_id=trigger_id, state=TIState.DEFERRED
        ).update(next_method=next_method, next_kwargs=next_kwargs, **_resume_values(now))
    return bool(matched)


# --- deferred -> finished by the trigger (end_from_trigger) -----------------------------------


def end_from_trigger(*, trigger_id: int, state: str, xcoms: dict[str, Any] | None) -> str | None:
    """The trigger ended the task itself (a `BaseTaskEndEvent`: `end_from_trigger=True`), as
    Airflow's `handle_event_submit` for it does: a failed TI with tries left goes to its next
    try (queued after its retry delay, as a worker's `up_for_retry`); otherwise the TI takes
    `state` (success, failed, skipped) with its end date now, and the event's `xcoms` (values
    serialized with the Task SDK's serde) are pushed unless it was retried. Like Airflow's, a
    success here registers no outlets (`set_state`). Its downstream follow after the commit.

    Lock: the task's retry policy read before; then lock the TI, check it still waits for this
    trigger, one UPDATE, commit. The state it ended in, or None when no deferred TI waits for
    the trigger any more (nothing written)."""
    ti_id = (
        TaskInstance.objects.filter(trigger_id=trigger_id, state=TIState.DEFERRED)
        .values_list("id", flat=True)
        .first()
    )
    if ti_id is None:
        return None
    policy = retries.retry_policy(ti_id) if state == TIState.FAILED else None
    now = timezone.now()
    with transaction.atomic(durable=True):
        wakeups.wake(wakeups.TRIGGERS)  # its trigger is unused once this commits
        ti = locks.lock_task_instance(ti_id)
        if ti is None or ti.state != TIState.DEFERRED or ti.trigger_id != trigger_id:
            return None
        cleared = {"trigger": None, "trigger_timeout": None, "next_method": None}
        if state == TIState.FAILED and is_eligible_to_retry(
            try_number=ti.try_number, max_tries=ti.max_tries
        ):
            changed = retries.requeue_or_fail(ti, now=now, end_date=now, delay=None, policy=policy)
        else:
            ti.state = state
            ti.end_date = now
            changed = ["state", "end_date", "updated_at"]
        for name, value in {**cleared, "next_kwargs": None}.items():
            setattr(ti, name, value)
        ti.save(update_fields=sorted({*changed, *cleared, "next_kwargs"}))
    if ti.state == TIState.QUEUED:
        return "up_for_retry"
    for key, value in (xcoms or {}).items():
        xcoms_store.push(
            dag_id=ti.dag_id,
            run_id=ti.run_id,
            task_id=ti.task_id,
            key=key,
            value=value,
            map_index=ti.map_index,
        )
    after_ti_finished(ti)
    return ti.state


# --- trigger timeouts (the timers process) ----------------------------------------------------


@dataclass(frozen=True)
class TimeoutPass:
    """What a pass did: deferred TIs whose trigger timed out (queued to fail), unused
    triggers deleted."""

    timed_out: int
    deleted: int


def time_out_triggers(*, now: datetime | None = None, batch: int = 1000) -> TimeoutPass:
    """Deferred TIs whose `trigger_timeout` passed are queued again to fail in the worker
    (Airflow's scheduler `check_trigger_timeouts`: `next_method = "__fail__"`, `next_kwargs =
    {"error": "Trigger timeout"}`), in one UPDATE (each row locked only by it; a TI an event
    resumes at the same moment is resumed once: the loser's condition no longer matches);
    then TIs no longer deferred let go of their trigger and unused triggers are deleted in
    batches (Airflow's `Trigger.clean_unused`)."""
    now = now or timezone.now()
    timed_out = TaskInstance.objects.filter(state=TIState.DEFERRED, trigger_timeout__lt=now).update(
        next_method=TRIGGER_FAIL_REPR,
        next_kwargs={"error": TRIGGER_TIMEOUT},
        **_resume_values(now),
    )
    # Airflow's `clean_unused` first: a TI that left `deferred` another way (its run timed
    # out, an operator marked it) no longer points at its trigger.
    TaskInstance.objects.filter(trigger__isnull=False).exclude(state=TIState.DEFERRED).update(
        trigger=None
    )
    deleted = 0
    while True:
        with transaction.atomic(durable=True):
            count = triggers_sql.delete_unused_triggers(limit=batch)
        deleted += count
        if count < batch:
            break
    return TimeoutPass(timed_out=timed_out, deleted=deleted)


def next_timeout_at() -> datetime | None:
    """The earliest trigger timeout of a deferred TI (the `ti_deferred_timeout` index)."""
    return TaskInstance.objects.filter(state=TIState.DEFERRED).aggregate(
        due=Min("trigger_timeout")
    )["due"]


# --- the triggerer's claim ---------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimedTrigger:
    """A trigger leased to a triggerer, with what it needs to run it: Airflow's `RunTrigger`
    workload (`id`, `classpath`, `encrypted_kwargs`, `timeout_after`, the TI)."""

    id: int
    classpath: str
    encrypted_kwargs: str
    timeout_after: datetime | None
    ti: TaskInstance


@dataclass(frozen=True)
class TriggerClaim:
    """A claim's answer: the triggers newly leased, the held ones the triggerer must stop
    (`released`: fired, timed out, their TI moved on, or taken by another after the lease
    ended), and the lease length."""

    triggers: list[ClaimedTrigger]
    released: list[int]
    lease_seconds: float


def claim_triggers(
    *, triggerer: str, limit: int, held: list[int], queues: list[str] | None = None
) -> TriggerClaim:
    """Renew `triggerer`'s leases on the `held` triggers it still holds and lease it up to
    `limit` more (SKIP LOCKED: never waits, never hands one trigger to two triggerers while
    its lease runs), for `TRIGGER_LEASE_SECONDS` (read now). One durable transaction of two
    statements, then one read of the claimed triggers' TIs (unlocked)."""
    now = timezone.now()
    lease_seconds = float(settings.TRIGGER_LEASE_SECONDS)
    lease_until = now + timedelta(seconds=lease_seconds)
    with transaction.atomic(durable=True):
        kept = locks.renew_trigger_leases(
            triggerer=triggerer, ids=held, now=now, lease_until=lease_until
        )
        ids = (
            locks.claim_triggers(
                triggerer=triggerer,
                limit=limit,
                queues=queues,
                now=now,
                lease_until=lease_until,
            )
            if limit > 0
            else []
        )
    claimed: list[ClaimedTrigger] = []
    if ids:
        tis = {
            ti.trigger_id: ti
            for ti in TaskInstance.objects.filter(trigger_id__in=ids, state=TIState.DEFERRED)
            .select_related("trigger")
            .order_by("trigger_id")
        }
        for trigger_id in ids:
            ti = tis.get(trigger_id)
            if ti is None or ti.trigger is None:
                continue  # resumed since the claim committed
            claimed.append(
                ClaimedTrigger(
                    id=trigger_id,
                    classpath=ti.trigger.classpath,
                    encrypted_kwargs=ti.trigger.kwargs,
                    timeout_after=ti.trigger_timeout,
                    ti=ti,
                )
            )
    released = sorted(set(held) - set(kept))
    return TriggerClaim(triggers=claimed, released=released, lease_seconds=lease_seconds)
