"""django-q2's ORM broker, woken by PostgreSQL NOTIFY instead of polling (issue 15: idle cost).

django-q2's ORM broker asks the database for work every `poll` seconds while the queue is empty:
with the 0.02 s that keeps the nudge's pickup latency low, an idle cluster made 94 transactions a
second. This broker sends `NOTIFY` on its channel with every enqueue (delivered when the
enqueuing transaction commits, so a woken cluster sees the row), and a cluster that found the
queue empty waits on `LISTEN` for at most `Q_CLUSTER_IDLE_WAIT_SECONDS` (30 s) before it looks
again. A task is therefore picked up as soon as it is committed, and an idle cluster asks once
per wait. A row whose lock expires sends no NOTIFY (a task whose cluster died mid-run, retried
`Q_CLUSTER_RETRY` after its start): the wait ends when the earliest taken row's lock expires,
so a killed drain is retried on time, not up to a whole idle wait later. The bounded wait also
covers a notification lost with a dropped listening connection.

On SQLite (no LISTEN) it is django-q2's ORM broker, polling every `poll` seconds.

It also reads the broker's rows for the nudges' coalescing (`waiting_task_funcs`,
`still_waiting`, `RememberingBroker`: see `cluster/nudges.py`).

The listening connection is psycopg's own (autocommit, one per process, opened on the first
empty dequeue, i.e. in the cluster's pusher after the fork), never Django's: Django's connection
is closed and reopened by the broker between calls (`close_old_connections`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any

from django.conf import settings
from django.utils import timezone
from django_q.brokers.orm import ORM
from django_q.conf import Conf
from django_q.models import OrmQ

from ..sql import connection as connection_sql

logger = logging.getLogger(__name__)

# PostgreSQL channel names are identifiers: at most 63 bytes.
_CHANNEL_PREFIX = "django_q_"
# A woken look at a row whose lock just expired comes this much after the expiry (the claim
# compares the lock with the database's clock, which may run a little behind this process's).
LOCK_EXPIRY_MARGIN_SECONDS = 0.05


def channel_for(list_key: str) -> str:
    return (_CHANNEL_PREFIX + list_key)[:63]


def listen(list_key: str) -> Any:
    """A new psycopg connection (autocommit, Django's settings for the broker's database) that
    LISTENs on `list_key`'s channel."""
    return connection_sql.open_listener(channel_for(list_key), using=Conf.ORM)


class ListeningORM(ORM):
    """ORM broker: NOTIFY on enqueue, LISTEN (bounded) instead of sleeping on an empty queue."""

    def __init__(self, list_key: str | None = None) -> None:
        super().__init__(list_key=list_key or Conf.CLUSTER_NAME)
        self._listener: Any = None
        self._listener_pid: int | None = None

    @staticmethod
    def _postgresql() -> bool:
        return connection_sql.supports_listen(Conf.ORM)

    def enqueue(self, task: str) -> int:
        task_id = super().enqueue(task)
        if self._postgresql():
            connection_sql.notify(channel_for(self.list_key), using=Conf.ORM)
        return task_id

    def dequeue(self) -> list[tuple[int, str]] | None:
        if not self._postgresql():
            return super().dequeue()  # polls: sleeps `poll` seconds on an empty queue
        # Listen before looking, so a task committed between the look and the wait still wakes.
        listener = self._listening()
        tasks = self._take()
        if tasks:
            return tasks
        self._wait(listener, self._until_lock_expires())
        return None

    def _until_lock_expires(self) -> float | None:
        """Seconds until the earliest taken row of this queue is free again (its task's cluster
        died, or it is still running and will be acknowledged first); None if none is taken."""
        earliest = (
            OrmQ.objects.using(Conf.ORM)
            .filter(key=self.list_key, lock__gt=timezone.now())
            .order_by("lock")
            .values_list("lock", flat=True)
            .first()
        )
        if earliest is None:
            return None
        return max(0.0, (earliest - timezone.now()).total_seconds()) + LOCK_EXPIRY_MARGIN_SECONDS

    def _take(self) -> list[tuple[int, str]] | None:
        """django-q2's claim (compare-and-set on `lock`), without its sleep on an empty queue."""
        poll, Conf.POLL = Conf.POLL, 0
        try:
            return super().dequeue()
        finally:
            Conf.POLL = poll

    def _listening(self) -> Any:
        """This process's LISTEN connection, (re)opened when missing or broken; None if it cannot
        be opened (the caller then sleeps instead)."""
        listener = self._listener
        mine = listener is not None and self._listener_pid == os.getpid()
        if mine and not (listener.closed or listener.broken):
            return listener
        self._listener = None
        try:
            conn = listen(self.list_key)
        except Exception as exc:  # the database is away: wait, django-q2 retries the dequeue
            logger.warning("broker: cannot LISTEN (%s); polling until it can", exc)
            return None
        self._listener, self._listener_pid = conn, os.getpid()
        return conn

    def _wait(self, listener: Any, until_lock_expires: float | None = None) -> None:
        wait = float(settings.Q_CLUSTER_IDLE_WAIT_SECONDS)
        if until_lock_expires is not None:
            wait = min(wait, until_lock_expires)
        if listener is None:
            time.sleep(wait)
            return
        try:
            for _ in listener.notifies(timeout=wait, stop_after=1):
                break
        except Exception as exc:  # connection lost: reopened on the next dequeue
            logger.warning("broker: LISTEN connection lost (%s)", exc)
            self._close_listener()

    def _close_listener(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(Exception):
                self._listener.close()
        self._listener = None


class RememberingBroker(ListeningORM):
    """The cluster's broker, remembering the broker row of the task it enqueues."""

    enqueued_id: int | None = None

    def enqueue(self, task):
        self.enqueued_id = super().enqueue(task)
        return self.enqueued_id


def waiting_task_funcs(*, lookahead: int) -> list[str]:
    """The functions of the first `lookahead` tasks enqueued on this cluster and not yet picked
    up by any of its workers (django-q2's OrmQ rows, decoded), oldest first."""
    return [func for func, _ in waiting_tasks(lookahead=lookahead)]


def waiting_tasks(*, lookahead: int) -> list[tuple[str, dict[str, Any]]]:
    """(function, keyword arguments) of the first `lookahead` tasks enqueued on this cluster
    and not yet picked up by any of its workers (django-q2's OrmQ rows, decoded), oldest
    first."""
    waiting = OrmQ.objects.filter(key=Conf.CLUSTER_NAME, lock__lte=timezone.now()).order_by("id")
    return [(row.func(), row.kwargs() or {}) for row in waiting[:lookahead]]


def still_waiting(row_id: int) -> bool:
    """Is that broker row still waiting for a cluster to pick it up? One primary-key read
    (`connection_sql.broker_row_waiting`)."""
    return connection_sql.broker_row_waiting(
        table=OrmQ._meta.db_table, row_id=row_id, now=timezone.now()
    )
