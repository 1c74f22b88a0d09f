"""The django-q2 periodic sweeps behind the on-commit nudges (named `sweeps`, not schedules:
Dag time schedules do not belong here). The stored django-q2 Schedule rows name
`assets_app.tasks.*` functions, so renaming this module changes none of them.

A nudge gives low latency; the sweep catches what a nudge missed (a lost task, a Dag unpaused,
a run finished under max_active_runs, a row whose backoff expired). django-q2's scheduler wakes
about every 30 s, so one minute is the finest useful interval (DESIGN 7).

Only the drain and the asset scheduler run in the cluster (issue 41): work due at a time (time
schedules, backfills, webhook delivery, freshness, retention, repair) runs in the timers
process (`assets_app/timers/`), so a nudged drain or scheduler never waits behind it. The
sweeps those had here before are deleted by `ensure_schedules` (`RETIRED`).
"""

from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django_q.models import Schedule

SWEEPS = {
    "asset-drain-sweep": "assets_app.tasks.drain",
    "asset-scheduler-sweep": "assets_app.tasks.schedule",
}
# Sweeps of earlier versions, now timers (issue 41): deleted where they are still stored.
RETIRED = (
    "task-instance-repair-sweep",
    "retention-sweep",
    "webhook-delivery-sweep",
    "freshness-sweep",
)


@dataclass(frozen=True)
class EnsuredSchedule:
    name: str
    func: str
    created: bool


def task_timeout_seconds() -> int:
    """The sweep tasks' timeout: the cluster timeout, which must stay below `retry` so the
    broker never redelivers a task that is still running, and above the drain's time budget so
    a drain stops by itself before it is killed."""
    cluster = settings.Q_CLUSTER
    timeout = int(cluster["timeout"])
    if timeout >= int(cluster["retry"]):
        raise ValueError(
            f"Q_CLUSTER timeout ({timeout}) must be below retry ({cluster['retry']}) or the "
            "broker redelivers running tasks"
        )
    budget = float(settings.ASSET_DRAIN_TIME_BUDGET_SECONDS)
    if budget >= timeout:
        raise ValueError(
            f"ASSET_DRAIN_TIME_BUDGET_SECONDS ({budget}) must be below the Q_CLUSTER timeout "
            f"({timeout}) or drains are killed mid-batch"
        )
    return timeout


def ensure_schedules() -> list[EnsuredSchedule]:
    """Create or update the sweep schedules (idempotent, `update_or_create` by name): every
    minute, forever; delete the `RETIRED` ones. Catch-up is off cluster-wide
    (Q_CLUSTER["catch_up"] = False), so a cluster that was down runs one sweep, not one per
    missed minute. Own durable transaction."""
    timeout = task_timeout_seconds()
    ensured = []
    with transaction.atomic(durable=True):
        Schedule.objects.filter(name__in=RETIRED).delete()
        for name, func in SWEEPS.items():
            _, created = Schedule.objects.update_or_create(
                name=name,
                defaults={
                    "func": func,
                    "schedule_type": Schedule.MINUTES,
                    "minutes": 1,
                    "repeats": -1,
                    "kwargs": repr({"q_options": {"timeout": timeout}}),
                },
            )
            ensured.append(EnsuredSchedule(name=name, func=func, created=created))
    return ensured
