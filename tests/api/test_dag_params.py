"""Dag params (issue 39) through the service's own doors: a JSON definition's `params` kept in
order and shown as Airflow's `DAGDetailsResponse.params`; every door that makes a run from a
conf (the public API, a task's trigger over the execution API, a backfill) refuses a conf the
params refuse with Airflow's message and writes nothing. (`tests/compat/test_dag_params.py`
checks the verdicts against the pinned Airflow itself.)"""

import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from assets_app.api.public_auth import create_api_token
from assets_app.definitions import sync as definitions
from assets_app.models import AuditEntry, Backfill, Dag, DagRun
from tests.factories import TaskInstanceFactory

pytestmark = pytest.mark.django_db

PARAMS = {
    # The schema's keys in an order JSONB would not keep: Airflow's message prints them so.
    "count": {"default": 5, "schema": {"type": "integer", "minimum": 3}},
    "day": {"description": "which day", "schema": {"type": "string", "format": "date"}},
    "note": {"default": None, "schema": {"type": ["null", "string"]}, "source": "dag"},
}


def _sync(dag_id="with_params", params=PARAMS, **fields):
    document = {"dag_id": dag_id, "params": params, "tasks": [{"task_id": "t"}], **fields}
    definitions.sync_documents(documents=[(f"{dag_id}.json", document)])
    Dag.objects.filter(dag_id=dag_id).update(is_paused=False)


@pytest.fixture
def api():
    get_user_model().objects.create_user("ops", password="pw", is_staff=True, is_superuser=True)
    _, key = create_api_token(username="ops", name="test")
    return Client(headers={"Authorization": f"Bearer {key}"})


def _trigger(api, conf, dag_id="with_params"):
    return api.post(
        f"/api/v2/dags/{dag_id}/dagRuns",
        data=json.dumps({"conf": conf, "logical_date": None}),
        content_type="application/json",
    )


def test_the_details_show_the_params_as_airflow_does(api):
    _sync()
    details = api.get("/api/v2/dags/with_params/details")
    assert details.status_code == 200, details.content
    assert details.json()["params"] == {
        "count": {"value": 5, "schema": {"type": "integer", "minimum": 3}, "description": None,
                  "source": None},
        "day": {"value": None, "schema": {"type": "string", "format": "date"},
                "description": "which day", "source": None},
        "note": {"value": None, "schema": {"type": ["null", "string"]}, "description": None,
                 "source": "dag"},
    }  # fmt: skip
    # The declared order is kept (the first Param that fails is the one a refusal names).
    assert list(json.loads(Dag.objects.get().params)) == ["count", "day", "note"]


def test_a_conf_the_params_refuse_is_a_400_naming_the_param_and_writes_nothing(api):
    _sync()
    before = AuditEntry.objects.count()
    missing = _trigger(api, {})
    assert missing.status_code == 400, missing.content
    assert missing.json()["detail"] == {
        "reason": "value_error",
        "message": "Invalid input for param day: No value passed",
    }
    low = _trigger(api, {"day": "2026-12-07", "count": 2})
    assert low.status_code == 400
    assert low.json()["detail"]["message"] == (
        "Invalid input for param count: 2 is less than the minimum of 3\n\n"
        "Failed validating 'minimum' in schema:\n    {'type': 'integer', 'minimum': 3}\n\n"
        "On instance:\n    2"
    )
    assert not DagRun.objects.exists()
    assert AuditEntry.objects.count() == before
    accepted = _trigger(api, {"day": "2026-12-07", "extra": [1]})
    assert accepted.status_code == 200, accepted.content
    assert DagRun.objects.get().conf == {"day": "2026-12-07", "extra": [1]}


def test_a_tasks_trigger_over_the_execution_api_is_refused_the_same_way(worker_api):
    _sync()
    running = TaskInstanceFactory(running=True, task_id="produce")
    path = "/dag-runs/with_params/from_task"
    refused = worker_api.request("POST", path, {"conf": {"count": 4}}, ti_id=running.id)
    assert refused.status_code == 400, refused.content
    assert json.loads(refused.content)["detail"] == {
        "reason": "value_error",
        "message": "Invalid input for param day: No value passed",
    }
    assert not DagRun.objects.filter(dag_id="with_params").exists()
    ok = worker_api.request("POST", path, {"conf": {"day": "2026-01-02"}}, ti_id=running.id)
    assert ok.status_code == 204, ok.content


def test_a_backfills_conf_is_checked_against_the_params(api):
    _sync(
        timetable={"kind": "cron_trigger", "cron": "@daily"},
        start_date="2026-01-01T00:00:00Z",
        params={"day": {"default": "2026-01-01", "schema": {"type": "string"}}},
    )
    body = {
        "dag_id": "with_params",
        "from_date": "2026-01-01T00:00:00Z",
        "to_date": "2026-01-02T00:00:00Z",
        "dag_run_conf": {"day": 3},
    }
    refused = api.post("/api/v2/backfills", body, content_type="application/json")
    assert refused.status_code == 422, refused.content
    assert "Invalid input for param day: 3 is not of type 'string'" in refused.content.decode()
    assert not Backfill.objects.exists()
    body["dag_run_conf"] = {"day": "2026-01-05"}
    assert api.post("/api/v2/backfills", body, content_type="application/json").status_code == 200


def test_a_scheduled_dag_whose_params_need_a_conf_is_refused_by_the_json_door():
    document = {
        "dag_id": "daily",
        "timetable": {"kind": "cron_trigger", "cron": "@daily"},
        "params": {"day": {"schema": {"type": "string"}}},
        "tasks": [{"task_id": "t"}],
    }
    with pytest.raises(definitions.DefinitionError) as refused:
        definitions.parse_document(document, file="daily.json")
    assert refused.value.path == "params"
    assert refused.value.message.startswith(
        "Dag 'daily' is not allowed to define a Schedule, as there are required params without "
        "default values, or the default values are not valid."
    )
    document["params"]["day"]["default"] = "monday"
    assert [d.dag_id for d in definitions.parse_document(document, file="daily.json")]


def test_an_unknown_key_of_a_param_is_named_with_the_keys_it_may_have():
    document = {"dag_id": "d", "params": {"p": {"defualt": 1}}, "tasks": []}
    with pytest.raises(definitions.DefinitionError) as refused:
        definitions.parse_document(document, file="d.json")
    assert refused.value.path == "params.p.defualt"
    assert "(allowed: default, description, schema, source)" in refused.value.message
