"""The coordinator the pool runs Python tasks with (airflow_worker/pool.py `route_queues`): Airflow
3.3.2's own, with a supervisor that wakes when its task process exits (issue 44, the stalls: see
pool.py's docstring). Imported only where Airflow is installed (the pool's processes).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import time
from typing import Any

from airflow.sdk.execution_time.coordinator import BaseCoordinator
from airflow.sdk.execution_time.supervisor import ActivitySubprocess


class _PidFd:
    """A process's pidfd, held by the supervisor's selector as its sockets are: readable once the
    process has exited (Linux 5.3+, `os.pidfd_open`)."""

    def __init__(self, pid: int) -> None:
        self._fd = os.pidfd_open(pid)

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


# ---- issue 44: a pool process whose worker died ----
# Set in each pool process (pool._serve): the worker's pid and its `--cleanup-time`.
_WORKER: dict[str, Any] = {"pid": None, "cleanup": 5.0, "supervising": False}
# How long a supervisor whose worker is gone may take to report its task's state (the service may
# be gone as well, and Airflow's client retries for minutes): SIGALRM ends it after that.
REPORT_SECONDS = 10
# The final state the last supervised task reported (`ActivitySubprocess.final_state`), for the
# pool process to send back with the exit code.
LAST_FINAL_STATE: Any = None


def watch_worker(pid: int, cleanup: float) -> None:
    _WORKER.update(pid=pid, cleanup=cleanup)


def worker_gone_signal(_signum: int, _frame: Any) -> None:
    """The pool process's parent-death signal (SIGHUP). While a supervisor waits on its task,
    it has the worker's pidfd in its selector and ends the task itself
    (`WakingActivitySubprocess`); otherwise there is nothing to end: exit."""
    if not _WORKER["supervising"]:
        os._exit(0)


class WakingActivitySubprocess(ActivitySubprocess):
    """Airflow's supervisor with its task process's pidfd in its selector. Its
    `_monitor_subprocess` selects with a timeout of up to `[workers] min_heartbeat_interval` (5 s)
    until the process has an exit code and every socket has reached EOF; when the last EOF comes
    a moment before the process can be reaped, the stock loop selects on no socket at all and
    sleeps the whole timeout. With the pidfd there, `_service_subprocess` returns as the process
    exits and reaps it (`_check_subprocess_exit`). The pidfd is not one of `_open_sockets`: the
    loop still ends on the exit code and those sockets alone; its handler unregisters it."""

    def wait(self) -> int:
        pidfd = worker = None
        if self._exit_code is None and hasattr(os, "pidfd_open"):
            # Reaped already (nothing to wake for), or no pidfd here (a kernel before 5.3, no fd
            # left): the stock supervisor's wait, as it is.
            with contextlib.suppress(OSError):
                pidfd = _PidFd(self.pid)
                self.selector.register(
                    pidfd, selectors.EVENT_READ, (_exited, self.selector.unregister)
                )
            # Issue 44: the worker's pidfd too, readable when the worker dies.
            if _WORKER["pid"] is not None:
                try:
                    worker = _PidFd(_WORKER["pid"])
                except ProcessLookupError:
                    self._worker_gone_at = time.monotonic()
                except OSError:
                    pass
                else:
                    handlers = (self._worker_exited, self.selector.unregister)
                    self.selector.register(worker, selectors.EVENT_READ, handlers)
        _WORKER["supervising"] = True
        try:
            return super().wait()
        finally:
            _WORKER["supervising"] = False
            for fd in (pidfd, worker):
                if fd is not None:
                    fd.close()

    def _worker_exited(self, _pidfd: _PidFd) -> bool:
        self._worker_gone_at = time.monotonic()
        return False

    def _handle_process_overtime_if_needed(self) -> None:
        """The stock check, then (issue 44) the end of a task whose worker died: Airflow's own
        escalation (`kill`: SIGTERM to the task's process group, its `on_kill` runs; SIGKILL
        after the worker's `--cleanup-time`). The supervisor then reports the state as it would
        after any kill (`failed`, or `up_for_retry` with retries left), within REPORT_SECONDS."""
        super()._handle_process_overtime_if_needed()
        if getattr(self, "_worker_gone_at", None) is None or getattr(self, "_ending", False):
            return
        if self._exit_code is not None:
            return
        self._ending = True
        self.process_log.warning(
            "The worker is gone; ending the task", pid=self.pid, cleanup=_WORKER["cleanup"]
        )
        signal.alarm(int(_WORKER["cleanup"]) * 2 + REPORT_SECONDS + 1)
        self.kill(signal.SIGTERM, escalation_delay=float(_WORKER["cleanup"]), force=True)


def _exited(_pidfd: _PidFd) -> bool:
    """The pidfd's handler: nothing to read, the process exited (False: unregister it)."""
    return False


class PoolCoordinator(BaseCoordinator):
    """Airflow 3.3.2's `_PythonCoordinator.execute_task` (`airflow/sdk/execution_time/
    coordinator.py`, the coordinator of every queue no `[sdk] queue_to_coordinator` names) with
    `WakingActivitySubprocess` for `ActivitySubprocess`: the task still runs in a process the
    supervisor forks, and the supervisor is the stock one otherwise."""

    def execute_task(
        self,
        *,
        what: Any,
        dag_rel_path: Any,
        bundle_info: Any,
        client: Any,
        logger: Any = None,
        sentry_integration: str = "",
        subprocess_logs_to_stdout: bool,
        **kwargs: Any,
    ) -> BaseCoordinator.ExecutionResult:
        process = WakingActivitySubprocess.start(
            dag_rel_path=dag_rel_path,
            what=what,
            client=client,
            logger=logger,
            bundle_info=bundle_info,
            subprocess_logs_to_stdout=subprocess_logs_to_stdout,
            sentry_integration=sentry_integration,
        )
        exit_code = process.wait()
        global LAST_FINAL_STATE
        LAST_FINAL_STATE = process.final_state
        return self.ExecutionResult(exit_code, process.final_state)
