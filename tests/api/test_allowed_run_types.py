"""A Dag's `allowed_run_types` (Airflow's, issue 39): every door that makes a run refuses a type
the Dag leaves out with Airflow's status and words, writing nothing; the definition is checked
as Airflow's Dag checks it."""

import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from assets_app.api.public_auth import create_api_token
from assets_app.definitions import sync as definitions
from assets_app.guards import exceptions
from assets_app.models import Asset, Backfill, Dag, DagRun
from assets_app.scheduling import runs
from tests.factories import TaskInstanceFactory

pytestmark = pytest.mark.django_db

DAILY = {"kind": "cron_trigger", "cron": "@daily"}


def _sync(allowed, dag_id="limited", **fields):
    document = {
        "dag_id": dag_id,
        "allowed_run_types": allowed,
        "tasks": [{"task_id": "t", "outlets": ["made"]}],
        **fields,
    }
    definitions.sync_documents(documents=[(f"{dag_id}.json", document)])
    Dag.objects.filter(dag_id=dag_id).update(is_paused=False)


@pytest.fixture
def api():
    get_user_model().objects.create_user("ops", password="pw", is_staff=True, is_superuser=True)
    _, key = create_api_token(username="ops", name="test")
    return Client(headers={"Authorization": f"Bearer {key}"})


def test_a_manual_run_of_a_dag_that_allows_none_is_a_400_in_airflows_words(api):
    _sync(["scheduled"], timetable=DAILY, start_date="2026-01-01T00:00:00Z")
    assert Dag.objects.get().allowed_run_types == ["scheduled"]
    refused = api.post(
        "/api/v2/dags/limited/dagRuns",
        data=json.dumps({"logical_date": None}),
        content_type="application/json",
    )
    assert refused.status_code == 400, refused.content
    assert refused.json()["detail"] == {
        "reason": "denied_run_type",
        "message": "Dag with dag_id: 'limited' does not allow manual runs",
    }
    details = api.get("/api/v2/dags/limited")
    assert details.json()["allowed_run_types"] == ["scheduled"]
    body = {
        "dag_id": "limited",
        "from_date": "2026-01-01T00:00:00Z",
        "to_date": "2026-01-02T00:00:00Z",
    }
    backfill = api.post("/api/v2/backfills", body, content_type="application/json")
    assert backfill.status_code == 400, backfill.content
    assert backfill.json()["detail"]["message"] == (
        "Dag with dag_id: 'limited' does not allow backfill runs"
    )
    assert not DagRun.objects.exists() and not Backfill.objects.exists()


def test_a_tasks_trigger_and_a_materialization_are_refused_the_same_way(worker_api):
    _sync(["manual"])
    running = TaskInstanceFactory(running=True, task_id="produce")
    refused = worker_api.request(
        "POST", "/dag-runs/limited/from_task", {"conf": {}}, ti_id=running.id
    )
    assert refused.status_code == 400, refused.content
    assert json.loads(refused.content)["detail"] == {
        "reason": "denied_run_type",
        "message": "Dag with dag_id 'limited' does not allow operator-triggered runs",
    }
    made = Asset.objects.get(name="made")
    with pytest.raises(exceptions.BadRequest, match="does not allow asset materialization runs"):
        runs.materialize_asset(asset_id=made.pk)
    assert not DagRun.objects.filter(dag_id="limited").exists()
    assert runs.trigger_dag(dag_id="limited").run_type == "manual"


@pytest.mark.parametrize(
    "allowed, fields, message",
    [
        (["manual"], {"timetable": DAILY}, "must include SCHEDULED when the Dag has a schedule"),
        (["manual"], {"schedule": "a"}, "must include ASSET_TRIGGERED when the Dag is scheduled"),
        (["scheduled"], {}, "must include MANUAL when the Dag has no schedule defined"),
        (
            ["asset_triggered"],
            {"schedule": "a", "timetable": DAILY},
            "allowed_run_types without SCHEDULED on a Dag with assets and a time schedule",
        ),
    ],
)
def test_a_definition_is_checked_as_airflows_dag_checks_it(allowed, fields, message):
    document = {"dag_id": "d", "allowed_run_types": allowed, "tasks": [], **fields}
    with pytest.raises(definitions.DefinitionError) as refused:
        definitions.parse_document(document, file="d.json")
    assert refused.value.path == "allowed_run_types"
    assert message in refused.value.message


def test_an_empty_list_allows_every_type_as_airflow_stores_it():
    _sync([])
    assert Dag.objects.get().allowed_run_types is None
    assert runs.trigger_dag(dag_id="limited").run_type == "manual"
