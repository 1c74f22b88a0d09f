"""Issue 26: strings longer than their column are a 422 naming the field on every door, not a
database error (a 500). Each test failed on main before `limits.check_lengths`."""

import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from assets_app.api.public_auth import create_api_token
from assets_app.models import Connection, DagRun, Variable, XCom
from tests.factories import TaskInstanceFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def api():
    get_user_model().objects.create_superuser("ops", password="pw")
    _, key = create_api_token(username="ops", name="t")
    return Client(headers={"Authorization": f"Bearer {key}"})


LONG = "k" * 600  # longer than every column it is sent for


@pytest.fixture
def running_ti():
    return TaskInstanceFactory(running=True, task_id="produce")


# A task id longer than its column is never the token's own task: refused by the token's scope
# (issue 26) before its length is looked at; a key is the TI's own to choose, so its length is.
@pytest.mark.parametrize(
    "part, status, reason", [("key", 422, "too_long"), ("task_id", 403, "xcom_write_not_own")]
)
def test_an_xcom_address_longer_than_its_column_is_refused_naming_it(
    worker_api, running_ti, part, status, reason
):
    address = {"key": "return_value", "task_id": running_ti.task_id, part: LONG}
    path = f"/xcoms/{running_ti.dag_id}/{running_ti.run_id}/{address['task_id']}/{address['key']}"
    response = worker_api.request("POST", path, 1, ti_id=running_ti.id)
    assert response.status_code == status, response.content
    detail = response.json()["detail"]
    assert detail["reason"] == reason
    assert part in detail["message"]
    assert not XCom.objects.exists()


def test_a_variable_key_longer_than_its_column_is_a_422_on_both_apis(api, worker_api, running_ti):
    public = api.post(
        "/api/v2/variables",
        data=json.dumps({"key": LONG, "value": "v"}),
        content_type="application/json",
    )
    assert public.status_code == 422, public.content
    assert public.json()["detail"][0]["loc"][-1] == "key"
    worker = worker_api.request("PUT", f"/variables/{LONG}", {"val": "v"}, ti_id=running_ti.id)
    assert worker.status_code == 422, worker.content
    assert worker.json()["detail"]["reason"] == "too_long"
    assert not Variable.objects.exists()


@pytest.mark.parametrize("field", ["host", "schema", "conn_type"])
def test_a_connection_field_longer_than_its_column_is_a_422_naming_it(api, field):
    body = {"connection_id": "warehouse", "conn_type": "postgres", field: LONG}
    response = api.post(
        "/api/v2/connections", data=json.dumps(body), content_type="application/json"
    )
    assert response.status_code == 422, response.content
    assert response.json()["detail"][0]["loc"] == [field]
    assert not Connection.objects.exists()


def test_a_run_id_longer_than_its_column_is_refused_on_the_execution_door(worker_api, running_ti):
    response = worker_api.request(
        "POST", f"/dag-runs/{running_ti.dag_id}/{'r' * 300}", {}, ti_id=running_ti.id
    )
    assert response.status_code == 422, response.content
    assert response.json()["detail"]["reason"] == "invalid_run_id"
    assert DagRun.objects.count() == 1  # the running TI's own run


# Issue 38: the fuzz's strings past every column found these 500s ("value too long for type
# character varying"): a max_interval policy never looks at its cron and time zone, so they went
# to the database as they came.
@pytest.mark.parametrize(("field", "column"), [("cron", 200), ("timezone", 100)])
def test_a_freshness_field_longer_than_its_column_is_a_422_naming_it(api, field, column):
    from assets_app.models import FreshnessPolicy
    from tests.factories import AssetFactory

    asset = AssetFactory()
    body = {"kind": "max_interval", "interval_seconds": 60, field: "x" * (column + 1)}
    response = api.put(
        f"/api/v2/assets/{asset.pk}/freshness",
        data=json.dumps(body),
        content_type="application/json",
    )
    assert response.status_code == 422, response.content
    assert response.json()["detail"][0]["loc"][-1] == field
    assert not FreshnessPolicy.objects.exists()
    body[field] = "x" * column if field == "cron" else "UTC"
    ok = api.put(
        f"/api/v2/assets/{asset.pk}/freshness",
        data=json.dumps(body),
        content_type="application/json",
    )
    assert ok.status_code == 200, ok.content
