"""Airflow's own REST client (apache-airflow-client 3.3.2, in `.venv-airflow-client`) drives every
public API endpoint of this service against a live server (gunicorn + a django-q2 cluster on the
test database): `airflow_client_check.py` asserts the values each call returns. Then the rows it
left are checked here.

Airflow's own CLI (apache-airflow-ctl 0.1.5, same virtualenv) logs in against the same server as
a user would (issue 49): `airflowctl auth login --username --password` posts to `/auth/token/cli`
and keeps the JWT it gets (AIRFLOW_CLI_DEBUG_MODE: in a file under AIRFLOW_HOME, as there is no
keyring here), and `airflowctl dags list` reads the Dags with it; a wrong password fails the login.
`airflowctl variables|pools|connections import` (Airflow's bulk PATCH) create, then overwrite.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from assets_app.api.public_auth import create_api_token
from assets_app.models import DagRun, Pool, TaskInstance, Variable
from assets_app.runtime import variables
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

    _airflowctl_logs_in_with_a_password(python, web.url, tmp_path / "airflow-home")


def _airflowctl_logs_in_with_a_password(python: Path, url: str, home: Path) -> None:
    home.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")},
        "AIRFLOW_HOME": str(home),
        "AIRFLOW_CLI_DEBUG_MODE": "true",  # the token in a file: no keyring on this machine
        "NO_COLOR": "1",
    }
    airflowctl = str(python.parent / "airflowctl")

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [airflowctl, *argv], env=env, capture_output=True, text=True, timeout=120
        )

    wrong = run("auth", "login", "--api-url", url, "--username", "client", "--password", "no")
    assert wrong.returncode != 0 and "Login failed" in wrong.stdout, wrong.stdout + wrong.stderr
    assert "Invalid credentials" in wrong.stdout, wrong.stdout

    login = run("auth", "login", "--api-url", url, "--username", "client", "--password", "x")
    assert login.returncode == 0, login.stdout + login.stderr
    assert "Login successful" in login.stdout, login.stdout
    listed = run("dags", "list", "--output", "json")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    dags = json.loads(listed.stdout[listed.stdout.index("[") :])
    assert {d["dag_id"] for d in dags} >= {"client_producer", "client_consumer"}, dags

    # The import commands send Airflow's bulk PATCH (create, overwrite by default); run twice,
    # the second overwrites what the first created.
    files = {
        "variables": {"greeting": "hi", "limits": {"value": {"rows": 5}, "description": "d"}},
        "pools": [{"name": "ctl_pool", "slots": 4, "description": "from airflowctl"}],
        "connections": {"ctl_conn": {"conn_type": "http", "host": "h", "password": "s3cret"}},
    }
    for noun, content in files.items():
        path = home / f"{noun}.json"
        path.write_text(json.dumps(content))
        for _ in range(2):
            imported = run(noun, "import", str(path))
            assert imported.returncode == 0, noun + imported.stdout + imported.stderr
    assert Pool.objects.get(name="ctl_pool").slots == 4
    assert variables.value_of(Variable.objects.get(key="limits")) == '{\n  "rows": 5\n}'
    assert variables.get_connection(conn_id="ctl_conn").password == "s3cret"
