"""The timers process (`manage.py run_timers`): a supervisor and the children that run the timers.

The supervisor forks one child per group of timers (`service.groups`: the time scheduler alone,
in TIMERS_TIME_PROCESSES children (2: they claim a tick's due Dags batch by batch with SKIP
LOCKED, so a tick of 1,000 Dags is done by both, each at its own CPU share); webhook delivery
with freshness; retention with repair; each child's process name is `timers-<group>`, as `ps`
and psutil show it), so that no group's Python work slows
another's (they would share one interpreter lock in one process), and forks a child again at
once when it dies (a crash, an out-of-memory kill, SIGKILL): the timers are back within a
second, since a child keeps nothing the database does not have and its first round of each
timer does what came due meanwhile. A child that dies within CRASH_LOOP_SECONDS of its start is
forked again after a backoff (1 s doubling to 30 s), so a child that cannot start does not spin.
SIGTERM or SIGINT to the supervisor stops the children (each ends its rounds) and then the
supervisor; a child also gets SIGTERM when the supervisor dies (Linux's parent-death signal), so
no timer outlives it.

Forking after Django set up is safe here: the supervisor opens no database connection (it
closes any before each fork) and starts no thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.db import connections

from . import loop, service

logger = logging.getLogger(__name__)

CRASH_LOOP_SECONDS = 10.0
BACKOFF_CAP_SECONDS = 30.0
_PR_SET_NAME = 15
_PR_SET_PDEATHSIG = 1


def _as_child(name: str) -> None:
    """Name this process (`timers-<group>`, 15 bytes at most), have it SIGTERMed when its
    parent dies (Linux; elsewhere nothing), and lower the priority of every group but the time
    scheduler's by TIMERS_BACKGROUND_NICE (ticks on time first on a busy host)."""
    nice = int(settings.TIMERS_BACKGROUND_NICE)
    if name != service.TIME_GROUP and nice > 0 and hasattr(os, "nice"):
        os.nice(nice)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
            libc.prctl(_PR_SET_NAME, ctypes.c_char_p(f"timers-{name}".encode()[:15]))


def run_child(
    group: str | None = None, *, on_round: Callable[[loop.Round], None] | None = None
) -> None:
    """Run the timers of the group `group` of `service.groups` (None: every timer, in this one
    process: `--no-supervise`) until SIGTERM or SIGINT."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    timers = service.timers() if group is None else service.groups()[group]
    loop.run(timers, stop=stop, on_round=on_round)


@dataclass
class _Child:
    group: str
    pid: int = 0
    started: float = 0.0
    backoff: float = 1.0
    fork_at: float = 0.0  # when to fork it again (after a crash loop's backoff)


def _fork(child: _Child) -> None:
    connections.close_all()
    pid = os.fork()
    if pid == 0:  # the child
        code = 0
        try:
            _as_child(child.group)
            run_child(child.group)
        except BaseException:
            logger.exception("timers: the child of group %s failed", child.group)
            code = 1
        finally:
            os._exit(code)
    child.pid, child.started = pid, time.monotonic()


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exited {os.WEXITSTATUS(status)}"


def supervise() -> int:
    """Fork the timers' children and fork each again whenever it dies, until SIGTERM or
    SIGINT; returns the exit status for the command."""
    stopping = threading.Event()
    children = [
        _Child(group)
        for group in service.groups()
        for _ in range(int(settings.TIMERS_TIME_PROCESSES) if group == service.TIME_GROUP else 1)
    ]

    def stop(signum: int, _frame: object) -> None:
        stopping.set()
        for child in children:
            if child.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    for child in children:
        _fork(child)
    while True:
        if stopping.is_set() and not any(child.pid for child in children):
            return 0
        waiting = [c.fork_at for c in children if not c.pid and not stopping.is_set()]
        try:
            # A child to fork again after its backoff: wait for a death at most until then.
            pid, status = os.waitpid(-1, os.WNOHANG) if waiting else os.waitpid(-1, 0)
        except ChildProcessError:  # no child alive (all stopped, or all backing off)
            pid, status = 0, 0
        if pid:
            dead = next((c for c in children if c.pid == pid), None)
            if dead is None:
                continue
            dead.pid = 0
            if stopping.is_set():
                continue
            lived = time.monotonic() - dead.started
            if lived >= CRASH_LOOP_SECONDS:
                dead.backoff = 1.0
                logger.warning(
                    "timers: the child of group %s (pid %d) %s after %.0f s; forking a new one",
                    dead.group,
                    pid,
                    _describe(status),
                    lived,
                )
                _fork(dead)
                continue
            logger.warning(
                "timers: the child of group %s (pid %d) %s after %.1f s; forking a new one in "
                "%.0f s",
                dead.group,
                pid,
                _describe(status),
                lived,
                dead.backoff,
            )
            dead.fork_at = time.monotonic() + dead.backoff
            dead.backoff = min(dead.backoff * 2, BACKOFF_CAP_SECONDS)
            continue
        now = time.monotonic()
        for child in children:
            if not child.pid and not stopping.is_set() and child.fork_at <= now:
                _fork(child)
        if waiting:
            stopping.wait(0.1)
