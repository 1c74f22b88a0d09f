"""Airflow's own REST client (apache-airflow-client 3.3.2, in `.venv-airflow-client`) drives every
public API endpoint of this service against a live server (gunicorn + a django-q2 cluster on the
test database): `airflow_client_check.py` asserts the values each call returns. Then the rows it
left are checked here.
"""

import json
import subprocess
import sys

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from assets_app.api.public_auth import create_api_token
from assets_app.models import DagRun, TaskInstance
from tests.proof.conftest import ROOT

from .airflow_env import client_python

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

DAGS = [
    {
        "dag_id": "client_producer",
        "is_paused": False,  # a sync pauses a new Dag unless it says so (issue 39)
        "tags": ["etl", "client"],
        "doc_md": "  # Producer\n  Extracts and loads.",
        "tasks": [
            {
                "task_id": "extract",
                "owner": "data-eng",
                "retries": 1,
                "outlets": [{"name": "client-orders", "uri": "s3://client/orders"}],
                "outlet_aliases": ["client-cleaned"],
            },
            {"task_id": "load"},
        ],
    },
    {
        "dag_id": "client_consumer",
        "is_paused": False,  # a sync pauses a new Dag unless it says so (issue 39)
        "schedule": {"name": "client-orders", "uri": "s3://client/orders"},
        "tasks": [{"task_id": "report"}],
    },
]


def test_airflow_rest_client_drives_every_endpoint(servers, tmp_path, settings):
    python = client_python()
    path = tmp_path / "client_dags.json"
    path.write_text(json.dumps(DAGS))
    call_command("sync_dags", str(path))
    get_user_model().objects.create_user("client", password="x", is_staff=True, is_superuser=True)
    _, key = create_api_token(username="client", name="airflow-client")
    web = servers("gunicorn", workers=3)
    servers("qcluster")

    result = subprocess.run(
        [
            str(python),
            str(ROOT / "tests/compat/airflow_client_check.py"),
            f"--url={web.url}",
            f"--token={key}",  # a key may start with "-"
            f"--worker-api-key={settings.WORKER_API_KEY}",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    sys.stdout.write(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 failed" in result.stdout and "FAIL" not in result.stdout

    manual = DagRun.objects.get(dag_id="client_producer", run_type="manual")
    assert (manual.triggered_by, manual.triggering_user_name, manual.clear_number) == (
        "rest_api",
        "client",
        1,
    )
    assert manual.conf == {"day": 3}
    assert TaskInstance.objects.get(dag_run=manual, task_id="extract").try_number == 2
    assert DagRun.objects.filter(
        dag_id="client_producer", run_type="asset_materialization"
    ).exists()
