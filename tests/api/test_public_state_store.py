"""Public API v2 state store (issue 42): Airflow 3.3.2's `/state-store` routes for task and asset
keys, their shapes (tests/compat/test_public_schema.py compares them with Airflow's document),
permissions, audit, value bounds, and bad input writing nothing."""

import json
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone

from assets_app.api.public_auth import create_api_token
from assets_app.models import AssetStateStore, AuditEntry, TaskStateStore
from assets_app.runtime import state_store
from tests.api.snapshots import db_snapshot
from tests.factories import AssetFactory, TaskInstanceFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def api():
    get_user_model().objects.create_superuser("ops", password="pw")
    _, key = create_api_token(username="ops", name="test")
    return Client(headers={"Authorization": f"Bearer {key}"})


def _send(api, method, path, body=None):
    return getattr(api, method)(
        f"/api/v2{path}", data=json.dumps(body), content_type="application/json"
    )


def _ti_path(ti) -> str:
    return f"/dags/{ti.dag_id}/dagRuns/{ti.run_id}/taskInstances/{ti.task_id}/state-store"


def test_task_state_crud_and_listing(api):
    ti = TaskInstanceFactory(task_id="load")
    path = _ti_path(ti)
    assert _send(api, "put", f"{path}/job_id", {"value": "job-1"}).status_code == 204
    got = api.get(f"/api/v2{path}/job_id")
    assert got.status_code == 200
    body = got.json()
    assert (body["key"], body["value"]) == ("job_id", "job-1")
    # `expires_at` left out is "default": STATE_STORE_DEFAULT_RETENTION_DAYS (30) from now.
    row = TaskStateStore.objects.get()
    assert timedelta(days=29) < row.expires_at - timezone.now() <= timedelta(days=30)

    # null never expires; PATCH replaces the value and keeps the expiry.
    assert _send(api, "put", f"{path}/n", {"value": 1, "expires_at": None}).status_code == 204
    patched = _send(api, "patch", f"{path}/n", {"value": {"b": 2}})
    assert (patched.status_code, patched.content) == (200, b"null")
    n = TaskStateStore.objects.get(key="n")
    assert (n.value, n.expires_at) == ('{"b": 2}', None)
    assert _send(api, "patch", f"{path}/missing", {"value": 1}).status_code == 404

    listed = api.get(f"/api/v2{path}", {"limit": 1, "offset": 1}).json()
    assert listed["total_entries"] == 2
    assert [e["key"] for e in listed["task_state_store"]] == ["n"]
    assert listed["task_state_store"][0]["value"] == {"b": 2}

    assert api.delete(f"/api/v2{path}/job_id").status_code == 204
    assert api.get(f"/api/v2{path}/job_id").status_code == 404
    assert api.delete(f"/api/v2{path}").status_code == 204
    assert not TaskStateStore.objects.exists()
    actions = list(
        AuditEntry.objects.filter(action__startswith="task_state")
        .order_by("id")
        .values_list("action", "actor_name")
    )
    assert actions == [
        ("task_state.set", "ops"),
        ("task_state.set", "ops"),
        ("task_state.set", "ops"),
        ("task_state.delete", "ops"),
        ("task_state.clear", "ops"),
    ]


def test_clear_of_every_map_index(api):
    first = TaskInstanceFactory(task_id="mapped", map_index=0)
    second = TaskInstanceFactory(task_id="mapped", map_index=1, dag_run=first.dag_run)
    for ti in (first, second):
        state_store.set_task_value(scope=state_store.task_scope(ti_id=ti.id), key="k", value=1)
    # map_index -1 does not exist for an expanded task: a plain clear is a 404 ...
    assert api.delete(f"/api/v2{_ti_path(first)}").status_code == 404
    # ... all_map_indices clears every index.
    assert api.delete(f"/api/v2{_ti_path(first)}?all_map_indices=true").status_code == 204
    assert not TaskStateStore.objects.exists()


def test_writes_to_an_unknown_task_instance_are_404_naming_it(api):
    ti = TaskInstanceFactory(task_id="load")
    path = f"/dags/{ti.dag_id}/dagRuns/{ti.run_id}/taskInstances/nope/state-store/k"
    missing = _send(api, "put", path, {"value": 1})
    assert missing.status_code == 404
    assert "task_id='nope', map_index=-1" in missing.content.decode()
    listed = api.get(f"/api/v2/dags/{ti.dag_id}/dagRuns/{ti.run_id}/taskInstances/nope/state-store")
    assert listed.json() == {"task_state_store": [], "total_entries": 0}


@pytest.mark.parametrize(
    "body",
    [{"value": None}, {"value": 1, "extra": 2}, {}, {"value": "x" * 70_000}],
    ids=["null", "unknown_field", "no_value", "over_max_value_storage_bytes"],
)
def test_bad_bodies_are_422_and_write_nothing(api, body):
    ti = TaskInstanceFactory(task_id="load")
    asset = AssetFactory()
    before = db_snapshot()
    for path in (f"{_ti_path(ti)}/k", f"/assets/{asset.pk}/state-store/k"):
        refused = _send(api, "put", path, body)
        assert refused.status_code == 422, (path, refused.content)
    assert db_snapshot() == before


def test_value_size_limit_names_the_setting(api, settings):
    settings.STATE_STORE_MAX_VALUE_BYTES = 10
    asset = AssetFactory()
    refused = _send(api, "put", f"/assets/{asset.pk}/state-store/k", {"value": "x" * 20})
    assert refused.status_code == 422
    assert "value exceeds max_value_storage_bytes (10)" in refused.content.decode()
    settings.STATE_STORE_MAX_VALUE_BYTES = 0  # no limit
    ok = _send(api, "put", f"/assets/{asset.pk}/state-store/k", {"value": "x" * 20})
    assert ok.status_code == 204


def test_asset_state_crud_with_the_writer(api):
    asset = AssetFactory()
    ti = TaskInstanceFactory(task_id="load")
    state_store.set_asset_value(
        asset=asset,
        key="from_task",
        value=[1, 2],
        writer=state_store.Writer(
            kind="task", dag_id=ti.dag_id, run_id=ti.run_id, task_id="load", map_index=-1
        ),
        actor=None,
    )
    path = f"/assets/{asset.pk}/state-store"
    assert _send(api, "put", f"{path}/watermark", {"value": "2026-01-01"}).status_code == 204
    listed = api.get(f"/api/v2{path}").json()
    assert listed["total_entries"] == 2
    by_key = {e["key"]: e for e in listed["asset_state_store"]}
    assert by_key["watermark"]["last_updated_by"] == {
        "kind": "api",
        "dag_id": None,
        "run_id": None,
        "task_id": None,
        "map_index": None,
    }
    assert by_key["from_task"]["last_updated_by"]["task_id"] == "load"
    assert api.get(f"/api/v2{path}/watermark").json()["value"] == "2026-01-01"
    assert api.delete(f"/api/v2{path}/watermark").status_code == 204
    assert api.get(f"/api/v2{path}/watermark").status_code == 404
    assert api.delete(f"/api/v2{path}").status_code == 204
    assert not AssetStateStore.objects.exists()
    assert api.get("/api/v2/assets/999999/state-store").status_code == 404


def test_each_route_needs_its_permission():
    user = get_user_model().objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_taskstatestore"))
    _, key = create_api_token(username="viewer", name="t")
    viewer = Client(headers={"Authorization": f"Bearer {key}"})
    ti = TaskInstanceFactory(task_id="load")
    asset = AssetFactory()
    assert viewer.get(f"/api/v2{_ti_path(ti)}").status_code == 200
    refused = _send(viewer, "put", f"{_ti_path(ti)}/k", {"value": 1})
    assert refused.status_code == 403
    assert viewer.get(f"/api/v2/assets/{asset.pk}/state-store").status_code == 403
    assert Client().get(f"/api/v2{_ti_path(ti)}").status_code == 401
    assert not TaskStateStore.objects.exists()
