"""django-q2 entry points. With `schedules.py` (the sweep Schedule rows) and `broker.py` (the
cluster's broker), the only modules that import django_q.

Each entry point is thin: it calls one domain function. Nudges are sent after commit
(`transaction.on_commit(nudge_drain)`), so a task never runs before the rows it should see exist.
"""

import os
from collections.abc import Iterable

from django.conf import settings
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.tasks import async_task

from . import outbox, prepared, scheduling
from .broker import ListeningORM

DRAIN_FUNC = "assets_app.tasks.drain"
SCHEDULE_FUNC = "assets_app.tasks.schedule"
# How many waiting broker rows a nudge looks through for a drain task that is not picked up yet.
COALESCE_LOOKAHEAD = 20


def _drain_waiting() -> bool:
    """Is a drain task enqueued and not yet picked up by any cluster?

    Such a task will start after the caller's commit (a nudge is sent on commit), so it will see
    the caller's rows: a second one would only claim an empty queue.
    """
    waiting = OrmQ.objects.filter(key=Conf.CLUSTER_NAME, lock__lte=timezone.now()).order_by("id")
    return any(row.func() == DRAIN_FUNC for row in waiting[:COALESCE_LOOKAHEAD])


class _RememberingBroker(ListeningORM):
    """The cluster's broker, remembering the broker row of the task it enqueues."""

    enqueued_id: int | None = None

    def enqueue(self, task):
        self.enqueued_id = super().enqueue(task)
        return self.enqueued_id


# Broker row of the last drain nudge this process sent (per process: no coordination needed).
_last_drain_nudge: dict[str, int] = {}


def _still_waiting(row_id: int) -> bool:
    """Is that broker row still waiting for a cluster to pick it up? One primary-key read."""
    with prepared.cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM {OrmQ._meta.db_table} WHERE id = %s AND lock <= %s",
            [row_id, timezone.now()],
        )
        return cursor.fetchone() is not None


def nudge_drain() -> None:
    """Ask a django-q2 worker to drain the outbox soon, unless a drain task is already waiting.
    Call after commit.

    Per success this is one primary-key read: the drain task this process sent last is still
    waiting. Only when it is not (picked up, or none sent yet) does the nudge look through the
    broker's waiting rows (`_drain_waiting`, which decodes them) and, finding none, send a task.
    """
    last = _last_drain_nudge.get("id")
    if last is not None and _still_waiting(last):
        return
    if _drain_waiting():
        return
    broker = _RememberingBroker(list_key=Conf.CLUSTER_NAME)
    async_task(DRAIN_FUNC, task_name="asset-drain-nudge", broker=broker)
    if broker.enqueued_id is not None:
        _last_drain_nudge["id"] = broker.enqueued_id


def nudge_scheduler(*, dag_ids: Iterable[str] | None = None) -> None:
    """Ask a django-q2 worker to run the scheduler (for `dag_ids`, or all). Call after commit."""
    kwargs = {"dag_ids": sorted(dag_ids)} if dag_ids is not None else {}
    async_task(SCHEDULE_FUNC, task_name="asset-scheduler-nudge", **kwargs)


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
    outbox.drain()


def repair() -> None:
    """django-q2 task: fail/retry TIs whose worker died, queue what a crash left waiting."""
    _background_priority()
    scheduling.repair_task_instances()


def schedule(dag_ids: list[str] | None = None) -> None:
    """django-q2 task: one scheduler pass (over `dag_ids`, or every Dag with queued events)."""
    _background_priority()
    scheduling.schedule_dags(dag_ids=dag_ids)
