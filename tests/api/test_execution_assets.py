"""GET /execution/assets/... and /execution/asset-events/...: Airflow's response shapes."""

from datetime import datetime, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from assets_app.api.public_auth import create_api_token
from tests.factories import (
    AssetAliasFactory,
    AssetEventFactory,
    AssetFactory,
    DagRunFactory,
    TaskInstanceFactory,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def token_ti():
    return TaskInstanceFactory()


def get(worker_api, token_ti, path, **params):
    return worker_api.request("GET", path, ti_id=token_ti.id, **params)


def test_asset_by_name_and_by_uri(worker_api, token_ti):
    AssetFactory(name="orders", uri="s3://bucket/orders", extra={"owner": "sales"})
    expected = {
        "name": "orders",
        "uri": "s3://bucket/orders",
        "group": "asset",
        "extra": {"owner": "sales"},
    }
    by_name = get(worker_api, token_ti, "/assets/by-name", name="orders")
    by_uri = get(worker_api, token_ti, "/assets/by-uri", uri="s3://bucket/orders")
    assert (by_name.status_code, by_name.json()) == (200, expected)
    assert (by_uri.status_code, by_uri.json()) == (200, expected)


def test_unknown_asset_is_404(worker_api, token_ti):
    response = get(worker_api, token_ti, "/assets/by-name", name="nope")
    assert response.status_code == 404
    assert response.json() == {
        "detail": {"reason": "not_found", "message": "Asset with name nope not found"}
    }


def test_assets_need_a_token(worker_api):
    response = worker_api.request("GET", "/assets/by-name", name="orders")
    assert response.status_code == 401


def test_assets_by_alias(worker_api, token_ti):
    alias = AssetAliasFactory(name="cleaned")
    alias.assets.add(AssetFactory(name="b"), AssetFactory(name="a"))
    response = get(worker_api, token_ti, "/assets/by-alias", alias_name="cleaned")
    assert response.status_code == 200
    assert [a["name"] for a in response.json()] == ["a", "b"]


def test_a_consuming_run_not_started_reports_when_it_was_queued_as_its_start_date(
    worker_api, token_ti
):
    """Airflow's `DagRunAssetReference.start_date` is required; its `DagRun.set_state` clears
    `start_date` while a run is queued and sets `queued_at`. Both APIs build the reference in
    one place (`run_reference_fields`) and give a run not started its `queued_at`, never its
    `run_after` (which may lie ahead)."""
    asset = AssetFactory(name="orders", uri="s3://bucket/orders")
    event = AssetEventFactory(asset=asset)
    now = timezone.now().replace(microsecond=0)  # the wire carries milliseconds
    queued_at, run_after = now - timedelta(minutes=5), now + timedelta(hours=1)
    run = DagRunFactory(state="queued", start_date=None, queued_at=queued_at, run_after=run_after)
    run.consumed_links.create(dag=run.dag, asset_event=event)

    execution = get(worker_api, token_ti, "/asset-events/by-asset", name="orders").json()
    get_user_model().objects.create_user("ops", password="pw", is_superuser=True)
    _, key = create_api_token(username="ops", name="test")
    public_api = Client(headers={"Authorization": f"Bearer {key}"})
    public = public_api.get("/api/v2/assets/events", {"asset_id": asset.id}).json()

    (from_worker_api,) = execution["asset_events"][0]["created_dagruns"]
    (from_public_api,) = public["asset_events"][0]["created_dagruns"]
    for reference in (from_worker_api, from_public_api):
        assert datetime.fromisoformat(reference["start_date"]) == queued_at


def test_asset_events_by_asset_with_consuming_runs(worker_api, token_ti):
    asset = AssetFactory(name="orders", uri="s3://bucket/orders")
    now = timezone.now()
    old = AssetEventFactory(asset=asset, timestamp=now - timedelta(hours=2), extra={"n": 1})
    new = AssetEventFactory(
        asset=asset,
        timestamp=now - timedelta(hours=1),
        extra={"n": 2},
        source_dag_id="up",
        source_run_id="r",
        source_task_id="t",
    )
    AssetEventFactory()  # another asset's event
    run = DagRunFactory()
    run.consumed_links.create(dag=run.dag, asset_event=new)

    response = get(worker_api, token_ti, "/asset-events/by-asset", name="orders")

    assert response.status_code == 200
    events = response.json()["asset_events"]
    assert [e["id"] for e in events] == [old.id, new.id]
    assert set(events[1]) == {
        "id",
        "timestamp",
        "extra",
        "asset",
        "created_dagruns",
        "source_task_id",
        "source_dag_id",
        "source_run_id",
        "source_map_index",
        "partition_key",
    }
    assert events[1]["asset"] == {
        "name": "orders",
        "uri": "s3://bucket/orders",
        "group": "asset",
        "extra": {},
    }
    (created,) = events[1]["created_dagruns"]
    assert created["run_id"] == run.run_id and created["dag_id"] == run.dag_id
    assert created["start_date"] is not None  # required by Airflow's model: queued_at if unstarted
    assert events[0]["created_dagruns"] == []

    newest_first = get(
        worker_api, token_ti, "/asset-events/by-asset", uri="s3://bucket/orders", ascending=False
    )
    assert [e["id"] for e in newest_first.json()["asset_events"]] == [new.id, old.id]
    windowed = get(
        worker_api,
        token_ti,
        "/asset-events/by-asset",
        name="orders",
        after=(now - timedelta(minutes=90)).isoformat(),
        limit=5,
    )
    assert [e["id"] for e in windowed.json()["asset_events"]] == [new.id]


def test_asset_events_without_name_or_uri_is_400(worker_api, token_ti):
    response = get(worker_api, token_ti, "/asset-events/by-asset")
    assert response.status_code == 400
    assert response.json() == {
        "detail": {"reason": "missing_parameter", "message": "name and uri cannot both be None"}
    }


def test_asset_events_by_alias(worker_api, token_ti):
    alias = AssetAliasFactory(name="cleaned")
    through = AssetEventFactory()
    through.source_aliases.add(alias)
    AssetEventFactory()
    response = get(worker_api, token_ti, "/asset-events/by-asset-alias", name="cleaned")
    assert response.status_code == 200
    assert [e["id"] for e in response.json()["asset_events"]] == [through.id]


def test_asset_events_query_count_is_flat(worker_api, token_ti):
    counts = []
    for n in (1, 50):
        asset = AssetFactory()
        for _ in range(n):
            event = AssetEventFactory(asset=asset)
            run = DagRunFactory()
            run.consumed_links.create(dag=run.dag, asset_event=event)
        with CaptureQueriesContext(connection) as ctx:
            response = get(worker_api, token_ti, "/asset-events/by-asset", name=asset.name)
        assert len(response.json()["asset_events"]) == n
        counts.append(len(ctx.captured_queries))
    assert counts[0] == counts[1]
