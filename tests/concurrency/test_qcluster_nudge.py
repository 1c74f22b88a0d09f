"""End to end through real processes: gunicorn (the service), `manage.py qcluster` (django-q2)
and `manage.py run_worker` (the reference worker). A worker's success reaches a downstream
asset-triggered run through the on-commit drain nudge, well before any sweep could (no sweep
schedule exists in this database)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django_q.models import Schedule

from assets_app.cluster import nudges
from assets_app.models import (
    ComponentHeartbeat,
    DagRun,
    DagRunType,
    TaskInstance,
    TaskOutletAssetReference,
    TIState,
)
from assets_app.scheduling import runs
from tests import servers
from tests.asset_flow import scheduled_dag
from tests.factories import AssetFactory, DagFactory, TaskFactory
from tests.proof.conftest import database_url

ROOT = Path(__file__).resolve().parents[2]


def wait_for(predicate, *, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_worker_success_becomes_a_downstream_run_within_5s_through_qcluster(tmp_path):
    orders = AssetFactory(name="orders", uri="s3://b/orders")
    producer = DagFactory(dag_id="producer")
    produce = TaskFactory(dag=producer, task_id="produce")
    TaskOutletAssetReference.objects.create(task=produce, asset=orders)
    consumer = scheduled_dag("consumer", {"name": "orders", "uri": "s3://b/orders"})
    TaskFactory(dag=consumer, task_id="report")
    assert not Schedule.objects.exists()

    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "ASSET_REGISTRATION_MODE": "queue",
        "CONN_MAX_AGE": "0",
        "PYTHONUNBUFFERED": "1",
    }
    python = sys.executable
    processes = []
    try:
        processes.append(servers.qcluster(env, tmp_path / "qcluster.log"))
        web = servers.gunicorn(env, tmp_path / "gunicorn.log", workers=2)
        processes.append(web)
        # The cluster is up once it has run a task: a scheduler nudge leaves a heartbeat.
        nudges.nudge_scheduler()
        wait_for(
            lambda: ComponentHeartbeat.objects.filter(component="scheduler").exists(),
            timeout=30,
            what=f"qcluster to run a task (log: {tmp_path / 'qcluster.log'})",
        )

        runs.trigger_dag(dag_id="producer")
        worker = subprocess.run(
            [
                python,
                "manage.py",
                "run_worker",
                "--url",
                web.url,
                "--max-tis",
                "1",
                "--task-seconds",
                "0",
                "--max-seconds",
                "30",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert worker.returncode == 0, worker.stdout + worker.stderr
        ti = TaskInstance.objects.get(dag_id="producer")
        assert ti.state == TIState.SUCCESS, worker.stdout

        downstream = wait_for(
            lambda: DagRun.objects.filter(dag=consumer).first(),
            timeout=10,
            what="the downstream run",
        )
        latency = (downstream.created_at - ti.end_date).total_seconds()
        print(f"\nsuccess -> downstream run: {latency * 1000:.0f} ms")
        assert downstream.run_type == DagRunType.ASSET_TRIGGERED
        assert list(downstream.consumed_events.values_list("asset__name", flat=True)) == ["orders"]
        assert latency < 5.0
    finally:
        for process in reversed(processes):
            process.stop()
