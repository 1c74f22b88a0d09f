"""Issue 44: airflow_worker/lifeline.py, the parent-death signals that keep a SIGKILLed worker's
processes from outliving it (the end-to-end checks are in
tests/compat/test_airflow_worker_stop.py; these run in a second)."""

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")

# A "pool process": registers the task-runner lifeline, forks a "task process" that records the
# signal it gets, and a grandchild of that one (which the hook must leave alone).
POOL = textwrap.dedent(
    """
    import os, signal, sys, time
    from airflow_worker import lifeline

    out = sys.argv[1]
    lifeline.task_runner_lifeline(os.getpid())
    pid = os.fork()
    if pid == 0:
        def on_term(signum, frame):
            open(os.path.join(out, "task.on_term"), "w").write(str(os.getpid()))
            os._exit(0)
        signal.signal(signal.SIGTERM, on_term)
        grandchild = os.fork()
        if grandchild == 0:
            signal.signal(signal.SIGTERM, lambda *a: open(os.path.join(out, "grand.on_term"), "w"))
            time.sleep(30)
            os._exit(0)
        open(os.path.join(out, "grand.tmp"), "w").write(str(grandchild))
        os.rename(os.path.join(out, "grand.tmp"), os.path.join(out, "grand.pid"))
        time.sleep(30)
        os._exit(0)
    print(pid, flush=True)
    time.sleep(30)
    """
)


def _gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


def test_a_task_process_gets_sigterm_when_its_pool_process_is_killed(tmp_path):
    pool = subprocess.Popen(
        [sys.executable, "-c", POOL, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    grandchild = None
    try:
        task = int(pool.stdout.readline())
        deadline = time.monotonic() + 10
        while not (tmp_path / "grand.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        grandchild = int((tmp_path / "grand.pid").read_text())
        pool.kill()  # SIGKILL: nothing of the pool process runs
        pool.wait()
        assert _gone(task, 30), "the task process outlived its pool process"
        assert (tmp_path / "task.on_term").read_text() == str(task)  # SIGTERM: its handler ran
        # The hook acts in the pool process's own children only: the task's child is not
        # given a parent-death signal by it.
        time.sleep(0.3)
        assert not (tmp_path / "grand.on_term").exists()
    finally:
        for pid in (pool.pid, grandchild):
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def test_a_parent_that_died_before_prctl_is_caught_by_the_ppid_check():
    """The race: the parent dies between the fork and prctl; the kernel will never signal, so
    `die_with_parent` sends the signal itself."""
    script = textwrap.dedent(
        """
        import os, signal, sys, time
        from airflow_worker import lifeline
        pid = os.fork()
        if pid == 0:
            devnull = os.open(os.devnull, os.O_WRONLY)  # the test reads the parent's stdout
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            parent = os.getppid()
            while os.getppid() == parent:  # wait for the parent to be gone
                time.sleep(0.01)
            lifeline.die_with_parent(signal.SIGKILL, parent)
            time.sleep(30)  # not reached
            os._exit(0)
        print(pid, flush=True)
        os._exit(0)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=30,
    )
    child = int(done.stdout.strip())
    try:
        assert _gone(child, 30), "the orphan lived on"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
