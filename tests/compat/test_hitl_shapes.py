"""The Human-in-the-loop wire shapes (issue 42) against Airflow 3.3.2's own models, in the
Airflow virtualenv: what the Task SDK sends (`CreateHITLDetailPayload`, `UpdateHITLDetail`, the
`awaiting_input` state update as its client builds it) is accepted here; what the service
answers validates with the SDK's `HITLDetailRequest` / `HITLDetailResponse` and airflow-core's
public `HITLDetail`, `HITLDetailCollection` and `HITLDetailResponse`; and the resume event in
`next_kwargs` decodes with the SDK's serde into what `execute_complete` reads (a datetime
`responded_at`)."""

import json
import subprocess
import uuid

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from assets_app.api.public_auth import create_api_token
from assets_app.models import TaskInstance
from tests.api.conftest import WorkerClient
from tests.compat.airflow_worker_env import sdk_python
from tests.factories import TaskInstanceFactory

pytestmark = [pytest.mark.slow, pytest.mark.django_db, pytest.mark.timeout(300)]

_SENT = """
import datetime, json, sys, uuid
from airflow.sdk.api.datamodels._generated import HITLUser, TIAwaitingInputStatePayload
from airflow.sdk.execution_time.comms import AwaitInputTask, CreateHITLDetailPayload
ti_id = uuid.UUID(sys.argv[1])
create = CreateHITLDetailPayload(
    ti_id=ti_id, options=["Approve", "Reject"], subject="Ship?", body="b", defaults=["Reject"],
    multiple=False, params={"n": {"value": 1, "description": None, "schema": {}}},
    assigned_users=[HITLUser(id="1", name="ops")],
)
park = AwaitInputTask(timeout=datetime.timedelta(hours=1), next_method="execute_complete",
                      next_kwargs={})
print(json.dumps({
    "create": json.loads(create.model_dump_json()),
    "park": json.loads(TIAwaitingInputStatePayload(
        **park.model_dump(exclude_unset=True, exclude={"type"})).model_dump_json()),
}))
"""

_CHECK = """
import datetime, json, sys
from airflow.api_fastapi.core_api.datamodels import hitl as core
from airflow.sdk.api.datamodels import _generated as sdk
from airflow.sdk.serde import deserialize
bodies = json.load(sys.stdin)
sdk.HITLDetailRequest.model_validate(bodies["created"])
for body in bodies["worker_reads"]:
    sdk.HITLDetailResponse.model_validate(body)
core.HITLDetailCollection.model_validate(bodies["list"])
core.HITLDetail.model_validate(bodies["one"])
core.HITLDetailResponse.model_validate(bodies["answer"])
event = deserialize(bodies["next_kwargs"])["event"]
assert isinstance(event["responded_at"], datetime.datetime), event
print(json.dumps({"responded_at": event["responded_at"].isoformat()}))
"""


def _python(code: str, *args: str, stdin: str = "") -> dict:
    done = subprocess.run(
        [str(sdk_python()), "-c", code, *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_hitl_bodies_match_airflows_models():
    worker_api = WorkerClient()
    ti = TaskInstanceFactory(running=True, task_id="approve")
    sent = _python(_SENT, str(ti.id))
    get_user_model().objects.create_superuser("ops", password="pw")
    user_id = str(get_user_model().objects.get(username="ops").pk)
    sent["create"]["assigned_users"] = [{"id": user_id, "name": "ops"}]
    created = worker_api.request("POST", f"/hitlDetails/{ti.id}", sent["create"], ti_id=ti.id)
    assert created.status_code == 201, created.content
    unanswered = worker_api.request("GET", f"/hitlDetails/{ti.id}", ti_id=ti.id).json()
    park = worker_api.request("PATCH", f"/task-instances/{ti.id}/state", sent["park"], ti_id=ti.id)
    assert park.status_code == 204, park.content
    _, key = create_api_token(username="ops", name="t")
    api = Client(headers={"Authorization": f"Bearer {key}"})
    path = f"/api/v2/dags/{ti.dag_id}/dagRuns/{ti.run_id}/taskInstances/approve/-1/hitlDetails"
    answer = api.patch(
        path,
        data=json.dumps({"chosen_options": ["Approve"], "params_input": {"n": 2}}),
        content_type="application/json",
    )
    assert answer.status_code == 200, answer.content
    answered = worker_api.request("GET", f"/hitlDetails/{ti.id}", ti_id=ti.id).json()
    resumed = TaskInstance.objects.get(id=ti.id)
    bodies = {
        "created": created.json(),
        "worker_reads": [unanswered, answered],
        "list": api.get("/api/v2/dags/~/dagRuns/~/hitlDetails").json(),
        "one": api.get(path).json(),
        "answer": answer.json(),
        "next_kwargs": resumed.next_kwargs,
    }

    checked = _python(_CHECK, stdin=json.dumps(bodies))

    assert checked["responded_at"].startswith(answer.json()["responded_at"][:19])
    assert uuid.UUID(created.json()["ti_id"]) == ti.id
