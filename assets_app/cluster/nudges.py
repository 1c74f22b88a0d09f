"""Nudges: asking a django-q2 worker to drain the outbox or run the scheduler soon.

Domain modules import this module at the top and send nudges after commit (`drain_on_commit`,
`scheduler_on_commit`), so a task never runs before the rows it should see exist. It names the
entry points by their dotted path (`DRAIN_FUNC`, `SCHEDULE_FUNC`: rows already in the broker
carry these names) and never imports `tasks`, so the domain imports no entry point.

A nudge only shortens a wait: the one-minute sweeps (`schedules.py`) drain and schedule whatever
a lost nudge left. So an on-commit nudge that raises (the broker's table away, a full disk) is
logged, one warning line naming the nudge, and swallowed: the transaction has committed, and
its caller's success must not become an error.
"""

import logging
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from django.db import transaction
from django_q.conf import Conf
from django_q.tasks import async_task

from . import broker

logger = logging.getLogger(__name__)

DRAIN_FUNC = "assets_app.tasks.drain"
SCHEDULE_FUNC = "assets_app.tasks.schedule"
# How many waiting broker rows a nudge looks through for a drain task that is not picked up yet.
COALESCE_LOOKAHEAD = 20

# Broker row of the last drain nudge this process sent (per process: no coordination needed).
_last_drain_nudge: dict[str, int] = {}
# Broker row and Dags (None: all) of the last scheduler nudge this process sent.
_last_scheduler_nudge: dict[str, tuple[int, frozenset[str] | None]] = {}


def _drain_waiting() -> bool:
    """Is a drain task enqueued and not yet picked up by any cluster?

    Such a task will start after the caller's commit (a nudge is sent on commit), so it will see
    the caller's rows: a second one would only claim an empty queue.
    """
    return DRAIN_FUNC in broker.waiting_task_funcs(lookahead=COALESCE_LOOKAHEAD)


def nudge_drain() -> None:
    """Ask a django-q2 worker to drain the outbox soon, unless a drain task is already waiting.
    Call after commit (`drain_on_commit` inside a transaction).

    Per success this is one primary-key read: the drain task this process sent last is still
    waiting. Only when it is not (picked up, or none sent yet) does the nudge look through the
    broker's waiting rows (`_drain_waiting`, which decodes them) and, finding none, send a task.
    """
    last = _last_drain_nudge.get("id")
    if last is not None and broker.still_waiting(last):
        return
    if _drain_waiting():
        return
    remembering = broker.RememberingBroker(list_key=Conf.CLUSTER_NAME)
    async_task(DRAIN_FUNC, task_name="asset-drain-nudge", broker=remembering)
    if remembering.enqueued_id is not None:
        _last_drain_nudge["id"] = remembering.enqueued_id


def _covers(have: frozenset[str] | None, wanted: frozenset[str] | None) -> bool:
    return have is None or (wanted is not None and wanted <= have)


def _scheduler_waiting(wanted: frozenset[str] | None) -> bool:
    """Is a scheduler task for (a superset of) `wanted` enqueued and not yet picked up? It will
    start after the caller's commit, so it will see the caller's rows."""
    for func, kwargs in broker.waiting_tasks(lookahead=COALESCE_LOOKAHEAD):
        if func == SCHEDULE_FUNC:
            dag_ids = kwargs.get("dag_ids")
            if _covers(None if dag_ids is None else frozenset(dag_ids), wanted):
                return True
    return False


def nudge_scheduler(*, dag_ids: Iterable[str] | None = None) -> None:
    """Ask a django-q2 worker to run the scheduler (for `dag_ids`, or all), unless a scheduler
    task for those Dags is already waiting. Call after commit (`scheduler_on_commit` inside a
    transaction).

    Coalesced as `nudge_drain` is (issue 41): an event posted 50 times a second nudged 50
    scheduler tasks a second, and a drain nudged behind them waited for all of them (FIFO):
    a success's downstream run came 8-21 s late. One primary-key read when this process's
    last scheduler task covers these Dags and is still waiting, else a look at the waiting
    rows, and a task only when none covers them."""
    wanted = frozenset(dag_ids) if dag_ids is not None else None
    last = _last_scheduler_nudge.get("row")
    if last is not None and _covers(last[1], wanted) and broker.still_waiting(last[0]):
        return
    if _scheduler_waiting(wanted):
        return
    kwargs = {"dag_ids": sorted(wanted)} if wanted is not None else {}
    remembering = broker.RememberingBroker(list_key=Conf.CLUSTER_NAME)
    async_task(SCHEDULE_FUNC, task_name="asset-scheduler-nudge", broker=remembering, **kwargs)
    if remembering.enqueued_id is not None:
        _last_scheduler_nudge["row"] = (remembering.enqueued_id, wanted)


def drain_on_commit() -> None:
    """Nudge the drain when the current transaction commits (`nudge_drain`), robustly."""
    transaction.on_commit(partial(send_robustly, nudge_drain))


def scheduler_on_commit(*, dag_ids: Iterable[str]) -> None:
    """Nudge the scheduler for `dag_ids` when the current transaction commits, robustly."""
    transaction.on_commit(partial(send_robustly, nudge_scheduler, dag_ids=dag_ids))


def send_robustly(nudge: Callable[..., None], /, **kwargs: Any) -> None:
    """Send `nudge`; if it raises, log one warning line naming it and return (the sweep covers
    a lost nudge). Runs after commit, where an error can no longer undo anything."""
    try:
        nudge(**kwargs)
    except Exception as exc:
        detail = next((line for line in str(exc).splitlines() if line.strip()), "")
        logger.warning(
            "%s failed after commit (the sweep will cover it): %s: %s",
            getattr(nudge, "__name__", repr(nudge)),
            type(exc).__name__,
            detail,
        )
