"""A running TI back to queued: the next try after a delay (`retry`) or the same try later
(`reschedule`, a sensor in reschedule mode).

Retries: `retry` follows Airflow's eligibility rule (`max_tries != 0 and try_number <= max_tries`).
An eligible TI goes straight back to `queued` with `try_number + 1`, `retry_at = now + delay`
(the body's `retry_delay_seconds`, else its task's delay and backoff, `retry_delay_for`) and
its claim cleared, so workers claim it again after the delay; an ineligible one becomes
`failed`. A TI is therefore never left in `up_for_retry`, so a replayed retry request finds it
queued and gets 409.
"""

import hashlib
import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from django.db import transaction
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from ..models import Task, TaskInstance, TaskReschedule, TIState
from ..models.dags import DEFAULT_RETRY_DELAY_SECONDS
from ..models.runs import fresh_try_values
from ..scheduling.dependencies import after_ti_finished
from ..sql import locks
from . import StateChange, check_try, is_eligible_to_retry, not_found, not_running

# Airflow's `[core] max_task_retry_delay` default: the cap of an exponential backoff.
MAX_RETRY_DELAY_SECONDS = 24 * 60 * 60


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
    policy = None if retry_delay_seconds is not None else retry_policy(ti_id)
    now = timezone.now()
    with transaction.atomic(durable=True):
        ti = locks.lock_task_instance(ti_id)
        if ti is None:
            raise not_found(ti_id)
        check_try(ti, try_number)
        if ti.state != TIState.RUNNING:
            raise not_running(ti, "marked up_for_retry")
        changed = requeue_or_fail(
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


def retry_policy(ti_id: UUID) -> RetryPolicy:
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


def requeue_or_fail(
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
    if is_eligible_to_retry(try_number=ti.try_number, max_tries=ti.max_tries):
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
            raise not_found(ti_id)
        check_try(seen, try_number)
        if seen.state != TIState.RUNNING:
            raise not_running(seen, "marked up_for_reschedule")
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
                raise not_found(ti_id)
            raise not_running(current, "marked up_for_reschedule")
    return StateChange(
        ti_id=seen.id, state=TIState.QUEUED, replayed=False, try_number=seen.try_number
    )
