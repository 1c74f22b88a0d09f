"""Whether a running TI's worker is alive: its heartbeats (`heartbeat`), and the sweep that fails
or retries the TIs whose heartbeat stopped (`fail_dead_task_instances`, run by `repair`).
"""

from dataclasses import dataclass
from datetime import timedelta
from uuid import UUID

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ..guards import exceptions
from ..models import TaskInstance, TIState
from ..scheduling.dependencies import after_ti_finished
from ..sql import locks
from . import not_found
from .retries import requeue_or_fail, retry_policy

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
        raise not_found(ti_id)
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
        policy = retry_policy(ti_id)
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
            changed = requeue_or_fail(ti, now=now, end_date=now, delay=None, policy=policy)
            ti.save(update_fields=changed)
        if ti.state == TIState.FAILED:
            failed.append(ti.id)
            after_ti_finished(ti)
        else:
            retried.append(ti.id)
    return HeartbeatSweep(retried=tuple(retried), failed=tuple(failed))
