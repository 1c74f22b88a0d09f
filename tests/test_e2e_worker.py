"""End to end: the real server (runserver, its own process) and the reference worker
(`manage.py run_worker`, another process) over HTTP, on the test database."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from assets_app.models import AssetEventQueue, DagRunState, TIState
from assets_app.scheduling import runs
from tests import servers
from tests.factories import AssetAliasFactory, AssetFactory, DagFactory, TaskFactory
from tests.proof.conftest import database_url

ROOT = Path(__file__).resolve().parent.parent


def subprocess_env() -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": database_url(),
        "WORKER_API_KEY": "e2e-worker-key",
        "ASSET_REGISTRATION_MODE": "queue",
        "PYTHONUNBUFFERED": "1",
    }


@pytest.fixture
def server(tmp_path):
    with servers.runserver(subprocess_env(), tmp_path / "runserver.log") as process:
        yield process.url


@pytest.mark.django_db(transaction=True)
def test_run_worker_finishes_every_task_of_a_triggered_run(server):
    dag = DagFactory(dag_id="e2e")
    for i in range(4):
        task = TaskFactory(dag=dag, task_id=f"t{i}")
        task.outlet_assets.add(AssetFactory(name=f"e2e-{i}", uri=f"s3://e2e/{i}"))
    TaskFactory(dag=dag, task_id="aliased").outlet_aliases.add(AssetAliasFactory(name="e2e-a"))
    run = runs.trigger_dag(dag_id="e2e")

    worker = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "run_worker",
            "--url",
            server,
            "--api-key",
            "e2e-worker-key",
            "--hostname",
            "e2e-worker",
            "--concurrency",
            "3",
            "--task-seconds",
            "0.3",
            "--heartbeat-seconds",
            "0.1",
            "--max-tis",
            "5",
            "--max-seconds",
            "60",
        ],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=90,
    )

    assert worker.returncode == 0, worker.stderr
    assert "done: claimed 5, succeeded 5, failed 0, retried 0, errors 0" in worker.stdout
    tis = list(run.task_instances.all())
    assert len(tis) == 5
    assert {ti.state for ti in tis} == {TIState.SUCCESS}
    assert {ti.hostname for ti in tis} == {"e2e-worker"}
    run.refresh_from_db()
    assert run.state == DagRunState.SUCCESS
    rows = {row.source_task_id: row for row in AssetEventQueue.objects.all()}
    assert set(rows) == {"t0", "t1", "t2", "t3", "aliased"}
    t0_events = rows["t0"].payload["outlet_events"]
    assert [e["dest_asset_key"] for e in t0_events] == [{"name": "e2e-0", "uri": "s3://e2e/0"}]
    assert t0_events[0]["extra"]["written_by"].startswith("e2e-worker/")
    (alias_event,) = rows["aliased"].payload["outlet_events"]
    assert alias_event["source_alias_name"] == "e2e-a"


@pytest.mark.django_db(transaction=True)
def test_run_worker_failures_retry_then_fail_the_run(server):
    dag = DagFactory(dag_id="e2e_fail")
    TaskFactory(dag=dag, task_id="flaky", retries=1)
    run = runs.trigger_dag(dag_id="e2e_fail")

    worker = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "run_worker",
            "--url",
            server,
            "--api-key",
            "e2e-worker-key",
            "--task-seconds",
            "0",
            "--fail-probability",
            "1",
            "--retry-delay",
            "0",
            "--max-tis",
            "2",
            "--max-seconds",
            "60",
        ],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=90,
    )

    assert worker.returncode == 0, worker.stderr
    assert "done: claimed 2, succeeded 0, failed 1, retried 1, errors 0" in worker.stdout
    (ti,) = run.task_instances.all()
    assert (ti.state, ti.try_number) == (TIState.FAILED, 2)
    run.refresh_from_db()
    assert run.state == DagRunState.FAILED
    assert AssetEventQueue.objects.count() == 0
