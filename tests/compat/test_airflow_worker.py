"""Acceptance of issue 11: stock Airflow Task SDK workers run real Airflow DAG files against the
service, as a new user would run them.

The service starts as the README says (`bin/serve`, here on the test database), Variables and a
Connection are created through the public API, `bin/airflow-worker` (its own cached virtualenv
with task-sdk 1.3.2) syncs `examples/airflow_dags/`, the runs are triggered through the public
API, and the worker claims and runs every TI through Airflow's own `execute_workload`
supervisor until nothing is left. Then every TI's final state, the XCom values, the events the
asset-triggered run consumed, the sensor's reschedule and the triggered run are checked, and
the access log must show no 404, 405 or 5xx on either API.
"""

import re
import subprocess
import time
from pathlib import Path

import pytest
import requests
from django.contrib.auth import get_user_model

from assets_app.api.public_auth import create_api_token
from assets_app.definitions import sync as definitions
from assets_app.models import DagRun, DagRunType, TaskInstance, TaskReschedule, XCom
from tests.proof.conftest import figure

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
MANUAL_DAGS = ("af_producer", "af_branch", "af_retry", "af_settings", "af_sensor", "af_trigger")
# (dag_id, task_id) -> (final state, try_number)
EXPECTED = {
    ("af_producer", "produce"): ("success", 1),
    ("af_consumer", "consume"): ("success", 1),
    ("af_branch", "choose"): ("success", 1),
    ("af_branch", "left"): ("success", 1),
    ("af_branch", "right"): ("skipped", 0),  # skipped while waiting: no try (Airflow's)
    ("af_branch", "join"): ("success", 1),
    ("af_retry", "flaky"): ("success", 2),
    ("af_settings", "read_settings"): ("success", 1),
    ("af_sensor", "wait_for_second_poke"): ("success", 1),
    ("af_trigger", "start_target"): ("success", 1),
    ("af_target", "read_conf"): ("success", 1),
}


def _xcom(dag_id: str, task_id: str):
    return XCom.objects.get(dag_id=dag_id, task_id=task_id, key="return_value").value


def _worker(service, tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            str(ROOT / "bin/airflow-worker"),
            "--dags",
            str(ROOT / "examples/airflow_dags"),
            "--url",
            service["url"],
            "--logs",
            str(tmp_path / "airflow-logs"),
            *args,
        ],
        env={**service["env"], "AIRFLOW_HOME": str(tmp_path / "airflow-home")},
        capture_output=True,
        text=True,
        timeout=900,
    )


# Each TI starts two Python processes importing Airflow: minutes on a small, busy machine.
@pytest.mark.timeout(1500)
def test_stock_task_sdk_worker_runs_the_example_dag_files(service, tmp_path):
    get_user_model().objects.create_superuser("operator", password="x")
    _, key = create_api_token(username="operator", name="acceptance")
    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {key}"
    url = service["url"]
    made = api.post(f"{url}/api/v2/variables", json={"key": "af_greeting", "value": "hello"})
    assert made.status_code == 201, made.text
    made = api.post(
        f"{url}/api/v2/connections",
        json={
            "connection_id": "af_warehouse",
            "conn_type": "postgres",
            "host": "warehouse.example",
            "login": "etl",
            "password": "s3cret-pw",
            "extra": '{"sslmode": "require"}',
        },
    )
    assert made.status_code == 201, made.text

    synced = _worker(service, tmp_path, "--sync-only")
    assert synced.returncode == 0, synced.stderr[-3000:]
    again = _worker(service, tmp_path, "--sync-only")
    assert "8 unchanged" in again.stderr, again.stderr[-2000:]  # idempotent, as sync_dags

    # Issue 44: a JSON-defined Dag (no bundle), triggered while the worker (Airflow's default
    # bundle) claims, is never claimed by it (before: "Dag not found during start up", for ever).
    json_dag = {"dag_id": "json_other", "is_paused": False, "tasks": [{"task_id": "t"}]}
    definitions.sync_definitions(dags=definitions.parse_document(json_dag, file="x.json"))
    for dag_id in (*MANUAL_DAGS, "json_other"):
        body = {"logical_date": None, "conf": {"path": "left"} if dag_id == "af_branch" else {}}
        answer = api.post(f"{url}/api/v2/dags/{dag_id}/dagRuns", json=body)
        assert answer.status_code == 200, answer.text

    started = time.monotonic()
    ran = _worker(
        service,
        tmp_path,
        "--no-sync",
        "--concurrency",
        "6",
        "--idle-exit",
        "20",
        "--max-seconds",
        "600",
    )
    elapsed = time.monotonic() - started
    assert ran.returncode == 0, ran.stderr[-3000:]

    other = TaskInstance.objects.get(dag_id="json_other")
    # Claimed, it would fail to start and be queued again after a retry delay (retry_at).
    assert (other.state, other.claimed_by, other.retry_at) == ("queued", "", None)
    assert "json_other" not in ran.stderr, ran.stderr[-3000:]
    tis = {(ti.dag_id, ti.task_id): ti for ti in TaskInstance.objects.exclude(dag_id="json_other")}
    got = {key: (ti.state, ti.try_number) for key, ti in tis.items()}
    assert got == EXPECTED, ran.stderr[-4000:]
    # Issue 44: each try is printed with the state its supervisor reported, not only the exit
    # code (0 for a try that raised and said so: "exited 0" read as a success).
    assert "af_retry.flaky try 1 ended up_for_retry (supervisor exit 0)" in ran.stderr, ran.stderr
    assert "af_retry.flaky try 2 ended success (supervisor exit 0)" in ran.stderr, ran.stderr
    figure(f"airflow worker: {len(tis)} TIs of 8 Dags in {elapsed:.0f}s, concurrency 6")

    produced = {"rows": 3, "file": "file:///tmp/airflow-demo/orders.csv"}
    assert _xcom("af_producer", "produce") == produced
    consumed = _xcom("af_consumer", "consume")
    assert {item["asset"] for item in consumed} >= {"af_orders", "af_orders_clean"}
    assert all(item["producer_returned"] == produced for item in consumed)
    assert {"asset": "af_orders", "extra": {"rows": 3}, "producer_returned": produced} in consumed
    consumer_run = DagRun.objects.get(dag_id="af_consumer")
    assert consumer_run.run_type == DagRunType.ASSET_TRIGGERED
    assert sorted(e.asset.name for e in consumer_run.consumed_events.all()) == [
        "af_orders",
        "af_orders_clean",
    ]
    assert _xcom("af_branch", "left") == "went left"
    assert _xcom("af_retry", "flaky") == 2
    assert _xcom("af_settings", "read_settings") == {
        "greeting": "hello",
        "host": "warehouse.example",
        "login": "etl",
        "password_length": len("s3cret-pw"),
        "extra": {"sslmode": "require"},
    }
    # Stored encrypted under the service's FERNET_KEY (not this process's): read through its API.
    last_reader = api.get(f"{url}/api/v2/variables/af_last_reader").json()
    assert last_reader["value"] == "af_settings.read_settings"
    sensor = tis[("af_sensor", "wait_for_second_poke")]
    assert TaskReschedule.objects.filter(ti=sensor).count() == 1
    assert _xcom("af_sensor", "wait_for_second_poke") == 1
    target_run = DagRun.objects.get(dag_id="af_target")
    assert target_run.run_type == DagRunType.OPERATOR_TRIGGERED
    assert target_run.run_id.startswith("triggered_by_")
    assert _xcom("af_target", "read_conf") == {"from": "af_trigger"}

    # The access log (gunicorn's, as bin/serve writes it): no refused route or server error.
    lines = service["log"].read_text().splitlines()
    requests_seen = [line for line in lines if re.search(r'"[A-Z]+ /(execution|api/v2)/', line)]
    assert len(requests_seen) > 50
    bad = [line for line in requests_seen if re.search(r'" (404|405|5\d\d) ', line)]
    assert not bad, "\n".join(bad[:20])
