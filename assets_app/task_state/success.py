"""running -> success (`succeed`): the TI's outlets handed to the outbox in the same transaction
(`queue` mode) or registered before the lock (`inline` mode), then, after the commit, what
follows a finish (`after_ti_finished`). See the package docstring for the lock's contract.
"""

from datetime import datetime
from uuid import UUID

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from ..cluster import nudges
from ..guards import exceptions
from ..models import TaskInstance, TIState
from ..outbox import rows as outbox
from ..registration import outlets as registration
from ..registration import payloads
from ..registration.payloads import AssetProfile, JsonDict
from ..scheduling.dependencies import after_ti_finished
from ..sql import locks
from ..sql import task_instances as task_instances_sql
from . import StateChange, check_try, not_found, not_running


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
                raise not_found(ti_id)
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
            raise not_found(ti_id) from None
        return _replay_or_conflict(changed.ti, try_number=try_number, action="marked success")
    except IntegrityError:
        current = TaskInstance.objects.filter(id=ti_id).first()
        if current is None:
            raise not_found(ti_id) from None
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
    check_try(ti, try_number)
    if ti.state == TIState.SUCCESS:
        return StateChange(ti_id=ti.id, state=ti.state, replayed=True, try_number=ti.try_number)
    raise not_running(ti, action)


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
            raise not_found(ti_id)
        if ti.state != TIState.RUNNING or ti.try_number != try_number:
            return _replay_or_conflict(ti, try_number=try_number, action="marked success")
        registered = registration.register_payload(
            payload=payloads.build(
                ti=ti, outlets=task_outlets, outlet_events=outlet_events, end_date=end_date
            )
        )
        locked = locks.lock_task_instance(ti_id)
        if locked is None:
            raise not_found(ti_id)
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
            raise not_running(locked, "marked success")
        _set_success(locked, end_date=end_date)
        if registered.dag_ids:
            # No drain runs in this mode, so the scheduler hears about the new ADRQ rows here.
            nudges.scheduler_on_commit(dag_ids=registered.dag_ids)
    after_ti_finished(locked)
    return StateChange(
        ti_id=locked.id, state=locked.state, replayed=False, try_number=locked.try_number
    )
