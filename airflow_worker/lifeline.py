"""Processes that die with their parent (issue 44: nothing outlives the worker, even when the
worker is SIGKILLed and has no chance to stop what it forked).

`die_with_parent(signum, parent)` asks Linux for a parent-death signal (`prctl(PR_SET_PDEATHSIG)`)
and then checks `os.getppid()`: a parent that died between the fork and the `prctl` call (the
child was re-parented already, so the kernel will never send the signal) is handled at once.
Elsewhere (no Linux prctl) it does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int, parent: int) -> bool:
    """`signum` to this process when the thread that forked it ends; `parent` is the pid that
    forked it (read before the fork). False where the kernel has no such call."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:  # the parent died before prctl: the signal will never come
        with contextlib.suppress(ProcessLookupError):
            os.kill(os.getpid(), signum)
    return True


def task_runner_lifeline(pool_pid: int) -> None:
    """In a pool process (`pool_pid`): every process it forks directly (the supervisor's task
    process) gets SIGTERM when the pool process dies (killed, or a crash in the supervisor).

    SIGTERM, not SIGKILL: it is the signal Airflow's supervisor sends a task to end it (its
    `_forward_signal` and `kill()` escalation start there), and the Task SDK's task runner
    answers it by calling the operator's `on_kill()` (task_runner.py `_on_term`), so whatever
    the task started outside (a pod, a query, a child process) is told to stop. The task runner
    then goes on; a task whose supervisor is gone has no one to report to and ends when its
    code does (the pool process is only SIGKILLed by its worker after the worker's own
    escalation has SIGKILLed the task's process group, so this covers a supervisor that died on
    its own).

    Registered with `os.register_at_fork`, so it runs in the child of every fork of the pool
    process; it acts only in direct children (the hook is inherited by the task process too,
    whose own forks it leaves alone)."""

    def after_in_child() -> None:
        if os.getppid() == pool_pid:
            die_with_parent(signal.SIGTERM, pool_pid)

    os.register_at_fork(after_in_child=after_in_child)
