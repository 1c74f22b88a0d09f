"""The timers process's machinery: each timer sleeps until it is due, or until woken.

A `Timer` is a piece of work that becomes due at times the database knows (`next_due`: the
earliest instant anything of it is due, read after each round) or when another process writes
something that makes it due sooner (a NOTIFY on one of its `channels`, `sql/wakeups.py`). Each
timer runs in a thread of its own, so a long round of one (a webhook receiver that takes its
time, a retention clean) never delays another, and none of them shares a worker with the drain
or the asset scheduler (the django-q2 cluster's only work).

One listening connection per process (psycopg's, autocommit) LISTENs on every channel; a
thread reads its notifications and wakes the timers of each channel. Around a round:

- a timer notes what woke it (`Wake`: its channels, `DUE` at its own due time, `START` for the
  first round and after the listener reconnected, when a notification may have been missed),
  runs `work(woken)`, reads `next_due()` and sleeps until then (at least `min_interval`, so a
  storm of notifications makes rounds of work, not a round per notification; at most
  TIMERS_MAX_WAIT_SECONDS, a look at everything in case a wake-up was lost), or until woken;
- a notification that comes during a round makes one more round right after it;
- an error is logged and the timer retries after a capped backoff (the database being away
  is one WARNING line per attempt, any other error a traceback), never exiting the process.

Nothing is kept in memory that the database does not have: a process started (or restarted
after a crash) reads every timer's next due time at once, so what became due while it was down
is done within its first round.

SQLite (no LISTEN): each timer also looks every TIMERS_POLL_SECONDS.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connections
from django.utils import timezone

from ..sql import connection as connection_sql
from ..sql.errors import database_unavailable_reason

logger = logging.getLogger(__name__)

START = "start"  # the first round, and every timer after the listener reconnected
DUE = "due"  # the timer's own next due time came (or its longest wait passed)
Wake = frozenset[str]
BACKOFF_BASE_SECONDS = 1.0
BACKOFF_CAP_SECONDS = 30.0


@dataclass
class Timer:
    """One timer: `work(woken)` does what is due now; `next_due()` says when to look next
    (None: nothing is scheduled, only a wake-up or the longest wait brings the next round)."""

    name: str
    work: Callable[[Wake], Any]
    next_due: Callable[[], datetime | None]
    channels: tuple[str, ...] = ()
    # The least time between the starts of two rounds, however they were woken (and so the
    # shortest sleep, even when something is due at once and cannot be done yet).
    min_interval: float = 0.2
    # Filled in by `run`:
    _pending: set[str] = field(default_factory=set, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _wake: threading.Event = field(default_factory=threading.Event, repr=False)

    def wake(self, reason: str) -> None:
        with self._lock:
            self._pending.add(reason)
        self._wake.set()

    def _take(self) -> Wake:
        with self._lock:
            woken, self._pending = frozenset(self._pending), set()
            self._wake.clear()
        return woken


@dataclass(frozen=True)
class Round:
    """What one round of a timer did (the `on_round` hook of `run`, for tests)."""

    timer: str
    woken: Wake
    ok: bool
    seconds: float
    next_due: datetime | None


def _max_wait() -> float:
    return float(settings.TIMERS_MAX_WAIT_SECONDS)


def _poll() -> float | None:
    """How often a timer looks without a wake-up: never on PostgreSQL (NOTIFY wakes it), every
    TIMERS_POLL_SECONDS on SQLite."""
    return None if connection_sql.supports_listen() else float(settings.TIMERS_POLL_SECONDS)


def _seconds_until(due: datetime | None) -> float:
    if due is None:
        return _max_wait()
    return max(0.0, (due - timezone.now()).total_seconds())


def _run_timer(
    timer: Timer, stop: threading.Event, on_round: Callable[[Round], None] | None
) -> None:
    backoff = BACKOFF_BASE_SECONDS
    try:
        while not stop.is_set():
            woken = timer._take() or frozenset({DUE})
            started = time.monotonic()
            ok, due = False, None
            try:
                close_old_connections()
                timer.work(woken)
                due = timer.next_due()
                ok = True
                backoff = BACKOFF_BASE_SECONDS
            except Exception as exc:  # never exit: log and retry after a backoff
                reason = database_unavailable_reason(exc)
                if reason:
                    logger.warning(
                        "timer %s: %s (%s); retrying in %.0f s", timer.name, reason, exc, backoff
                    )
                else:
                    logger.exception("timer %s failed; retrying in %.0f s", timer.name, backoff)
                with contextlib.suppress(Exception):
                    connections.close_all()
            finally:
                if on_round is not None:
                    on_round(Round(timer.name, woken, ok, time.monotonic() - started, due))
            if ok:
                wait = _seconds_until(due)
            else:
                wait, backoff = backoff, min(backoff * 2, BACKOFF_CAP_SECONDS)
            poll = _poll()
            if poll is not None:
                wait = min(wait, poll)
            wait = max(min(wait, _max_wait()), timer.min_interval - (time.monotonic() - started))
            if timer._wake.wait(wait) and not stop.is_set():
                rest = timer.min_interval - (time.monotonic() - started)
                if rest > 0:
                    stop.wait(rest)
    finally:
        connections.close_all()


class _Listener:
    """The process's LISTEN connection: wakes the timers of each channel it hears about."""

    def __init__(self, timers: Sequence[Timer], stop: threading.Event) -> None:
        self.by_channel: dict[str, list[Timer]] = {}
        for timer in timers:
            for channel in timer.channels:
                self.by_channel.setdefault(channel, []).append(timer)
        self.timers = timers
        self.stop = stop

    def run(self) -> None:
        backoff = BACKOFF_BASE_SECONDS
        first = True
        while not self.stop.is_set():
            conn = None
            try:
                conn = connection_sql.open_listener(*sorted(self.by_channel), using="default")
                if not first:  # notifications may have been sent while it was away
                    for timer in self.timers:
                        timer.wake(START)
                first = False
                backoff = BACKOFF_BASE_SECONDS
                while not self.stop.is_set():
                    for note in conn.notifies(timeout=1.0):
                        for timer in self.by_channel.get(note.channel, ()):
                            timer.wake(note.channel)
            except Exception as exc:
                logger.warning("timers: LISTEN connection lost (%s); again in %.0f s", exc, backoff)
                self.stop.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_CAP_SECONDS)
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()


def run(
    timers: Sequence[Timer],
    *,
    stop: threading.Event,
    on_round: Callable[[Round], None] | None = None,
) -> None:
    """Run every timer in a thread of its own (and, on PostgreSQL, the listener) until `stop`
    is set; returns once every thread has finished its round."""
    threads = []
    if connection_sql.supports_listen() and any(timer.channels for timer in timers):
        listener = _Listener(timers, stop)
        threads.append(threading.Thread(target=listener.run, name="timers-listen", daemon=True))
    for timer in timers:
        timer.wake(START)
        threads.append(
            threading.Thread(
                target=_run_timer,
                args=(timer, stop, on_round),
                name=f"timer-{timer.name}",
                daemon=True,
            )
        )
    for thread in threads:
        thread.start()
    stop.wait()
    for timer in timers:
        timer._wake.set()
    for thread in threads:
        thread.join()
