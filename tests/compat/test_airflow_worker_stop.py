"""Issue 44: a worker that stops cleanly. SIGTERM stops claiming, lets running tasks finish for
`--grace-period`, then ends the rest as Airflow's supervisor ends a task (SIGTERM: the task's
`on_kill` runs; SIGKILL after `--cleanup-time`; the supervisor reports the state) and exits
leaving no process; a SIGKILLed worker takes its pool and their tasks with it (parent-death
signals). One service for both tests (`module_web`)."""

import contextlib
import signal
import textwrap
import time

import psutil
import pytest
from django.conf import settings
from django.core.management import call_command

from assets_app.models import TaskInstance
from tests.compat.airflow_worker_env import gone, start, stop, synced_dag_folder, tree, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

DAG = textwrap.dedent(
    """
    import os, time
    from airflow.sdk import BaseOperator, dag

    OUT = os.environ["STOP_TEST_OUT"]

    class Sleeper(BaseOperator):
        def __init__(self, *, until_file=None, **kwargs):
            super().__init__(**kwargs)
            self.until_file = until_file

        def execute(self, context):
            open(os.path.join(OUT, self.task_id + ".pid"), "w").write(str(os.getpid()))
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                if self.until_file and os.path.exists(os.path.join(OUT, self.until_file)):
                    return "released"
                time.sleep(0.1)

        def on_kill(self):
            open(os.path.join(OUT, self.task_id + ".on_kill"), "w").write(str(os.getpid()))

    @dag(dag_id="stop_DAGID", schedule=None, is_paused_upon_creation=False)
    def stopping():
        Sleeper(task_id="slow_a")
        Sleeper(task_id="slow_b")
        Sleeper(task_id="quick", until_file="release")

    stopping()
    """
)


def _worker(module_web, tmp_path, dag_id: str, tasks: int, *args: str):
    out = tmp_path / "out"
    out.mkdir()
    base, env = synced_dag_folder(
        tmp_path,
        module_web.url,
        {f"{dag_id}.py": DAG.replace("stop_DAGID", dag_id)},
        worker_key=settings.WORKER_API_KEY,
        env={"STOP_TEST_OUT": str(out)},
    )
    call_command("trigger_dag", dag_id)
    log = tmp_path / "worker.log"
    argv = [*base, "--no-sync", "--concurrency", str(tasks), "--cleanup-time", "2", *args]
    worker = start(argv, env, log)
    return worker, out, log


def _running(out, count: int, log, *, seconds: float = 60) -> list[str]:
    """The tasks running once `count` are (each writes its pid when it starts)."""
    wait_for(
        lambda: len(list(out.glob("*.pid"))) >= count,
        seconds=seconds,
        what=f"{count} tasks running",
        logs=[log],
    )
    return sorted(path.stem for path in out.glob("*.pid"))


@pytest.mark.timeout(300)
def test_sigterm_lets_a_task_finish_in_the_grace_then_ends_the_rest_as_airflow_does(
    module_web, tmp_path
):
    worker, out, log = _worker(module_web, tmp_path, "stop_term", 3, "--grace-period", "60")
    try:
        _running(out, 3, log)
        processes = tree(worker.pid)[1:]  # pool, callback runner, supervisors, task processes
        tasks = {int((out / f"{name}.pid").read_text()) for name in ("slow_a", "slow_b", "quick")}
        assert tasks <= {p.pid for p in processes}
        worker.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        (out / "release").touch()  # quick returns now, inside the grace
        wait_for(
            lambda: "stop_term.quick try 1 ended" in log.read_text(),
            seconds=30,
            what="quick's end",
            logs=[log],
        )
        # In the grace: the slow tasks run on, untouched.
        assert worker.poll() is None and not list(out.glob("*.on_kill")), log.read_text()
        worker.send_signal(signal.SIGTERM)  # the second: end them now
        began = time.monotonic()
        worker.wait(timeout=60)
        took = time.monotonic() - began
    finally:
        if worker.poll() is None:
            stop(worker)
    left = gone(processes, 2)
    for leftover in left:  # a leak fails the test, and does not outlive it
        with contextlib.suppress(psutil.NoSuchProcess):
            leftover.kill()
    text = log.read_text()
    assert worker.returncode == 0, text[-3000:]
    assert not left, [p.pid for p in left]
    states = dict(TaskInstance.objects.values_list("task_id", "state"))
    # Airflow 3.3.2's task runner answers SIGTERM with on_kill() and goes on (task_runner.py
    # `_on_term`); its supervisor's SIGKILL then gives exit -9, and `final_state` FAILED (no
    # retries) is what it reports (`update_task_state_if_needed` -> finish).
    assert states == {"slow_a": "failed", "slow_b": "failed", "quick": "success"}, text[-3000:]
    assert (out / "slow_a.on_kill").exists() and (out / "slow_b.on_kill").exists(), text[-3000:]
    assert "stop_term.quick try 1 ended success (supervisor exit 0)" in text, text[-3000:]
    assert "stop_term.slow_a try 1 ended failed (supervisor exit -9)" in text, text[-3000:]
    assert "SIGTERM: claiming nothing more" in text, text[-3000:]
    assert "stopped on SIGTERM, SIGTERM" in text, text[-3000:]
    # 2 s of cleanup and the supervisors' reports: not the rest of the 60 s grace.
    assert 2 <= took < 20, (took, text[-3000:])


@pytest.mark.timeout(300)
def test_a_sigkilled_worker_takes_its_pool_and_their_tasks_with_it(module_web, tmp_path):
    worker, out, log = _worker(module_web, tmp_path, "stop_kill", 2, "--grace-period", "3")
    try:
        running = _running(out, 2, log)
        processes = tree(worker.pid)[1:]
        assert len(processes) >= 5, processes  # 2 pool processes, 2 tasks, the callback runner
        worker.kill()
        worker.wait(timeout=10)
        # The supervisors end their tasks as when the worker stops them (SIGTERM, 2 s, SIGKILL)
        # and report; nothing of the tree is left a few seconds later.
        left = gone(processes, 12)
    finally:
        if worker.poll() is None:
            stop(worker)
    for leftover in left:  # a leak fails the test, and does not outlive it
        with contextlib.suppress(psutil.NoSuchProcess):
            leftover.kill()
    assert not left, [(p.pid, p.name()) for p in left if psutil.pid_exists(p.pid)]
    assert all((out / f"{name}.on_kill").exists() for name in running), running
    wait_for(
        lambda: (
            set(TaskInstance.objects.filter(task_id__in=running).values_list("state", flat=True))
            == {"failed"}
        ),
        seconds=10,
        what="the supervisors' reports",
        logs=[log],
    )
