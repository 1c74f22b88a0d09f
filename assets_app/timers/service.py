"""The service's timers (`manage.py run_timers`, the Procfile's `timers`), each a domain function
and the read that says when it is next due:

- time-scheduler: the due runs of time schedules (`time_runs.create_due_runs`), then the
  backfills' next runs (`backfills.start_runs`); due at the earliest `next_dagrun_create_after`
  after the pass; woken on `TIME` (a sync, a pause or unpause, a run of a timetable Dag or of a
  backfill finished);
- webhook-delivery: send what is due until nothing is (`delivery.deliver`); due at the earliest
  due message or expiring lease; woken on `WEBHOOKS` (messages written, replayed, an endpoint
  resumed);
- freshness: the policies due (`freshness.evaluate_due`; the late ones too when woken); due at
  the earliest `due_at` of a policy not late; woken on `FRESHNESS` (a policy set, an event of a
  late policy's asset);
- run-timeouts: running runs past their Dag's `dagrun_timeout` (`timeouts.time_out_due_runs`,
  issue 39); due at the earliest `timeout_at` of a running run; woken on `TIMEOUTS` (a run with
  a timeout started; a sync changed a timeout, and then the due times are recomputed first);
- trigger-timeouts: deferred TIs whose trigger timed out, queued to fail, and unused triggers
  deleted (`deferral.time_out_triggers`, issue 42), and TIs awaiting input past their response
  deadline resumed (`hitl.time_out_awaiting_input`); due at the earliest `trigger_timeout` of a
  deferred TI or a TI awaiting input; woken on `TRIGGERS` (a TI deferred or parked with a
  timeout, a deferred TI resumed);
- retention: the periodic clean (`retention.periodic_clean`), due at `retention.next_clean_at`;
- repair: TIs whose worker died, runs a crash left waiting (`repair.repair_task_instances`),
  every TASK_REPAIR_INTERVAL_SECONDS.

The drain and the asset scheduler are not here: the django-q2 cluster runs them, nudged after
the commits that give them work, and nothing else runs there (issue 41: they never wait behind
a delivery, a freshness pass, a clean or a repair).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from ..events_out import delivery, freshness
from ..operations import retention
from ..scheduling import backfills, time_runs, timeouts
from ..sql import wakeups
from ..task_state import deferral, hitl, repair
from .loop import DUE, Timer, Wake


class _TimeSchedules:
    """The time scheduler's round and its next due time, which is "after that round's now": a
    Dag due by then that got no run (at max_active_runs) waits for a wake-up, not a loop."""

    def __init__(self) -> None:
        self.passed_at: datetime | None = None

    def work(self, woken: Wake) -> None:
        now = timezone.now()
        time_runs.create_due_runs(now=now)
        self.passed_at = now
        backfills.start_runs()

    def next_due(self) -> datetime | None:
        return time_runs.next_due_at(after=self.passed_at)


def _deliver(woken: Wake) -> None:
    delivery.deliver(stop_when_idle=True)


def _freshness(woken: Wake) -> None:
    # Late policies wait for an event, not for a time: looked at when something woke the
    # timer (an event of a late policy's asset, a policy set, the start), not at a due time.
    freshness.evaluate_due(include_late=woken != {DUE})


def _time_out_runs(woken: Wake) -> None:
    if woken != {DUE}:
        # Woken (or starting): a Dag's timeout may have changed since the runs' due times.
        timeouts.retime()
    timeouts.time_out_due_runs()


def _time_out_triggers(woken: Wake) -> None:
    deferral.time_out_triggers()
    hitl.time_out_awaiting_input()


def _next_wait_timeout() -> datetime | None:
    """The earliest trigger timeout of a deferred TI or response deadline of a TI awaiting
    input (Human-in-the-loop, issue 42: swept by the same timer)."""
    due = [d for d in (deferral.next_timeout_at(), hitl.next_timeout_at()) if d is not None]
    return min(due) if due else None


def _clean(woken: Wake) -> None:
    retention.periodic_clean()


def _repair(woken: Wake) -> None:
    repair.repair_task_instances()


def _next_repair() -> datetime:
    return timezone.now() + timedelta(seconds=float(settings.TASK_REPAIR_INTERVAL_SECONDS))


def timers() -> list[Timer]:
    """Every timer (each group of `groups`, in order)."""
    return [timer for group in groups().values() for timer in group]


TIME_GROUP = "time"


def groups() -> dict[str, list[Timer]]:
    """The timers by process: the time scheduler alone (its pass over 1,000 due Dags is a
    second of Python, which the delivery's sender threads and the freshness batches slowed
    threefold sharing one interpreter's lock: ticks p99 11 s with every timer busy), webhook
    delivery and freshness, then retention and repair, by name (the child's process name is
    `timers-<name>`). `process.supervise` forks one child per group."""
    time_schedules = _TimeSchedules()
    return {
        TIME_GROUP: [
            Timer(
                "time-scheduler",
                work=time_schedules.work,
                next_due=time_schedules.next_due,
                channels=(wakeups.TIME,),
            )
        ],
        "events": [
            Timer(
                "webhook-delivery",
                work=_deliver,
                next_due=delivery.next_due_at,
                channels=(wakeups.WEBHOOKS,),
            ),
            Timer(
                "freshness",
                work=_freshness,
                next_due=freshness.next_due_at,
                channels=(wakeups.FRESHNESS,),
            ),
        ],
        "upkeep": [
            Timer(
                "run-timeouts",
                work=_time_out_runs,
                next_due=timeouts.next_due_at,
                channels=(wakeups.TIMEOUTS,),
            ),
            Timer(
                "trigger-timeouts",
                work=_time_out_triggers,
                next_due=_next_wait_timeout,
                channels=(wakeups.TRIGGERS,),
            ),
            Timer("retention", work=_clean, next_due=retention.next_clean_at),
            Timer("repair", work=_repair, next_due=_next_repair),
        ],
    }
