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
def test_a_pool_process_supervises_tis_one_after_another_and_survives_a_crash(servers, tmp_path):
    web = servers("gunicorn")
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "pool_isolation.py").write_text(DAG)
    out = tmp_path / "out"
    out.mkdir()
    env = {
        **os.environ,
        "WORKER_API_KEY": settings.WORKER_API_KEY,
        "POOL_TEST_OUT": str(out),
        "AIRFLOW_HOME": str(tmp_path / "airflow-home"),
    }
    base = [str(ROOT / "bin/airflow-worker"), "--dags", str(dags), "--url", web.url]
    base += ["--logs", str(tmp_path / "logs")]
    synced = subprocess.run([*base, "--sync-only"], env=env, capture_output=True, text=True)
    assert synced.returncode == 0, synced.stderr[-3000:]
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
