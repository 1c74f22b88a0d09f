"""Airflow DAG files -> definitions (`airflow_worker.dag_files`, run in the Task SDK's own
virtualenv) and their sync through `POST /execution/dags/sync` with sync_dags' validation."""

import json
import subprocess
import textwrap

import pytest

from assets_app.models import Dag, Task
from tests.compat.airflow_worker_env import ROOT, sdk_python
from tests.proof.conftest import app_table_counts

_CONVERT = """
import json, sys
from pathlib import Path
from airflow_worker.dag_files import DagFileError, parse_folder
try:
    files = parse_folder(Path(sys.argv[1]), manual_only=sys.argv[2] == "1")
    print(json.dumps({f.rel_path: f.definitions for f in files}))
except DagFileError as exc:
    print(json.dumps({"error": str(exc)}))
"""


def _convert(folder, *, manual_only=False) -> dict:
    done = subprocess.run(
        [str(sdk_python()), "-c", _CONVERT, str(folder), "1" if manual_only else "0"],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "AIRFLOW_HOME": str(folder / ".airflow"), "PATH": "/usr/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


# Slow: each conversion starts Airflow; the first use of its virtualenv builds it (.ci/run
# builds it beforehand).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def examples():
    return _convert(ROOT / "examples/airflow_dags")


def _dag(examples, file, dag_id):
    return next(d for d in examples[file] if d["dag_id"] == dag_id)


def test_asset_schedule_with_and_or_alias(examples):
    consumer = _dag(examples, "consumer.py", "af_consumer")
    assert consumer["schedule"] == {
        "any": [
            {
                "all": [
                    {"name": "af_orders", "uri": "file:///tmp/airflow-demo/orders.csv"},
                    {"alias": "af_cleaned"},
                ]
            },
            {"name": "af_orders_manual", "uri": "file:///tmp/airflow-demo/orders_manual.csv"},
        ]
    }


def test_tasks_outlets_upstream_trigger_rules_retries(examples):
    (produce,) = _dag(examples, "producer.py", "af_producer")["tasks"]
    assert produce["outlets"] == [
        {"name": "af_orders", "uri": "file:///tmp/airflow-demo/orders.csv"}
    ]
    assert produce["outlet_aliases"] == ["af_cleaned"]
    tasks = {t["task_id"]: t for t in _dag(examples, "branch.py", "af_branch")["tasks"]}
    assert tasks["join"]["upstream"] == ["left", "right"]
    assert tasks["join"]["trigger_rule"] == "none_failed_min_one_success"
    assert "upstream" not in tasks["choose"] and "trigger_rule" not in tasks["left"]
    (flaky,) = _dag(examples, "retry.py", "af_retry")["tasks"]
    assert (flaky["retries"], flaky["retry_delay_seconds"]) == (2, 2.0)


def test_cron_schedule_is_refused_naming_the_dag_unless_manual_only(tmp_path):
    (tmp_path / "nightly.py").write_text(
        textwrap.dedent(
            """
            from airflow.sdk import dag, task

            @dag(dag_id="nightly", schedule="0 3 * * *")
            def nightly():
                task(task_id="t")(lambda: None)()

            nightly()
            """
        )
    )
    refused = _convert(tmp_path)
    assert "nightly.py" in refused["error"] and "'nightly'" in refused["error"]
    assert "--manual-only" in refused["error"]
    synced = _convert(tmp_path, manual_only=True)
    assert synced["nightly.py"][0]["schedule"] is None


@pytest.mark.django_db
def test_sync_endpoint_is_sync_dags_idempotent_and_all_or_nothing(client, examples, settings):
    settings.DAG_SYNC_KEY = "k"
    headers = {"Authorization": "Bearer k"}
    body = {"files": [{"file": f, "definitions": d} for f, d in examples.items()]}

    def sync(payload):
        return client.post(
            "/execution/dags/sync", payload, content_type="application/json", headers=headers
        )

    first = sync(body)
    assert first.status_code == 200, first.content
    assert first.json()["dags_created"] == 8
    assert Dag.objects.get(dag_id="af_consumer").fileloc == "consumer.py"
    assert Task.objects.filter(dag_id="af_branch").count() == 4
    assert sync(body).json()["dags_unchanged"] == 8

    before = app_table_counts()
    broken = {
        "files": [
            *body["files"],
            {
                "file": "bad.py",
                "definitions": [{"dag_id": "x", "tasks": [{"task_id": "t", "colour": 1}]}],
            },
        ]
    }
    refused = sync(broken)
    assert refused.status_code == 422
    detail = refused.json()["detail"]
    assert detail["reason"] == "invalid_definition" and detail["file"] == "bad.py"
    assert app_table_counts() == before
    assert (
        client.post("/execution/dags/sync", body, content_type="application/json").status_code
        == 401
    )


def test_a_mapped_task_is_refused_naming_the_task(tmp_path):
    (tmp_path / "fanout.py").write_text(
        textwrap.dedent(
            """
            from airflow.sdk import dag, task

            @dag(dag_id="fanout", schedule=None)
            def fanout():
                @task(task_id="square")
                def square(x):
                    return x * x

                square.expand(x=[1, 2, 3])

            fanout()
            """
        )
    )
    refused = _convert(tmp_path)
    assert "fanout.py" in refused["error"] and "'fanout'" in refused["error"]
    assert "mapped task(s) 'square'" in refused["error"], refused
