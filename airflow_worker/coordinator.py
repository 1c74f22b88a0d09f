"""The coordinator the pool runs Python tasks with (airflow_worker/pool.py `route_queues`): Airflow
3.3.2's own, with a supervisor that wakes when its task process exits (issue 44, the stalls: see
pool.py's docstring). Imported only where Airflow is installed (the pool's processes).
"""

from __future__ import annotations

import contextlib
import os
import selectors
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


class WakingActivitySubprocess(ActivitySubprocess):
    """Airflow's supervisor with its task process's pidfd in its selector. Its
    `_monitor_subprocess` selects with a timeout of up to `[workers] min_heartbeat_interval` (5 s)
    until the process has an exit code and every socket has reached EOF; when the last EOF comes
    a moment before the process can be reaped, the stock loop selects on no socket at all and
    sleeps the whole timeout. With the pidfd there, `_service_subprocess` returns as the process
    exits and reaps it (`_check_subprocess_exit`). The pidfd is not one of `_open_sockets`: the
    loop still ends on the exit code and those sockets alone; its handler unregisters it."""

    def wait(self) -> int:
        pidfd = None
        if self._exit_code is None and hasattr(os, "pidfd_open"):
            # Reaped already (nothing to wake for), or no pidfd here (a kernel before 5.3, no fd
            # left): the stock supervisor's wait, as it is.
            with contextlib.suppress(OSError):
                pidfd = _PidFd(self.pid)
                self.selector.register(
                    pidfd, selectors.EVENT_READ, (_exited, self.selector.unregister)
                )
        try:
            return super().wait()
        finally:
            if pidfd is not None:
                pidfd.close()


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
        return self.ExecutionResult(exit_code, process.final_state)
