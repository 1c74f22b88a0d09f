"""django-q2 entry points, each thin: it calls one domain function.

With `schedules.py` (the sweep Schedule rows), `cluster/broker.py` (the cluster's broker) and
`cluster/nudges.py` (which enqueues these entry points by name, `nudges.DRAIN_FUNC` and
`nudges.SCHEDULE_FUNC`), the only modules that import django_q; no domain module imports this one
(tests/test_architecture.py).
"""

import os

from django.conf import settings

from .events_out import delivery as webhook_delivery
from .events_out import freshness
from .operations import retention as history_retention
from .outbox import drain as outbox_drain
from .scheduling import asset_runs as scheduling
from .scheduling import backfills
from .scheduling import time_runs as time_scheduling
from .task_state import repair as ti_repair

_reniced: list[int] = []


def _background_priority() -> None:
    """Run this cluster worker process at ASSET_DRAIN_NICE (added to its niceness, once per
    process): registration and scheduling are background work, and on a host shared with the
    web tier the success answers should get the cores first. Only ever lowers the priority, so
    it needs no privilege; its PostgreSQL backend keeps its own priority."""
    nice = int(settings.ASSET_DRAIN_NICE)
    if nice > 0 and os.getpid() not in _reniced and hasattr(os, "nice"):
        os.nice(nice)
        _reniced.append(os.getpid())


def drain() -> None:
    """django-q2 task: drain the outbox until it is empty or the time budget is spent."""
    _background_priority()
    outbox_drain.drain()


def repair() -> None:
    """django-q2 task: fail/retry TIs whose worker died, queue what a crash left waiting."""
    _background_priority()
    ti_repair.repair_task_instances()


def schedule(dag_ids: list[str] | None = None) -> None:
    """django-q2 task: one scheduler pass (over `dag_ids`, a nudge; or every Dag with queued
    events, the sweep)."""
    _background_priority()
    if dag_ids is not None:
        scheduling.schedule_nudged(dag_ids=dag_ids)
    else:  # the sweep: also the time schedules' due runs (issue 24)
        scheduling.schedule_dags()
        time_scheduling.create_due_runs()
        backfills.start_runs()


def retention() -> None:
    """django-q2 task: the periodic retention clean (nothing unless RETENTION_PERIODIC is on and
    its interval has passed; a failure raises, so the cluster records the task as failed)."""
    _background_priority()
    history_retention.periodic_clean()


def deliver_webhooks() -> None:
    """django-q2 task: send due webhook messages for the time budget (issue 29)."""
    _background_priority()
    webhook_delivery.deliver()


def evaluate_freshness() -> None:
    """django-q2 task: one freshness pass over every policy (issue 29)."""
    _background_priority()
    freshness.evaluate_all()
