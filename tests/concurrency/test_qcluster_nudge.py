"""End to end through real processes: gunicorn (the service), `manage.py qcluster` (django-q2)
and `manage.py run_worker` (the reference worker). A worker's success reaches a downstream
asset-triggered run through the on-commit drain nudge, well before any sweep could (no sweep
schedule exists in this database)."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection
from django_q.models import Schedule

from assets_app import nudges, runs
from assets_app.models import (
    ComponentHeartbeat,
    DagRun,
    DagRunType,
    TaskInstance,
    TaskOutletAssetReference,
    TIState,
)
from tests.asset_flow import scheduled_dag
from tests.factories import AssetFactory, DagFactory, TaskFactory

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def database_url() -> str:
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        args,
        cwd=ROOT,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, so stopping it stops its children
    )


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the main process only (it stops its own children; a second TERM delivered to
    the whole group can wedge django-q2's signal handler), then SIGKILL to its group."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=15)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=5)


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

    port = free_port()
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
        processes.append(start([python, "manage.py", "qcluster"], env, tmp_path / "qcluster.log"))
        processes.append(
            start(
                [python, "-m", "gunicorn", "project.wsgi", "-b", f"127.0.0.1:{port}", "-w", "2"],
                env,
                tmp_path / "gunicorn.log",
            )
        )
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
                f"http://127.0.0.1:{port}",
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
            stop(process)
