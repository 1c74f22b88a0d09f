"""The worker API's task and asset state store (Airflow 3.3.2's `/store/ti` and `/store/asset`,
AIP-103, issue 42): the paths, methods and bodies task-sdk 1.3.2's client sends, Airflow's
answers (validated with the SDK's own models), scopes, replays, bounds and refusals."""

import json
from datetime import UTC, datetime, timedelta
from urllib.parse import quote, urlencode

import pytest

from assets_app.models import AssetStateStore, AuditEntry, TaskStateStore, TIState
from tests.api.snapshots import db_snapshot
from tests.compat.airflow_worker_env import validate_with_sdk
from tests.factories import AssetFactory, DagRunFactory, TaskInstanceFactory

pytestmark = pytest.mark.django_db

ANSWERS: list[tuple[str, object]] = []


@pytest.fixture(scope="module", autouse=True)
def answers_validate_against_the_sdk_models():
    """Every answer below through task-sdk 1.3.2's own models (extra fields refused)."""
    yield
    if ANSWERS:
        assert validate_with_sdk(ANSWERS) == []


def _answer(model: str, response) -> object:
    body = json.loads(response.content)
    ANSWERS.append((model, body))
    return body


def _reason(response) -> str:
    return json.loads(response.content)["detail"]["reason"]


@pytest.fixture
def running():
    return TaskInstanceFactory(running=True, task_id="load")


def _finished_an_hour_ago(ti, state) -> None:
    # `updated_at` is auto_now: set through an UPDATE, past the overtime.
    type(ti).objects.filter(id=ti.id).update(
        state=state, updated_at=datetime.now(UTC) - timedelta(hours=1)
    )


def _key_path(ti, key: str) -> str:
    # As the SDK's client: the key quoted with no safe characters (`/` becomes %2F).
    return f"/store/ti/{ti.id}/{quote(key, safe='')}"


def test_task_state_set_get_replace_delete_clear(worker_api, running):
    ti = running
    missing = worker_api.request("GET", _key_path(ti, "job_id"), ti_id=ti.id)
    assert missing.status_code == 404
    assert _reason(missing) == "not_found"

    expires = datetime(2030, 1, 1, tzinfo=UTC)
    put = worker_api.request(
        "PUT",
        _key_path(ti, "job_id"),
        {"value": "job-1", "expires_at": expires.isoformat()},
        ti_id=ti.id,
    )
    assert put.status_code == 204, put.content
    got = worker_api.request("GET", _key_path(ti, "job_id"), ti_id=ti.id)
    assert _answer("TaskStateStoreResponse", got) == {"value": "job-1"}
    assert TaskStateStore.objects.get().expires_at == expires

    # A replay of the same write, then a new value: one row, the last value, key order kept.
    body = {"value": {"z": 1, "a": [1.5, "x", True]}, "expires_at": None}
    for _ in range(2):
        assert (
            worker_api.request("PUT", _key_path(ti, "job_id"), body, ti_id=ti.id).status_code == 204
        )
    got = worker_api.request("GET", _key_path(ti, "job_id"), ti_id=ti.id)
    assert got.content == b'{"value": {"z": 1, "a": [1.5, "x", true]}}'
    _answer("TaskStateStoreResponse", got)
    row = TaskStateStore.objects.get()
    assert (row.dag_run_id, row.task_id, row.map_index, row.expires_at) == (
        ti.dag_run_id,
        "load",
        -1,
        None,
    )

    # A key with a slash, as the SDK quotes it.
    assert (
        worker_api.request("PUT", _key_path(ti, "a/b c"), {"value": 2}, ti_id=ti.id).status_code
        == 204
    )
    assert TaskStateStore.objects.filter(key="a/b c").exists()

    assert worker_api.request("DELETE", _key_path(ti, "job_id"), ti_id=ti.id).status_code == 204
    # Deleting a missing key is a no-op, as Airflow's.
    assert worker_api.request("DELETE", _key_path(ti, "job_id"), ti_id=ti.id).status_code == 204
    assert list(TaskStateStore.objects.values_list("key", flat=True)) == ["a/b c"]
    assert worker_api.request("DELETE", f"/store/ti/{ti.id}", ti_id=ti.id).status_code == 204
    assert not TaskStateStore.objects.exists()
    # A task's writes to its own state are not audited (as its XComs).
    assert not AuditEntry.objects.exists()


def test_task_state_is_shared_by_tries_and_separate_per_run_and_map_index(worker_api, running):
    ti = running
    worker_api.request("PUT", _key_path(ti, "k"), {"value": 1}, ti_id=ti.id)
    # The next try of the same TI reads it (a retry reattaches to its job).
    ti.try_number = 2
    ti.save(update_fields=["try_number"])
    got = worker_api.request("GET", _key_path(ti, "k"), ti_id=ti.id)
    assert json.loads(got.content) == {"value": 1}

    other_run = TaskInstanceFactory(
        running=True, task_id="load", dag_run=DagRunFactory(dag=ti.dag_run.dag)
    )
    mapped = TaskInstanceFactory(running=True, task_id="load", dag_run=ti.dag_run, map_index=0)
    for other in (other_run, mapped):
        assert worker_api.request("GET", _key_path(other, "k"), ti_id=other.id).status_code == 404


def test_task_state_of_another_ti_is_403(worker_api, running):
    other = TaskInstanceFactory(running=True, dag_run=running.dag_run)
    TaskStateStore.objects.create(
        dag_run=running.dag_run, dag_id=running.dag_id, run_id=running.run_id,
        task_id=running.task_id, key="k", value="1",
    )  # fmt: skip
    for method in ("GET", "DELETE"):
        refused = worker_api.request(method, _key_path(running, "k"), ti_id=other.id)
        assert refused.status_code == 403, method
    refused = worker_api.request("PUT", _key_path(running, "k"), {"value": 2}, ti_id=other.id)
    assert refused.status_code == 403
    assert TaskStateStore.objects.get().value == "1"


def test_stale_try_token_and_finished_ti_write_change_nothing(worker_api, running):
    from assets_app.api import auth

    stale = auth.issue_token(running.id, try_number=1)
    running.try_number = 2
    running.save(update_fields=["try_number"])
    refused = worker_api.request("PUT", _key_path(running, "k"), {"value": 1}, token=stale)
    assert refused.status_code == 409
    assert _reason(refused) == "stale_try"

    _finished_an_hour_ago(running, TIState.FAILED)
    refused = worker_api.request("PUT", _key_path(running, "k"), {"value": 1}, ti_id=running.id)
    assert refused.status_code == 403
    assert _reason(refused) == "task_not_running"
    assert not TaskStateStore.objects.exists()
    # Reading stays allowed to the current try's token.
    assert worker_api.request("GET", _key_path(running, "k"), ti_id=running.id).status_code == 404


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        ({"value": None}, 422, "invalid_value"),
        ({}, 422, "validation_error"),
        ({"value": 1, "ttl": 3}, 422, "validation_error"),
        ({"value": 1, "expires_at": "soon"}, 422, "validation_error"),
    ],
)
def test_bad_task_state_bodies_are_422_and_write_nothing(worker_api, running, body, status, reason):
    before = db_snapshot()
    refused = worker_api.request("PUT", _key_path(running, "k"), body, ti_id=running.id)
    assert refused.status_code == status, refused.content
    assert _reason(refused) == reason
    assert db_snapshot() == before


def test_key_longer_than_airflows_column_is_422_naming_it(worker_api, running):
    ok = worker_api.request("PUT", _key_path(running, "k" * 512), {"value": 1}, ti_id=running.id)
    assert ok.status_code == 204
    refused = worker_api.request(
        "PUT", _key_path(running, "k" * 513), {"value": 1}, ti_id=running.id
    )
    assert refused.status_code == 422
    detail = json.loads(refused.content)["detail"]
    assert detail["reason"] == "too_long"
    assert "key is 513 characters long; at most 512" in detail["message"]
    assert TaskStateStore.objects.count() == 1


def test_unknown_ti_is_404(worker_api):
    import uuid

    ti_id = uuid.uuid4()
    from assets_app.api import auth

    token = auth.issue_token(ti_id, try_number=1)
    missing = worker_api.request("GET", f"/store/ti/{ti_id}/k", token=token)
    assert missing.status_code == 404
    assert f"Task instance {ti_id} not found" in json.loads(missing.content)["detail"]["message"]


# --- asset state --------------------------------------------------------------------------------


def _asset_path(op: str, **params) -> str:
    return f"/store/asset/{op}?{urlencode(params)}"


def test_asset_state_by_name_and_uri_records_the_writer(worker_api, running):
    asset = AssetFactory(name="orders/daily", uri="s3://warehouse/orders/daily")
    ti = running
    missing = worker_api.request(
        "GET", "/store/asset/by-name/value", ti_id=ti.id, name=asset.name, key="watermark"
    )
    assert missing.status_code == 404
    assert _reason(missing) == "not_found"

    put = worker_api.request(
        "PUT",
        _asset_path("by-name/value", name=asset.name, key="watermark"),
        {"value": "2026-01-01T00:00:00+00:00"},
        ti_id=ti.id,
    )
    assert put.status_code == 204, put.content
    by_uri = worker_api.request(
        "GET", "/store/asset/by-uri/value", ti_id=ti.id, uri=asset.uri, key="watermark"
    )
    assert _answer("AssetStateStoreResponse", by_uri) == {"value": "2026-01-01T00:00:00+00:00"}
    row = AssetStateStore.objects.get()
    assert (
        row.last_updated_by_kind,
        row.last_updated_by_dag_id,
        row.last_updated_by_run_id,
        row.last_updated_by_task_id,
        row.last_updated_by_map_index,
    ) == ("task", ti.dag_id, ti.run_id, "load", -1)
    # Audited in the write's transaction, with the TI as actor.
    entry = AuditEntry.objects.get(action="asset_state.set")
    assert entry.detail["ti_id"] == str(ti.id)

    # Replay: one row. Another run's task reads it (asset state outlives runs).
    worker_api.request(
        "PUT",
        _asset_path("by-uri/value", uri=asset.uri, key="watermark"),
        {"value": "2026-01-02T00:00:00+00:00"},
        ti_id=ti.id,
    )
    assert AssetStateStore.objects.count() == 1
    later = TaskInstanceFactory(running=True)
    got = worker_api.request(
        "GET", "/store/asset/by-name/value", ti_id=later.id, name=asset.name, key="watermark"
    )
    assert json.loads(got.content) == {"value": "2026-01-02T00:00:00+00:00"}

    worker_api.request(
        "PUT", _asset_path("by-name/value", name=asset.name, key="n"), {"value": 1}, ti_id=ti.id
    )
    deleted = worker_api.request(
        "DELETE", _asset_path("by-name/value", name=asset.name, key="watermark"), ti_id=ti.id
    )
    assert deleted.status_code == 204
    assert list(AssetStateStore.objects.values_list("key", flat=True)) == ["n"]
    cleared = worker_api.request("DELETE", _asset_path("by-uri/clear", uri=asset.uri), ti_id=ti.id)
    assert cleared.status_code == 204
    assert not AssetStateStore.objects.exists()


def test_asset_state_of_an_unknown_asset_is_404_naming_it(worker_api, running):
    missing = worker_api.request(
        "PUT", _asset_path("by-name/value", name="nope", key="k"), {"value": 1}, ti_id=running.id
    )
    assert missing.status_code == 404
    assert "Asset with name='nope' not found" in json.loads(missing.content)["detail"]["message"]
    missing = worker_api.request(
        "GET", "/store/asset/by-uri/value", ti_id=running.id, uri="s3://nope", key="k"
    )
    assert missing.status_code == 404


def test_asset_state_write_from_a_finished_ti_is_refused(worker_api, running):
    asset = AssetFactory()
    _finished_an_hour_ago(running, TIState.SUCCESS)
    refused = worker_api.request(
        "PUT",
        _asset_path("by-name/value", name=asset.name, key="k"),
        {"value": 1},
        ti_id=running.id,
    )
    assert refused.status_code == 403
    assert not AssetStateStore.objects.exists()


def test_asset_state_needs_name_and_key(worker_api, running):
    refused = worker_api.request("GET", "/store/asset/by-name/value", ti_id=running.id, key="k")
    assert refused.status_code == 422
    refused = worker_api.request(
        "GET", "/store/asset/by-name/value", ti_id=running.id, name="a", key=""
    )
    assert refused.status_code == 422


def test_state_store_needs_a_task_token(worker_api, running):
    assert worker_api.request("GET", _key_path(running, "k")).status_code == 401
    assert (
        worker_api.request("GET", "/store/asset/by-name/value", name="a", key="k").status_code
        == 401
    )


def test_query_counts_are_pinned(worker_api, running, django_assert_num_queries):
    """A task key read: the token's TI (try and state), its scope (run row id), the key; a write
    the same with the upsert instead of the read. Flat: no statement per key or per try."""
    from assets_app.api import auth

    token = auth.issue_token(running.id, try_number=running.try_number)
    worker_api.request("PUT", _key_path(running, "k"), {"value": 1}, token=token)
    with django_assert_num_queries(3):
        worker_api.request("GET", _key_path(running, "k"), token=token)
    # + SAVEPOINT / RELEASE: its own transaction, nested in the test's here.
    with django_assert_num_queries(5):
        worker_api.request("PUT", _key_path(running, "k"), {"value": 2}, token=token)
