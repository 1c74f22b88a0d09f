"""Public asset-event API: POST/GET /api/v2/assets/events and the queuedEvents endpoints."""

import json
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from assets_app.api.public_auth import create_api_token
from assets_app.models import AssetDagRunQueue, AssetEvent, AuditEntry, DagRun
from assets_app.outbox import drain
from assets_app.scheduling import asset_runs as scheduling
from tests.asset_flow import asset_outlet, outbox_row, payload, scheduled_dag
from tests.factories import AssetFactory

from .snapshots import db_snapshot

pytestmark = pytest.mark.django_db

EVENTS = "/api/v2/assets/events"


@pytest.fixture
def api():
    get_user_model().objects.create_user("ops", password="pw", is_staff=True, is_superuser=True)
    _, key = create_api_token(username="ops", name="test")
    return Client(headers={"Authorization": f"Bearer {key}"})


def post_event(client, body, **headers):
    return client.post(
        EVENTS, data=json.dumps(body), content_type="application/json", headers=headers
    )


def test_post_event_registers_it_queues_dags_and_returns_airflow_shape(api):
    orders = AssetFactory(name="orders", uri="s3://b/orders")
    scheduled_dag("down", {"name": "orders", "uri": "s3://b/orders"})
    response = post_event(api, {"asset_id": orders.id, "extra": {"rows": 3}})
    assert response.status_code == 200, response.content
    event = AssetEvent.objects.get()
    body = response.json()
    assert body == {
        "id": event.id,
        "asset_id": orders.id,
        "uri": "s3://b/orders",
        "name": "orders",
        "group": "asset",
        "extra": {"rows": 3, "from_rest_api": True},
        "source_task_id": None,
        "source_dag_id": None,
        "source_run_id": None,
        "source_map_index": -1,
        "created_dagruns": [],
        "timestamp": body["timestamp"],
        "partition_key": None,
    }
    assert list(AssetDagRunQueue.objects.values_list("target_dag_id", "asset_event_id")) == [
        ("down", event.id)
    ]
    scheduling.schedule_dags()
    assert list(DagRun.objects.get(dag_id="down").consumed_events.all()) == [event]


def test_post_event_by_name_and_uri_and_idempotency_key(api):
    AssetFactory(name="orders", uri="s3://b/orders")
    body = {"name": "orders", "extra": {"n": 1}}
    first = post_event(api, body, **{"Idempotency-Key": "abc"})
    again = post_event(api, body, **{"Idempotency-Key": "abc"})
    assert (first.status_code, again.status_code) == (200, 200)
    assert first.json() == again.json()
    assert first.json()["extra"] == {"n": 1, "from_rest_api": True}
    assert AssetEvent.objects.count() == 1
    other = post_event(api, {"name": "orders", "uri": "s3://b/orders"})
    assert other.status_code == 200
    assert AssetEvent.objects.count() == 2


def _caller(username: str, *, session: bool = False) -> Client:
    user = get_user_model().objects.create_user(
        username, password="pw", is_staff=True, is_superuser=True
    )
    if session:
        client = Client()
        client.force_login(user)
        return client
    _, key = create_api_token(username=username, name="t")
    return Client(headers={"Authorization": f"Bearer {key}"})


@pytest.mark.parametrize(
    "other_body",
    [
        {"name": "other", "extra": {"n": 1}},  # another asset
        {"name": "orders", "extra": {"n": 2}},  # another extra
        {"name": "orders"},  # no extra
        {"uri": "s3://b/orders", "extra": {"n": 1}},  # the same asset named another way
    ],
)
def test_an_idempotency_key_reused_with_another_body_is_422_and_writes_nothing(api, other_body):
    AssetFactory(name="orders", uri="s3://b/orders")
    AssetFactory(name="other", uri="s3://b/other")
    first = post_event(api, {"name": "orders", "extra": {"n": 1}}, **{"Idempotency-Key": "abc"})
    assert first.status_code == 200
    before = db_snapshot()

    reused = post_event(api, other_body, **{"Idempotency-Key": "abc"})

    assert reused.status_code == 422, reused.content
    (item,) = reused.json()["detail"]
    assert item["type"] == "idempotency_key_reused"
    assert item["ctx"]["reason"] == "idempotency_key_reused"
    assert item["loc"] == ["header", "Idempotency-Key"]
    assert "abc" in item["msg"] and "another request body" in item["msg"]
    assert db_snapshot() == before
    # The first body with that key is still answered with the first event.
    assert (
        post_event(api, {"name": "orders", "extra": {"n": 1}}, **{"Idempotency-Key": "abc"}).json()
        == first.json()
    )


def test_idempotency_keys_belong_to_their_caller():
    AssetFactory(name="orders", uri="s3://b/orders")
    body = {"name": "orders", "extra": {"n": 1}}
    token_a, token_b, session_c = _caller("a"), _caller("b"), _caller("c", session=True)
    answers = [post_event(c, body, **{"Idempotency-Key": "shared"}) for c in (token_a, token_b)]
    answers.append(post_event(session_c, body, **{"Idempotency-Key": "shared"}))
    assert [r.status_code for r in answers] == [200, 200, 200]
    assert len({r.json()["id"] for r in answers}) == 3
    # Each caller's retry finds its own event; another caller's body does not collide.
    assert post_event(token_b, body, **{"Idempotency-Key": "shared"}).json() == answers[1].json()
    other = {"name": "orders", "extra": {"n": 9}}
    assert post_event(session_c, other, **{"Idempotency-Key": "shared"}).status_code == 422
    assert post_event(session_c, other, **{"Idempotency-Key": "own"}).status_code == 200
    assert AssetEvent.objects.count() == 4


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        ({"asset_id": 999_999}, 404, "asset_not_found"),
        ({"name": "nope"}, 404, "asset_not_found"),
        ({}, 422, "value_error"),
        ({"asset_id": 1, "name": "x"}, 422, "value_error"),
        ({"name": "orders", "extra": []}, 422, "dict_type"),
        ({"name": "orders", "surprise": 1}, 422, "extra_forbidden"),
        ({"name": "orders", "partition_key": "p1"}, 422, "value_error"),
    ],
)
def test_post_event_rejects_bad_input_and_writes_nothing(api, body, status, reason):
    """404 in Airflow's HTTPExceptionResponse shape (detail.reason kept), 422 in its
    HTTPValidationError shape (a list of {type, loc, msg})."""
    AssetFactory(name="orders", uri="orders")
    response = post_event(api, body)
    assert response.status_code == status, response.content
    detail = response.json()["detail"]
    if status == 422:
        assert [item["type"] for item in detail] == [reason]
        assert detail[0]["loc"][0] == "body" and detail[0]["msg"]
    else:
        assert detail["reason"] == reason
    assert AssetEvent.objects.count() == 0


def test_post_event_accepts_airflows_null_partition_key(api):
    orders = AssetFactory(name="orders", uri="orders")
    response = post_event(api, {"asset_id": orders.id, "partition_key": None, "extra": {}})
    assert response.status_code == 200, response.content
    assert response.json()["partition_key"] is None


def test_anonymous_is_refused(client):
    orders = AssetFactory(name="orders")
    assert post_event(client, {"asset_id": orders.id}).status_code == 401
    assert client.get(EVENTS).status_code == 401
    assert client.get("/api/v2/dags/d/assets/queuedEvents").status_code == 401
    assert AssetEvent.objects.count() == 0


def test_get_events_filters_pages_and_lists_the_runs_that_consumed_them(
    api, django_assert_max_num_queries
):
    orders = AssetFactory(name="orders", uri="orders")
    other = AssetFactory(name="other", uri="other")
    scheduled_dag("down", "orders")
    for i in range(3):
        outbox_row(payload(outlets=[asset_outlet(orders)], dag_id="etl", task_id=f"t{i}"))
    outbox_row(payload(outlets=[asset_outlet(other)], dag_id="etl2"))
    drain.drain()
    run = DagRun.objects.get(dag_id="down")

    with django_assert_max_num_queries(5):
        response = api.get(EVENTS, {"asset_id": orders.id, "limit": 2, "offset": 1})
    body = response.json()
    assert response.status_code == 200
    assert body["total_entries"] == 3
    assert [e["source_task_id"] for e in body["asset_events"]] == ["t1", "t2"]
    assert body["asset_events"][0]["created_dagruns"] == [
        {
            "run_id": run.run_id,
            "dag_id": "down",
            "logical_date": None,
            "end_date": None,
            "state": "queued",
            "data_interval_start": None,
            "data_interval_end": None,
            "partition_key": None,
            # Airflow requires a start date here: a queued run shows when it was queued.
            "start_date": run.queued_at.isoformat().replace("+00:00", "Z"),
            "triggering": False,
        }
    ]
    by_dag = api.get(EVENTS, {"source_dag_id": "etl2", "order_by": "-timestamp"}).json()
    assert [e["name"] for e in by_dag["asset_events"]] == ["other"]
    later = (timezone.now() + timedelta(minutes=1)).isoformat()
    assert api.get(EVENTS, {"timestamp_gte": later}).json() == {
        "asset_events": [],
        "total_entries": 0,
    }
    bad = api.get(EVENTS, {"order_by": "nonsense"})
    assert (bad.status_code, bad.json()["detail"]["reason"]) == (400, "invalid_order_by")
    assert "'nonsense'" in bad.json()["detail"]["message"]
    # Airflow's bounds: limit >= 0 (0 is an empty page with the total), clamped to 100.
    assert api.get(EVENTS, {"limit": 0}).json() == {"asset_events": [], "total_entries": 4}
    assert api.get(EVENTS, {"limit": -1}).status_code == 422
    assert len(api.get(EVENTS, {"limit": 101}).json()["asset_events"]) == 4
    assert api.get(EVENTS, {"offset": 2**63}).status_code == 422


def test_queued_events_get_and_delete_for_a_dag_and_per_asset(api):
    a = AssetFactory(name="a", uri="a")
    b = AssetFactory(name="b", uri="b")
    scheduled_dag("waits", {"all": ["a", "b", "c"]})
    for asset in (a, a, b):
        outbox_row(payload(outlets=[asset_outlet(asset)]))
    drain.drain()
    url = "/api/v2/dags/waits/assets/queuedEvents"
    body = api.get(url).json()
    assert body["total_entries"] == 2
    assert [(q["dag_id"], q["asset_id"], q["dag_display_name"]) for q in body["queued_events"]] == [
        ("waits", a.id, "waits"),
        ("waits", b.id, "waits"),
    ]
    one = api.get(f"/api/v2/dags/waits/assets/{b.id}/queuedEvents")
    assert one.status_code == 200
    assert one.json()["asset_id"] == b.id

    assert api.delete(f"/api/v2/dags/waits/assets/{a.id}/queuedEvents").status_code == 204
    assert list(AssetDagRunQueue.objects.values_list("asset_id", flat=True)) == [b.id]
    assert api.get(f"/api/v2/dags/waits/assets/{a.id}/queuedEvents").status_code == 404
    assert api.delete(f"/api/v2/dags/waits/assets/{a.id}/queuedEvents").status_code == 404
    assert api.delete(url).status_code == 204
    assert AssetDagRunQueue.objects.count() == 0
    assert api.get(url).json() == {"queued_events": [], "total_entries": 0}
    missing = api.get("/api/v2/dags/nope/assets/queuedEvents")
    assert (missing.status_code, missing.json()["detail"]["reason"]) == (404, "dag_not_found")


@pytest.mark.parametrize(
    ("url", "params", "status"),
    [
        ("/api/v2/dags/waits/assets/queuedEvents", {"before": "2284-02-20T23:04:22-18:04"}, 422),
        ("/api/v2/dags/waits/assets/queuedEvents", {"before": "2284-02-20T23:04:22-15:30"}, 200),
        (EVENTS, {"timestamp_gte": "0023-06-10T00:00:00+15:30"}, 200),
        (EVENTS, {"timestamp_lte": "9999-12-31T23:59:00-10:00"}, 422),
        ("/api/v2/dags/waits/assets/queuedEvents", {"before": "2026-01-01T00:00:00"}, 422),
    ],
)
def test_datetimes_with_extreme_offsets_are_converted_or_refused_never_a_500(
    api, url, params, status
):
    """PostgreSQL refuses UTC offsets beyond +-15:59: the API refuses them (api.schemas.UtcDatetime)
    and converts the others to UTC before querying."""
    scheduled_dag("waits", "a")
    response = api.get(url, params)
    assert response.status_code == status, response.content


def test_writes_are_audited_with_the_api_user_and_a_replay_is_not(api):
    orders = AssetFactory(name="orders", uri="s3://b/orders")
    scheduled_dag("down", {"name": "orders", "uri": "s3://b/orders"})
    for _ in range(2):  # the replay (same Idempotency-Key) writes no second entry
        assert (
            post_event(api, {"asset_id": orders.id}, **{"Idempotency-Key": "k1"}).status_code == 200
        )
    assert api.delete("/api/v2/dags/down/assets/queuedEvents").status_code == 204
    trigger = api.post(
        "/api/v2/dags/down/dagRuns",
        data=json.dumps({"conf": {"day": 3}}),
        content_type="application/json",
    )
    assert trigger.status_code == 200, trigger.content
    entries = list(
        AuditEntry.objects.exclude(action="api_token.create")  # the fixture's token (issue 26)
        .order_by("id")
        .values_list("actor_name", "via", "action", "dag_id")
    )
    assert entries == [
        ("ops", "api", "asset_event.create", ""),
        ("ops", "api", "queued_events.clear", "down"),
        ("ops", "api", "dag_run.trigger", "down"),
    ]
    assert AuditEntry.objects.get(action="dag_run.trigger").detail["conf"] == {"day": 3}
