"""The timers process (`manage.py run_timers`): a supervisor and the child that runs the timers.

The supervisor forks a child that runs every timer (`loop.run(service.timers())`) and forks a
new one at once when it dies (a crash, an out-of-memory kill, SIGKILL), so the timers are back
within a second: the child keeps nothing the database does not have, and its first round of
each timer does what came due meanwhile. A child that dies within CRASH_LOOP_SECONDS of its
start is forked again after a backoff (1 s doubling to 30 s), so a child that cannot start does
not spin. SIGTERM or SIGINT to the supervisor stops the child (it ends its rounds) and then the
supervisor; the child also gets SIGTERM when the supervisor dies (Linux's parent-death signal),
so no timer outlives it.

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

from django.db import connections

from . import loop, service

logger = logging.getLogger(__name__)

CRASH_LOOP_SECONDS = 10.0
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """SIGTERM this process when its parent dies (Linux; elsewhere nothing)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def run_child(*, on_round: Callable[[loop.Round], None] | None = None) -> None:
    """Run every timer until SIGTERM or SIGINT (the child's work; also `--no-supervise`)."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    loop.run(service.timers(), stop=stop, on_round=on_round)


def supervise() -> int:
    """Fork the timers' child and fork it again whenever it dies, until SIGTERM or SIGINT;
    returns the exit status for the command."""
    stopping = threading.Event()
    child = {"pid": 0}

    def stop(signum: int, _frame: object) -> None:
        stopping.set()
        if child["pid"]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child["pid"], signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    backoff = 1.0
    while not stopping.is_set():
        connections.close_all()
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:  # the child
            code = 0
            try:
                _die_with_parent()
                run_child()
            except BaseException:
                logger.exception("timers: the child failed")
                code = 1
            finally:
                os._exit(code)
        child["pid"] = pid
        _, status = os.waitpid(pid, 0)
        child["pid"] = 0
        if stopping.is_set():
            break
        lived = time.monotonic() - started
        how = (
            f"killed by signal {os.WTERMSIG(status)}"
            if os.WIFSIGNALED(status)
            else f"exited {os.WEXITSTATUS(status)}"
        )
        if lived >= CRASH_LOOP_SECONDS:
            backoff = 1.0
            logger.warning(
                "timers: the child (pid %d) %s after %.0f s; forking a new one", pid, how, lived
            )
            continue
        logger.warning(
            "timers: the child (pid %d) %s after %.1f s; forking a new one in %.0f s",
            pid,
            how,
            lived,
            backoff,
        )
        stopping.wait(backoff)
        backoff = min(backoff * 2, 30.0)
    return 0
