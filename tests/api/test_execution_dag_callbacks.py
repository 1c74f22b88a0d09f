"""The Dag callback routes (issue 39, our own endpoints under /execution/): a worker's claim
with the worker API key, and its report, idempotent on replay; the claimed item validates with
Airflow 3.3.2's own `DagCallbackRequest` (in the Airflow virtualenv, the slow test)."""

import json
import subprocess

import pytest
from django.conf import settings

from assets_app.models import CallbackState, DagCallbackRequest
from assets_app.scheduling import runs
from tests.api.snapshots import db_snapshot
from tests.compat.airflow_worker_env import ROOT, sdk_python
from tests.test_dag_callbacks import CALLBACKS, run_to_success
from tests.test_dependencies import sync

pytestmark = pytest.mark.django_db


def _claim(worker_api, **body):
    return worker_api.request(
        "POST",
        "/dag-callbacks/claim",
        {"hostname": "w", **body},
        token=settings.WORKER_API_KEY,
    )


def _report(worker_api, pk, body):
    return worker_api.request(
        "POST", f"/dag-callbacks/{pk}/report", body, token=settings.WORKER_API_KEY
    )


@pytest.fixture
def claimed(worker_api):
    sync(CALLBACKS)
    run_to_success(runs.trigger_dag(dag_id="cb", conf={"k": 1}))
    response = _claim(worker_api)
    assert response.status_code == 200, response.content
    (item,) = response.json()["callbacks"]
    return item


def test_a_claim_hands_out_the_request_with_airflows_fields(claimed):
    assert claimed["attempt"] == 1
    assert (claimed["dag_id"], claimed["msg"], claimed["is_failure_callback"]) == (
        "cb",
        "success",
        False,
    )
    context = claimed["context_from_server"]
    assert context["dag_run"]["state"] == "success"
    assert context["dag_run"]["conf"] == {"k": 1}
    assert context["last_ti"]["task_id"] == "c"


def test_a_report_ends_the_request_and_its_replay_writes_nothing(worker_api, claimed):
    pk = claimed["id"]
    body = {"attempt": 1, "state": "failed", "error": "Traceback: Boom"}
    first = _report(worker_api, pk, body)
    assert (first.status_code, first.json()) == (200, {"state": "failed", "replayed": False})
    before = db_snapshot()
    again = _report(worker_api, pk, body)
    assert (again.status_code, again.json()) == (200, {"state": "failed", "replayed": True})
    other = _report(worker_api, pk, {**body, "state": "success"})
    assert other.status_code == 409
    assert other.json()["detail"]["reason"] == "invalid_state"
    assert db_snapshot() == before
    request = DagCallbackRequest.objects.get(id=pk)
    assert (request.state, request.last_error) == (CallbackState.FAILED, "Traceback: Boom")


def test_bad_reports_and_claims_are_refused_and_write_nothing(worker_api, claimed):
    before = db_snapshot()
    pk = claimed["id"]
    assert _report(worker_api, pk + 99, {"attempt": 1, "state": "success"}).status_code == 404
    assert _report(worker_api, pk, {"attempt": 2, "state": "success"}).status_code == 409
    assert _report(worker_api, pk, {"attempt": 1, "state": "running"}).status_code == 422
    assert _claim(worker_api, limit=1000).status_code == 422
    anonymous = worker_api.request("POST", "/dag-callbacks/claim", {"hostname": "w"})
    assert anonymous.status_code == 401
    assert db_snapshot() == before


_VALIDATE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from airflow_worker.dag_callbacks import airflow_request
request = airflow_request(json.load(sys.stdin))
print(json.dumps({"type": request.type, "msg": request.msg,
                  "last_ti": request.context_from_server.last_ti.task_id,
                  "run_state": str(request.context_from_server.dag_run.state.value)}))
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_claimed_item_is_airflows_dag_callback_request(claimed):
    done = subprocess.run(
        [str(sdk_python()), "-c", _VALIDATE, str(ROOT)],
        input=json.dumps(claimed),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "type": "DagCallbackRequest",
        "msg": "success",
        "last_ti": "c",
        "run_state": "success",
    }
