"""django-q2 entry points, each thin: it calls one domain function.

With `cluster/sweeps.py` (the sweep Schedule rows), `cluster/broker.py` (the cluster's broker) and
`cluster/nudges.py` (which enqueues these entry points by name, `nudges.DRAIN_FUNC` and
`nudges.SCHEDULE_FUNC`), the only modules that import django_q; no domain module imports this one
(tests/test_architecture.py).
"""

import os

from django.conf import settings

from .outbox import drain as outbox_drain
from .scheduling import asset_runs as scheduling

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


def schedule(dag_ids: list[str] | None = None) -> None:
    """django-q2 task: one asset scheduler pass (over `dag_ids`, a nudge; or every Dag with
    queued events, the sweep). Time schedules are the timers process's (issue 41)."""
    _background_priority()
    if dag_ids is not None:
        scheduling.schedule_nudged(dag_ids=dag_ids)
    else:
        scheduling.schedule_dags()
