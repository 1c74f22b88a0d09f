"""Issue 39 end to end: a DAG file that imports a helper module from the Dag folder (as Airflow's
dag-processor and task runner allow: their BundleDagBag puts the folder on `sys.path`) syncs
through the stock Task SDK worker (`bin/airflow-worker`) and its task runs, returning what the
helper gives; the Dag's tags, owners, doc_md and zone come back from the public API as Airflow
shows them."""

from pathlib import Path

import pytest
import requests
from django.contrib.auth import get_user_model

from assets_app.api.public_auth import create_api_token
from assets_app.models import TaskInstance, XCom
from tests.compat.airflow_worker_env import run_worker

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]

HELPER = """
OWNER = "data-eng"


def greeting():
    return "hello from the helper"
"""

DAG_FILE = '''
import pendulum
from airflow.sdk import dag, task

from shared_helpers import OWNER, greeting


@dag(
    dag_id="uses_helper",
    schedule=None,
    start_date=pendulum.datetime(2024, 3, 1, tz="Europe/Zurich"),
    is_paused_upon_creation=False,
    tags=["etl", "helpers"],
    default_args={"owner": OWNER},
    doc_md="""
    # Uses a helper
    Imports a module beside it.
    """,
)
def uses_helper():
    @task
    def greet():
        return greeting()

    greet()


uses_helper()
'''


@pytest.mark.timeout(1200)
def test_a_dag_file_importing_a_helper_beside_it_syncs_runs_and_shows_itself(service, tmp_path):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "shared_helpers.py").write_text(HELPER)
    (dags / "uses_helper.py").write_text(DAG_FILE)
    get_user_model().objects.create_superuser("operator", password="x")
    _, key = create_api_token(username="operator", name="display")
    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {key}"
    url = service["url"]

    synced = run_worker(service, tmp_path, dags, "--sync-only")
    assert synced.returncode == 0, synced.stderr[-3000:]
    assert api.get(f"{url}/api/v2/importErrors").json()["total_entries"] == 0
    details = api.get(f"{url}/api/v2/dags/uses_helper/details").json()
    assert [t["name"] for t in details["tags"]] == ["etl", "helpers"]
    assert details["owners"] == ["data-eng"]
    assert details["doc_md"] == "# Uses a helper\nImports a module beside it."
    assert details["timezone"] == "Europe/Zurich"
    assert details["start_date"] == "2024-02-29T23:00:00Z"

    answer = api.post(f"{url}/api/v2/dags/uses_helper/dagRuns", json={"logical_date": None})
    assert answer.status_code == 200, answer.text
    # One task: the worker leaves once it has run it (not after 20 s of idling).
    ran = run_worker(
        service,
        tmp_path,
        dags,
        "--no-sync",
        "--max-tis",
        "1",
        "--idle-exit",
        "20",
        "--max-seconds",
        "600",
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    ti = TaskInstance.objects.get(dag_id="uses_helper", task_id="greet")
    assert ti.state == "success", ran.stderr[-4000:]
    assert XCom.objects.get(dag_id="uses_helper", key="return_value").value == (
        "hello from the helper"
    )
