"""Issue 26: width and size bounds beside the depth bounds (`limits`): keys per object, list
items, string length, values in all. Every door answers a 422 naming the field and the JSON
path, writes nothing, and refuses before the schema copies the body (the parser's check): a
run conf (POST /api/v2/dags/{id}/dagRuns), an XCom value and an outlet event's extra (the worker
API), and the same rules in the domain functions for the doors without a body (commands).

The wide bodies here pass a limit by one (10,001 keys); `WIDE_CONF_KEYS=400000` reproduces the
issue's 400,000-key conf (it held a web worker ~20 s on a loaded 2-core machine; refused in ~2 s,
most of it parsing the 7 MB body)."""

import json
import os
import time

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from assets_app.api import auth
from assets_app.api.public_auth import create_api_token
from assets_app.guards import exceptions, limits
from assets_app.models import DagRun, XCom
from assets_app.runtime import xcoms
from assets_app.scheduling import runs
from tests.api.snapshots import db_snapshot
from tests.factories import DagFactory, TaskFactory, TaskInstanceFactory

pytestmark = pytest.mark.django_db

WIDE_KEYS = int(os.environ.get("WIDE_CONF_KEYS", limits.MAX_JSON_KEYS + 1))


def wide_object(keys: int = WIDE_KEYS) -> dict[str, int]:
    return {f"k{i}": i for i in range(keys)}


def test_too_wide_names_each_limit_and_the_path():
    assert limits.too_wide({"a": [1, "x", {"b": None}]}) is None
    assert limits.too_wide(wide_object(limits.MAX_JSON_KEYS)) is None
    path, reason, _, limit = limits.too_wide({"a": [0, wide_object()]})
    assert (path, reason, limit) == (".a[1]", "too_wide", limits.MAX_JSON_KEYS)
    path, reason, _, _ = limits.too_wide({"l": [0] * (limits.MAX_JSON_ITEMS + 1)})
    assert (path, reason) == (".l", "too_wide")
    path, reason, _, _ = limits.too_wide({"s": ["x" * (limits.MAX_JSON_STRING + 1)]})
    assert (path, reason) == (".s[0]", "too_long")
    assert limits.too_wide({"x" * (limits.MAX_JSON_STRING + 1): 1})[1] == "too_long"
    many = [[0] * 50_000 for _ in range(limits.MAX_JSON_VALUES // 50_000 + 1)]
    assert limits.too_wide(many)[1] == "too_large"


@pytest.fixture
def api():
    get_user_model().objects.create_superuser("ops", password="pw")
    _, key = create_api_token(username="ops", name="t")
    TaskFactory(dag=DagFactory(dag_id="d"), task_id="t")
    return Client(headers={"Authorization": f"Bearer {key}"})


def test_a_wide_conf_is_a_422_naming_body_conf_and_writes_nothing(api):
    body = json.dumps({"logical_date": None, "conf": wide_object()})
    before = db_snapshot()
    started = time.perf_counter()
    response = api.post("/api/v2/dags/d/dagRuns", data=body, content_type="application/json")
    elapsed = time.perf_counter() - started
    assert response.status_code == 422, response.content[:500]
    (item,) = response.json()["detail"]
    assert item["type"] == "too_wide" and item["loc"] == ["body", "conf"]
    assert f"at most {limits.MAX_JSON_KEYS:,}" in item["msg"]
    assert db_snapshot() == before
    print(f"\n{WIDE_KEYS:,}-key conf ({len(body):,} bytes) refused in {elapsed:.2f} s")

    at_limit = {"logical_date": None, "conf": wide_object(limits.MAX_JSON_KEYS)}
    made = api.post(
        "/api/v2/dags/d/dagRuns", data=json.dumps(at_limit), content_type="application/json"
    )
    assert made.status_code == 200, made.content[:500]


def test_a_long_string_in_a_conf_is_a_422_naming_its_path(api):
    body = {"logical_date": None, "conf": {"s": "x" * (limits.MAX_JSON_STRING + 1)}}
    response = api.post(
        "/api/v2/dags/d/dagRuns", data=json.dumps(body), content_type="application/json"
    )
    assert response.status_code == 422
    (item,) = response.json()["detail"]
    assert (item["type"], item["loc"]) == ("too_long", ["body", "conf", "s"])
    assert not DagRun.objects.exists()


def test_the_domain_applies_the_same_rules_at_every_door():
    TaskFactory(dag=DagFactory(dag_id="d"), task_id="t")
    with pytest.raises(exceptions.InvalidInput) as refused:
        runs.trigger_dag(dag_id="d", conf={"x": wide_object()})
    assert refused.value.reason == "too_wide" and "conf.x" in refused.value.message
    ti = TaskInstanceFactory(running=True)
    with pytest.raises(exceptions.InvalidInput):
        xcoms.push(
            dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id, key="k", value=wide_object()
        )
    assert not DagRun.objects.filter(dag_id="d").exists() and not XCom.objects.exists()


def _worker(ti):
    return Client(headers={"Authorization": f"Bearer {auth.issue_token(ti.id, try_number=1)}"})


def test_a_wide_xcom_value_is_a_422(db):
    ti = TaskInstanceFactory(running=True)
    path = f"/execution/xcoms/{ti.dag_id}/{ti.run_id}/{ti.task_id}/k"
    for value in (wide_object(), list(range(limits.MAX_JSON_ITEMS + 1))):
        response = _worker(ti).post(path, data=json.dumps(value), content_type="application/json")
        assert response.status_code == 422, response.content[:300]
        assert response.json()["detail"]["reason"] == "too_wide"
    assert not XCom.objects.exists()


def test_a_wide_outlet_extra_is_a_422_naming_it_and_the_ti_stays_running():
    ti = TaskInstanceFactory(running=True)
    body = {
        "state": "success",
        "end_date": "2026-06-30T10:05:00+00:00",
        "task_outlets": [{"name": "o", "uri": "o", "type": "Asset"}],
        "outlet_events": [{"dest_asset_key": {"name": "o", "uri": "o"}, "extra": wide_object()}],
    }
    before = db_snapshot()
    response = _worker(ti).patch(
        f"/execution/task-instances/{ti.id}/state",
        data=json.dumps(body),
        content_type="application/json",
    )
    assert response.status_code == 422, response.content[:300]
    detail = response.json()["detail"]
    assert detail["reason"] == "too_wide"
    assert detail["loc"] == ["body", "outlet_events", 0, "extra"]
    assert db_snapshot() == before
