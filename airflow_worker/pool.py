"""Worker processes that import the Task SDK once and supervise one claimed workload at a time,
as Airflow 3.3.2's LocalExecutor does (`airflow/executors/local_executor.py` `_run_worker`).

`Pool(size)` forks `size` processes from a parent that has already imported Airflow's executor
and supervisor modules (LocalExecutor forks its workers from the scheduler the same way), so a
task no longer waits for a new interpreter to import Airflow (about 9 s each on a busy 2-core
machine). Each process takes a workload (the claimed JSON) from its own pipe, validates it with
Airflow's `workloads.All` model and hands it to `BaseExecutor.run_workload`, which calls
`supervise_task`: the supervisor forks the task process and talks to it over its socket, so the
task code runs in its own process exactly as under Airflow, and a task that crashes or calls
`os._exit` takes only that process with it. The exit code comes back on the pipe.

A pool process that dies (killed, or a crash in the supervisor itself) is replaced; the workload
it held is reported as lost with exit code -1 and its TI is left to the service's heartbeat
timeout, as Airflow's scheduler leaves a TI whose worker died.

Issue 44, the stalls: Airflow 3.3.2's supervisor (`ActivitySubprocess._monitor_subprocess`) loops
`while exit_code is None or open sockets` on `selector.select(timeout=min(..., [workers]
min_heartbeat_interval))`, and a task process closes its log and requests sockets itself before
`os._exit` (`supervisor._fork_main`'s `exit`); its stdout/stderr close as the kernel tears the
process down, a moment before the process can be reaped. When the supervisor reads the last EOF
in that moment, it unregisters the last socket, finds no exit code, and sleeps in `select` on an
empty selector for the whole interval (5 s) before it looks again: the slot stays busy 5 s after
a task that took 0.3 s (README, "Airflow workers", has the measurements).
airflow_worker/coordinator.py's supervisor is the stock class plus the task process's pidfd in
that selector, so the `select` returns when the process exits; the pool routes its queues to it
through Airflow 3.3's `[sdk] coordinators` (`route_queues`).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import multiprocessing.connection
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from time import monotonic


def preload() -> None:
    """Import what every supervised task needs, once, before the pool forks."""
    # What the forked task process needs to parse its Dag file: imported after the fork it cost
    # about 10 s per task on a loaded 2-core machine ("Pre Execute" -> "DAG bundles loaded");
    # Airflow's scheduler has these imported when LocalExecutor forks.
    from airflow.dag_processing import dagbag  # noqa: F401
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.executors import workloads  # noqa: F401
    from airflow.executors.base_executor import BaseExecutor  # noqa: F401
    from airflow.sdk import dag, task  # noqa: F401
    from airflow.sdk.execution_time import supervisor, task_runner  # noqa: F401

    from airflow_worker import coordinator  # noqa: F401  (route_queues' coordinator)

    DagBundlesManager()  # reads the bundle configuration once
    from pydantic import TypeAdapter  # noqa: F401


COORDINATOR = "airflow-worker-pool"


def route_queues(queues: Iterable[str]) -> None:
    """Run the Python tasks of `queues` through `PoolCoordinator` (Airflow 3.3's `[sdk]
    coordinators` and `queue_to_coordinator`, read when the first task is supervised), written
    to this process's environment before the pool forks. A queue the configuration already routes
    to a coordinator of its own (a Java task's, say) keeps it."""
    from airflow.sdk.configuration import conf

    specs = conf.getjson("sdk", "coordinators", fallback={}) or {}
    routes = conf.getjson("sdk", "queue_to_coordinator", fallback={}) or {}
    specs[COORDINATOR] = {"classpath": "airflow_worker.coordinator.PoolCoordinator"}
    for queue in queues:
        routes.setdefault(queue, COORDINATOR)
    os.environ["AIRFLOW__SDK__COORDINATORS"] = json.dumps(specs)
    os.environ["AIRFLOW__SDK__QUEUE_TO_COORDINATOR"] = json.dumps(routes)


def _serve(conn: Connection, number: int, logs: Path, server: str, worker: int, cleanup: float):
    """One pool process: workloads in, `(exit code, final state)` out, until the pipe closes or
    gets None. `worker` is the worker's pid, `cleanup` its `--cleanup-time`."""
    import signal

    from airflow.executors import workloads
    from airflow.executors.base_executor import BaseExecutor
    from airflow.sdk.log import configure_logging
    from pydantic import TypeAdapter

    from airflow_worker import coordinator, lifeline

    # A process group of its own: Ctrl-C in a terminal reaches the worker alone, which lets the
    # running tasks finish (its grace period) before it ends them through SIGTERM here (Airflow's
    # supervisor forwards SIGINT and SIGTERM to its task at once). Still ignored if it comes.
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # The worker dies (even SIGKILLed): SIGHUP here. Idle, or between tasks, this process just
    # exits; while it supervises a task, its supervisor ends the task as Airflow's does
    # (coordinator.WakingActivitySubprocess: SIGTERM, SIGKILL after `cleanup`), reports it and
    # exits. Its task processes get SIGTERM if it dies itself (lifeline.task_runner_lifeline).
    signal.signal(signal.SIGHUP, coordinator.worker_gone_signal)
    coordinator.watch_worker(worker, cleanup)
    lifeline.die_with_parent(signal.SIGHUP, worker)
    lifeline.task_runner_lifeline(os.getpid())
    folder = logs / "supervisor"
    folder.mkdir(parents=True, exist_ok=True)
    out = open(folder / f"pool-{number}.log", "ab", buffering=0)  # noqa: SIM115  (process-long)
    os.dup2(out.fileno(), 1)
    os.dup2(out.fileno(), 2)
    try:
        from airflow.settings import dispose_orm

        dispose_orm(do_log=False)
    except Exception:  # no ORM configured: nothing to dispose
        pass
    configure_logging(output=sys.stdout.buffer, json_output=True)
    decoder = TypeAdapter(workloads.All)
    while os.getppid() == worker:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        code = 1
        coordinator.LAST_FINAL_STATE = None
        try:
            workload = decoder.validate_json(message)
            code = BaseExecutor.run_workload(workload, server=server)
        except Exception:  # reported as a failed supervisor, logged
            import traceback

            traceback.print_exc()
        # The task's result as the supervisor reported it to the service (its `final_state`)
        # beside the exit code `supervise_task` returns (the task process's: 0 for a task that
        # failed cleanly and said so, -9 for one SIGKILLed).
        state = coordinator.LAST_FINAL_STATE
        with contextlib.suppress(OSError):  # the worker is gone
            conn.send((int(code), None if state is None else str(getattr(state, "value", state))))
        if os.getppid() != worker:
            # The worker died while this process supervised (its SIGHUP was left to the
            # supervisor): nobody will read the answer, and the pipe's EOF may never come (the
            # pool's other processes hold its ends). Done.
            return


@dataclass
class Slot:
    process: multiprocessing.Process
    conn: Connection
    number: int
    ti: dict | None = None
    started: float = field(default_factory=monotonic)


class Pool:
    """`size` forked supervisor processes. `idle()` counts free ones, `submit(workload)` gives a
    claimed workload to one, `finished()` yields `(ti, exit_code, seconds, final_state)` for each
    done."""

    def __init__(self, size: int, *, logs: Path, server: str, cleanup: float = 5.0) -> None:
        self._context = multiprocessing.get_context("fork")
        self._logs = logs
        self._server = server
        self._cleanup = cleanup
        self._slots = [self._start(number) for number in range(size)]

    def _start(self, number: int) -> Slot:
        parent, child = self._context.Pipe()
        process = self._context.Process(
            target=_serve,
            args=(child, number, self._logs, self._server, os.getpid(), self._cleanup),
            name=f"airflow-worker-pool-{number}",
            daemon=True,
        )
        process.start()
        child.close()
        return Slot(process=process, conn=parent, number=number)

    def idle(self) -> int:
        return sum(slot.ti is None for slot in self._slots)

    def busy(self) -> int:
        return len(self._slots) - self.idle()

    def submit(self, workload: dict) -> None:
        slot = next(slot for slot in self._slots if slot.ti is None)
        slot.ti = workload["ti"]
        slot.started = monotonic()
        slot.conn.send(json.dumps(workload))

    def finished(self, *, restart: bool = True):
        for index, slot in enumerate(self._slots):
            if slot.ti is None:
                continue
            if slot.conn.poll():
                try:
                    answer = slot.conn.recv()
                except EOFError:
                    answer = None
                if answer is not None:
                    ti, slot.ti = slot.ti, None
                    code, state = answer
                    yield ti, code, monotonic() - slot.started, state
                    continue
            if not slot.process.is_alive():
                ti, slot.ti = slot.ti, None
                slot.conn.close()
                if restart:
                    self._slots[index] = self._start(slot.number)
                yield ti, -1, monotonic() - slot.started, None

    def wait(self, timeout: float) -> None:
        """Until a busy process answers or dies, or `timeout` seconds: the worker claims for a
        freed slot as it frees, not at its next poll."""
        waitables = [s.conn for s in self._slots if s.ti is not None]
        waitables += [s.process.sentinel for s in self._slots if s.ti is not None]
        if waitables:
            multiprocessing.connection.wait(waitables, timeout)

    # ---- issue 44: stopping ----
    def signal_busy(self, signum: int) -> None:
        """`signum` to each supervisor with a task (SIGTERM: Airflow's supervisor forwards it to
        its task, whose `on_kill` runs, and goes on monitoring it)."""
        for slot in self._slots:
            if slot.ti is not None and slot.process.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.process.pid, signum)

    def kill_tasks(self) -> None:
        """SIGKILL to the task processes of the supervisors, with their process groups (Airflow's
        supervisor puts each in a group of its own, `setpgid`, so what a task started goes too),
        as the supervisor's `kill()` ends its escalation; the supervisors see the exit and report
        the task's state."""
        kill_task_processes([s.process.pid for s in self._slots if s.process.pid])

    def pids(self) -> list[int]:
        return [s.process.pid for s in self._slots if s.process.pid]

    def close(self, timeout: float = 10) -> None:
        for slot in self._slots:
            with contextlib.suppress(OSError):  # BrokenPipeError: that process is gone
                slot.conn.send(None)
        deadline = monotonic() + timeout
        for slot in self._slots:
            slot.process.join(max(0.0, deadline - monotonic()))
        for slot in self._slots:
            if slot.process.is_alive():
                slot.process.kill()
                slot.process.join(timeout)


def kill_task_processes(supervisors: Iterable[int]) -> None:
    """SIGKILL each child of `supervisors` (their task processes) and its process group when it
    leads one, then every descendant left."""
    import signal

    import psutil

    for pid in supervisors:
        try:
            children = psutil.Process(pid).children()
        except psutil.NoSuchProcess:
            continue
        for child in children:
            with contextlib.suppress(psutil.Error, OSError):
                descendants = child.children(recursive=True)
                if os.getpgid(child.pid) == child.pid:
                    os.killpg(child.pid, signal.SIGKILL)
                child.kill()
                for process in descendants:
                    with contextlib.suppress(psutil.Error):
                        process.kill()
