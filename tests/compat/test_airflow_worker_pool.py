"""Issue 27: bin/airflow-worker runs each claimed workload in a process of its pool (the Task SDK
imported once, as Airflow's LocalExecutor), and the supervisor there forks the task: task code
runs in its own process, and a task that kills itself fails alone while the pool process that
supervised it goes on to the next TI."""

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command

from assets_app.models import TaskInstance
from tests.compat.airflow_worker_env import synced_dag_folder

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]

DAG = textwrap.dedent(
    """
    import json, os, signal
    from airflow.sdk import dag, task

    def record(name):
        path = os.path.join(os.environ["POOL_TEST_OUT"], name + ".json")
        with open(path, "w") as out:
            json.dump({"pid": os.getpid(), "ppid": os.getppid()}, out)

    @dag(dag_id="pool_isolation", schedule=None, is_paused_upon_creation=False)
    def pool_isolation():
        @task(task_id="first")
        def first():
            record("first")

        @task(task_id="crash")
        def crash():
            record("crash")
            os.kill(os.getpid(), signal.SIGKILL)  # the task process dies, nothing else

        @task(task_id="last")
        def last():
            record("last")

        first()
        crash()
        last()

    pool_isolation()
    """
)


@pytest.mark.timeout(900)
def test_a_pool_process_supervises_tis_one_after_another_and_survives_a_crash(module_web, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    base, env = synced_dag_folder(
        tmp_path,
        module_web.url,
        {"pool_isolation.py": DAG},
        worker_key=settings.WORKER_API_KEY,
        env={"POOL_TEST_OUT": str(out)},
    )
    call_command("trigger_dag", "pool_isolation")
    worker = subprocess.run(
        [*base, "--no-sync", "--concurrency", "1", "--max-tis", "3", "--idle-exit", "5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=800,
    )
    assert worker.returncode == 0, worker.stderr[-3000:]
    states = dict(TaskInstance.objects.values_list("task_id", "state"))
    assert states == {"first": "success", "crash": "failed", "last": "success"}, worker.stderr[
        -3000:
    ]
    seen = {name: json.loads((out / f"{name}.json").read_text()) for name in states}
    supervisors = {record["ppid"] for record in seen.values()}
    # One pool process supervised all three (concurrency 1), before and after the crash ...
    assert len(supervisors) == 1, seen
    # ... each task in its own forked process, never in the pool process itself.
    assert all(record["pid"] not in supervisors for record in seen.values()), seen
    assert len({record["pid"] for record in seen.values()}) == 3, seen


LINGER_DAG = textwrap.dedent(
    """
    import atexit, os, stat, time
    from airflow.sdk import dag, task

    def close_sockets_then_linger():
        # The end of a task process, widened: every socket to the supervisor reaches EOF (as
        # _fork_main's exit and the kernel close them), and the process is reaped only later.
        for name in os.listdir("/proc/self/fd"):
            try:
                if stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                    os.close(int(name))
            except OSError:
                pass
        time.sleep(2)

    @dag(dag_id="pool_linger", schedule=None, is_paused_upon_creation=False)
    def pool_linger():
        @task(task_id="linger")
        def linger():
            atexit.register(close_sockets_then_linger)  # run by _fork_main's exit

        linger()

    pool_linger()
    """
)


@pytest.mark.timeout(900)
def test_the_supervisor_wakes_when_its_task_process_exits_after_its_sockets_closed(
    module_web, tmp_path
):
    """Issue 44, the stalls: Airflow's supervisor, once every socket of the task process has
    reached EOF, looks for the process's exit only every `[workers] min_heartbeat_interval`
    (a `select` on an empty selector). Here that interval is 120 s and the task process exits
    2 s after closing its sockets: the stock supervisor holds the slot for about 120 s, the
    pool's (a pidfd in the selector) for about 2."""
    base, env = synced_dag_folder(
        tmp_path,
        module_web.url,
        {"pool_linger.py": LINGER_DAG},
        worker_key=settings.WORKER_API_KEY,
        env={"AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "120"},
    )
    call_command("trigger_dag", "pool_linger")
    worker = subprocess.run(
        [*base, "--no-sync", "--concurrency", "1", "--max-tis", "1", "--idle-exit", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=800,
    )
    assert worker.returncode == 0, worker.stderr[-3000:]
    assert TaskInstance.objects.get().state == "success", worker.stderr[-3000:]
    (line,) = [x for x in worker.stderr.splitlines() if "pool_linger.linger try 1 ended" in x]
    seconds = float(line.rsplit("after ", 1)[1].rstrip("s"))
    # 2 s of lingering plus the task's start; the stock supervisor: more than 120 s.
    assert 2 <= seconds < 60, line


def test_the_pool_routes_its_queues_to_its_coordinator_and_keeps_a_configured_one(tmp_path):
    """Issue 44: `pool.route_queues` sends the Python tasks of the worker's queues to
    `PoolCoordinator` through Airflow's own `[sdk]` settings (Airflow's `CoordinatorManager`
    resolves it), and a queue the configuration routes to a coordinator of its own keeps it."""
    python = subprocess.run(
        [str(ROOT / "bin/airflow-worker"), "--python"], capture_output=True, text=True, check=True
    ).stdout.strip()
    script = textwrap.dedent(
        """
        import json, os
        from airflow_worker import pool
        from airflow.sdk.execution_time.coordinator import get_coordinator_manager

        pool.route_queues(["default", "java", "gpu"])
        print(json.dumps({
            "specs": json.loads(os.environ["AIRFLOW__SDK__COORDINATORS"]),
            "routes": json.loads(os.environ["AIRFLOW__SDK__QUEUE_TO_COORDINATOR"]),
            "default": type(get_coordinator_manager().for_queue("default")).__name__,
            "unrouted": type(get_coordinator_manager().for_queue("other")).__name__,
        }))
        """
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "AIRFLOW_HOME": str(tmp_path / "airflow-home"),
        "AIRFLOW__SDK__COORDINATORS": json.dumps({"jdk": {"classpath": "somewhere.Java"}}),
        "AIRFLOW__SDK__QUEUE_TO_COORDINATOR": json.dumps({"java": "jdk"}),
    }
    done = subprocess.run([python, "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["routes"] == {
        "java": "jdk",
        "default": "airflow-worker-pool",
        "gpu": "airflow-worker-pool",
    }
    assert seen["specs"] == {
        "jdk": {"classpath": "somewhere.Java"},
        "airflow-worker-pool": {"classpath": "airflow_worker.coordinator.PoolCoordinator"},
    }
    assert seen["default"] == "PoolCoordinator"
    assert seen["unrouted"] == "_PythonCoordinator"  # a queue the worker does not serve
