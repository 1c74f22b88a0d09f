"""PATCH /execution/task-instances/{id}/run: start a TI and get its TIRunContext."""

import uuid

import jwt
import pytest
from django.conf import settings
from django.utils import timezone

from assets_app.api import auth
from assets_app.models import DagRunState, TIState
from tests.factories import (
    AssetAliasFactory,
    AssetEventFactory,
    AssetFactory,
    DagRunFactory,
    TaskInstanceFactory,
)

from .snapshots import db_snapshot

pytestmark = pytest.mark.django_db

RUN_BODY = {
    "state": "running",
    "hostname": "worker-1",
    "unixname": "airflow",
    "pid": 4242,
    "start_date": "2026-06-30T10:00:00+00:00",
}

# Airflow 2026-06-30 field sets (apache-airflow-task-sdk 1.3.2, datamodels/_generated.py).
TI_RUN_CONTEXT_FIELDS = {
    "dag_run",
    "task_reschedule_count",
    "max_tries",
    "variables",
    "connections",
    "next_method",
    "next_kwargs",
    "xcom_keys_to_clear",
    "should_retry",
    "start_date",
}
DAG_RUN_FIELDS = {
    "dag_id",
    "run_id",
    "logical_date",
    "data_interval_start",
    "data_interval_end",
    "run_after",
    "start_date",
    "end_date",
    "clear_number",
    "run_type",
    "state",
    "conf",
    "triggering_user_name",
    "consumed_asset_events",
    "partition_key",
    "partition_date",
    "note",
    "team_name",
}
CONSUMED_EVENT_FIELDS = {
    "asset",
    "extra",
    "source_task_id",
    "source_dag_id",
    "source_run_id",
    "source_map_index",
    "source_aliases",
    "timestamp",
    "partition_key",
}


def test_start_queued_ti_returns_the_run_context(worker_api):
    ti = TaskInstanceFactory(max_tries=2)
    alias = AssetAliasFactory(name="cleaned")
    event = AssetEventFactory(
        extra={"rows": 3},
        source_dag_id="producer",
        source_run_id="manual__1",
        source_task_id="emit",
    )
    event.source_aliases.add(alias)
    ti.dag_run.consumed_links.create(dag=ti.dag_run.dag, asset_event=event)

    response = worker_api.request("PATCH", f"/task-instances/{ti.id}/run", RUN_BODY, ti_id=ti.id)

    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == TI_RUN_CONTEXT_FIELDS
    assert set(body["dag_run"]) == DAG_RUN_FIELDS
    assert body["max_tries"] == 2
    assert body["should_retry"] is True
    assert body["task_reschedule_count"] == 0
    assert body["variables"] == [] and body["connections"] == []
    assert body["xcom_keys_to_clear"] == []
    assert body["next_method"] is None and body["next_kwargs"] is None
    assert body["start_date"] is None
    run = body["dag_run"]
    assert run["dag_id"] == ti.dag_id and run["run_id"] == ti.run_id
    assert run["state"] == "running"
    assert run["run_type"] == "manual"
    assert run["partition_key"] is None and run["team_name"] is None
    (consumed,) = run["consumed_asset_events"]
    assert set(consumed) == CONSUMED_EVENT_FIELDS
    assert consumed["asset"] == {
        "name": event.asset.name,
        "uri": event.asset.uri,
        "extra": {},
    }
    assert consumed["extra"] == {"rows": 3}
    assert consumed["source_aliases"] == [{"name": "cleaned"}]
    assert consumed["source_dag_id"] == "producer"
    assert consumed["source_map_index"] == -1
    assert response["Refreshed-API-Token"]

    ti.refresh_from_db()
    assert ti.state == TIState.RUNNING
    assert (ti.hostname, ti.unixname, ti.pid) == ("worker-1", "airflow", 4242)
    assert ti.start_date.isoformat() == "2026-06-30T10:00:00+00:00"
    assert ti.last_heartbeat_at is not None
    ti.dag_run.refresh_from_db()
    assert ti.dag_run.state == DagRunState.RUNNING
    assert ti.dag_run.start_date is not None


def test_replayed_start_from_the_same_process_is_200_and_writes_nothing(worker_api):
    ti = TaskInstanceFactory()
    first = worker_api.request("PATCH", f"/task-instances/{ti.id}/run", RUN_BODY, ti_id=ti.id)
    assert first.status_code == 200
    before = db_snapshot()

    again = worker_api.request("PATCH", f"/task-instances/{ti.id}/run", RUN_BODY, ti_id=ti.id)

    assert again.status_code == 200
    assert again.json()["dag_run"]["run_id"] == ti.run_id
    assert db_snapshot() == before


def test_start_from_another_process_while_running_is_409(worker_api):
    ti = TaskInstanceFactory(running=True)
    before = db_snapshot()

    response = worker_api.request(
        "PATCH", f"/task-instances/{ti.id}/run", {**RUN_BODY, "pid": 99}, ti_id=ti.id
    )

    assert response.status_code == 409
    assert response.json() == {
        "detail": {
            "reason": "invalid_state",
            "message": "TI was not in a state where it could be marked as running",
            "previous_state": "running",
        }
    }
    assert db_snapshot() == before


@pytest.mark.parametrize("state", ["success", "failed", "skipped"])
def test_start_of_a_finished_ti_is_409_with_previous_state(worker_api, state):
    ti = TaskInstanceFactory(state=state)
    before = db_snapshot()

    response = worker_api.request("PATCH", f"/task-instances/{ti.id}/run", RUN_BODY, ti_id=ti.id)

    assert response.status_code == 409
    assert response.json()["detail"]["previous_state"] == state
    assert db_snapshot() == before


def test_start_of_an_unknown_ti_is_404(worker_api):
    ti_id = uuid.uuid4()
    response = worker_api.request("PATCH", f"/task-instances/{ti_id}/run", RUN_BODY, ti_id=ti_id)
    assert response.status_code == 404
    assert response.json() == {
        "detail": {"reason": "not_found", "message": f"task instance {ti_id} not found"}
    }


def test_non_uuid_id_is_422(worker_api):
    response = worker_api.request(
        "PATCH", "/task-instances/not-a-uuid/run", RUN_BODY, ti_id=uuid.uuid4()
    )
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert detail["reason"] == "validation_error"
    assert detail["errors"][0]["loc"] == ["path", "task_instance_id"]


@pytest.mark.parametrize(
    "body",
    [
        {**RUN_BODY, "surprise": 1},  # unknown field
        {k: v for k, v in RUN_BODY.items() if k != "hostname"},  # missing field
        {**RUN_BODY, "pid": "many"},  # wrong type
        {**RUN_BODY, "start_date": "2026-06-30T10:00:00"},  # naive datetime
        {**RUN_BODY, "state": "queued"},  # not "running"
    ],
)
def test_invalid_run_body_is_422_and_writes_nothing(worker_api, body):
    ti = TaskInstanceFactory()
    before = db_snapshot()

    response = worker_api.request("PATCH", f"/task-instances/{ti.id}/run", body, ti_id=ti.id)

    assert response.status_code == 422
    assert response.json()["detail"]["reason"] == "validation_error"
    assert db_snapshot() == before


def test_missing_token_is_401(worker_api):
    ti = TaskInstanceFactory()
    response = worker_api.request("PATCH", f"/task-instances/{ti.id}/run", RUN_BODY)
    assert response.status_code == 401
    assert response.json() == {
        "detail": {"reason": "not_authenticated", "message": "missing or invalid credentials"}
    }
    ti.refresh_from_db()
    assert ti.state == TIState.QUEUED


def test_token_of_another_ti_is_403_and_writes_nothing(worker_api):
    ti_a = TaskInstanceFactory()
    ti_b = TaskInstanceFactory()
    before = db_snapshot()

    for method, path, body in [
        ("PATCH", "run", RUN_BODY),
        ("PATCH", "state", {"state": "failed", "end_date": "2026-06-30T10:00:00Z"}),
        ("PUT", "heartbeat", {"hostname": "worker-1", "pid": 4242}),
    ]:
        response = worker_api.request(
            method, f"/task-instances/{ti_b.id}/{path}", body, ti_id=ti_a.id
        )
        assert response.status_code == 403, path
        assert response.json() == {
            "detail": {
                "reason": "forbidden",
                "message": "this token is for another task instance",
            }
        }
    assert db_snapshot() == before


def test_token_with_a_bad_signature_is_403(worker_api):
    ti = TaskInstanceFactory()
    forged = jwt.encode(
        {
            "sub": str(ti.id),
            "try": 1,
            "scope": "execution",
            "exp": int(timezone.now().timestamp()) + 60,
        },
        "not-the-secret-key-but-long-enough-for-hs256",
        algorithm="HS256",
    )
    response = worker_api.request("PATCH", f"/task-instances/{ti.id}/run", RUN_BODY, token=forged)
    assert response.status_code == 403
    detail = response.json()["detail"]
    assert detail["reason"] == "invalid_token"
    assert detail["message"] == "invalid task token: Signature verification failed"


def test_expired_token_is_401(worker_api):
    ti = TaskInstanceFactory()
    expired = jwt.encode(
        {
            "sub": str(ti.id),
            "try": 1,
            "scope": "execution",
            "exp": int(timezone.now().timestamp()) - 5,
        },
        settings.SECRET_KEY,
        algorithm="HS256",
    )
    response = worker_api.request("PATCH", f"/task-instances/{ti.id}/run", RUN_BODY, token=expired)
    assert response.status_code == 401
    assert response.json() == {
        "detail": {"reason": "token_expired", "message": "the task token has expired"}
    }


def test_malformed_json_is_400_and_writes_nothing(worker_api):
    ti = TaskInstanceFactory()
    before = db_snapshot()
    response = worker_api.request(
        "PATCH", f"/task-instances/{ti.id}/run", raw=b'{"state": "running",', ti_id=ti.id
    )
    assert response.status_code == 400
    detail = response.json()["detail"]
    assert detail["reason"] == "invalid_json"
    assert detail["message"].startswith("request body is not valid JSON: ")
    assert db_snapshot() == before


def test_wrong_content_type_is_415(worker_api):
    ti = TaskInstanceFactory()
    response = worker_api.request(
        "PATCH",
        f"/task-instances/{ti.id}/run",
        raw="state=running",
        content_type="application/x-www-form-urlencoded",
        ti_id=ti.id,
    )
    assert response.status_code == 415
    assert response.json()["detail"]["reason"] == "unsupported_media_type"
    ti.refresh_from_db()
    assert ti.state == TIState.QUEUED


def test_oversized_body_is_413_and_writes_nothing(worker_api, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    ti = TaskInstanceFactory(running=True)
    before = db_snapshot()
    body = {
        "state": "success",
        "end_date": "2026-06-30T10:00:00Z",
        "task_outlets": [{"name": "x" * 2000, "uri": "s3://x", "type": "Asset"}],
    }
    response = worker_api.request("PATCH", f"/task-instances/{ti.id}/state", body, ti_id=ti.id)
    assert response.status_code == 413
    assert response.json() == {
        "detail": {
            "reason": "request_too_large",
            "message": "request body is larger than the limit of 1000 bytes",
            "limit_bytes": 1000,
        }
    }
    assert db_snapshot() == before


def test_start_run_with_unstarted_run_keeps_other_runs(worker_api):
    """Starting a TI sets only its own run running."""
    ti = TaskInstanceFactory()
    other = DagRunFactory()
    worker_api.request("PATCH", f"/task-instances/{ti.id}/run", RUN_BODY, ti_id=ti.id)
    other.refresh_from_db()
    assert other.state == DagRunState.QUEUED


def test_unknown_airflow_api_version_header_is_ignored(worker_api):
    ti = TaskInstanceFactory()
    response = worker_api.client.patch(
        f"/execution/task-instances/{ti.id}/run",
        data=RUN_BODY,
        content_type="application/json",
        headers={
            "Authorization": f"Bearer {auth.issue_token(ti.id, try_number=ti.try_number)}",
            "Airflow-API-Version": "1999-01-01",
        },
    )
    assert response.status_code == 200


def test_openapi_schema_lists_every_worker_endpoint(client):
    response = client.get("/execution/openapi.json")
    assert response.status_code == 200
    assert set(response.json()["paths"]) == {
        "/execution/task-instances/{task_instance_id}/run",
        "/execution/task-instances/{task_instance_id}/state",
        "/execution/task-instances/{task_instance_id}/heartbeat",
        "/execution/task-instances/{task_instance_id}/skip-downstream",
        "/execution/workloads/claim",
        "/execution/task-instances/{task_instance_id}/logs/{try_number}",
        "/execution/assets/by-name",
        "/execution/assets/by-uri",
        "/execution/assets/by-alias",
        "/execution/asset-events/by-asset",
        "/execution/asset-events/by-asset-alias",
        # What a running task calls besides its state (execution_runtime.py).
        "/execution/task-instances/{task_instance_id}/rtif",
        "/execution/task-instances/{task_instance_id}/validate-inlets-and-outlets",
        "/execution/task-instances/{task_instance_id}/previous-successful-dagrun",
        "/execution/task-instances/count",
        "/execution/task-instances/states",
        "/execution/task-reschedules/{task_instance_id}/start_date",
        # Human-in-the-loop (hitl.py): the request, its answer, the TI's parking.
        "/execution/hitlDetails/{task_instance_id}",
        "/execution/xcoms/{dag_id}/{run_id}/{task_id}/{key}",
        "/execution/xcoms/{dag_id}/{run_id}/{task_id}/{key}/item/{offset}",
        "/execution/xcoms/{dag_id}/{run_id}/{task_id}/{key}/slice",
        "/execution/variables/{variable_key}",
        "/execution/variables/keys",
        "/execution/dags/{dag_id}",
        "/execution/dags/sync",
        "/execution/connections/{connection_id}",
        "/execution/dag-runs/count",
        "/execution/dag-runs/previous",
        "/execution/dag-runs/{dag_id}/{run_id}",
        "/execution/dag-runs/{dag_id}/{run_id}/clear",
        "/execution/dag-runs/{dag_id}/{run_id}/state",
        # The task and asset state store (issue 42, execution_store.py).
        "/execution/store/ti/{task_instance_id}/{key}",
        "/execution/store/ti/{task_instance_id}",
        "/execution/store/asset/by-name/value",
        "/execution/store/asset/by-name/clear",
        "/execution/store/asset/by-uri/value",
        "/execution/store/asset/by-uri/clear",
        # The triggerer of deferred TIs (issue 42, our own endpoints).
        "/execution/triggers/claim",
        "/execution/triggers/{trigger_id}/event",
        "/execution/triggers/{trigger_id}/failure",
        "/execution/triggers/{trigger_id}/end",
        # Dag-level callbacks (issue 39, our own endpoints).
        "/execution/dag-callbacks/claim",
        "/execution/dag-callbacks/{request_id}/report",
    }


def test_run_context_body_is_exactly_the_documented_model(worker_api):
    """ti_run renders plain data (no model per consumed event): every field, value and datetime
    format must be what the documented `TIRunContext` gives, extra fields forbidden."""
    from datetime import UTC, datetime

    from assets_app.api.schemas import TIRunContext

    ti = TaskInstanceFactory(
        max_tries=0,
        dag_run=DagRunFactory(
            run_type="asset_triggered",
            run_id="asset_triggered__1",
            conf={"k": [1, "v"]},
            note="n",
            logical_date=datetime(2026, 6, 29, tzinfo=UTC),
            run_after=datetime(2026, 6, 30, 8, 0, 0, 500000, tzinfo=UTC),
        ),
    )
    asset = AssetFactory(name="orders", uri="s3://b/orders", extra={"team": "x"})
    through = AssetEventFactory(
        asset=asset,
        extra={"rows": 3, "nested": {"a": None}},
        source_dag_id="producer",
        source_run_id="manual__1",
        source_task_id="emit",
        source_map_index=2,
        timestamp=datetime(2026, 6, 30, 9, 0, 0, 123456, tzinfo=UTC),
    )
    through.source_aliases.add(AssetAliasFactory(name="z-alias"), AssetAliasFactory(name="a-alias"))
    rest = AssetEventFactory(asset=asset, timestamp=datetime(2026, 6, 30, 7, tzinfo=UTC))
    for event in (through, rest):
        ti.dag_run.consumed_links.create(dag=ti.dag_run.dag, asset_event=event)

    response = worker_api.request("PATCH", f"/task-instances/{ti.id}/run", RUN_BODY, ti_id=ti.id)

    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "application/json; charset=utf-8"
    assert response["Refreshed-API-Token"]
    body = response.json()
    TIRunContext.model_validate(body)  # extra="forbid" at every level
    started = body["dag_run"].pop("start_date")
    assert started.endswith("Z")
    assert body == {
        "dag_run": {
            "dag_id": ti.dag_id,
            "run_id": "asset_triggered__1",
            "logical_date": "2026-06-29T00:00:00Z",
            "data_interval_start": None,
            "data_interval_end": None,
            "run_after": "2026-06-30T08:00:00.500Z",
            "end_date": None,
            "clear_number": 0,
            "run_type": "asset_triggered",
            "state": "running",
            "conf": {"k": [1, "v"]},
            "triggering_user_name": None,
            "consumed_asset_events": [
                {
                    "asset": {"name": "orders", "uri": "s3://b/orders", "extra": {"team": "x"}},
                    "extra": {},
                    "source_task_id": None,
                    "source_dag_id": None,
                    "source_run_id": None,
                    "source_map_index": -1,
                    "source_aliases": [],
                    "timestamp": "2026-06-30T07:00:00Z",
                    "partition_key": None,
                },
                {
                    "asset": {"name": "orders", "uri": "s3://b/orders", "extra": {"team": "x"}},
                    "extra": {"rows": 3, "nested": {"a": None}},
                    "source_task_id": "emit",
                    "source_dag_id": "producer",
                    "source_run_id": "manual__1",
                    "source_map_index": 2,
                    "source_aliases": [{"name": "a-alias"}, {"name": "z-alias"}],
                    "timestamp": "2026-06-30T09:00:00.123Z",
                    "partition_key": None,
                },
            ],
            "partition_key": None,
            "partition_date": None,
            "note": "n",
            "team_name": None,
        },
        "task_reschedule_count": 0,
        "max_tries": 0,
        "variables": [],
        "connections": [],
        "next_method": None,
        "next_kwargs": None,
        "xcom_keys_to_clear": [],
        "should_retry": False,
        "start_date": None,
    }


def test_openapi_documents_the_run_context_response(client):
    operation = client.get("/execution/openapi.json").json()["paths"][
        "/execution/task-instances/{task_instance_id}/run"
    ]["patch"]
    schema = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/TIRunContext"}


def test_run_context_carries_big_integers_and_unicode_in_extras_and_conf_exactly(worker_api):
    """Extras and conf are JSON the database accepted: integers beyond 64 bits and non-ASCII
    text come back unchanged (the encoder embeds stored extras as they are)."""
    big = 2**70
    ti = TaskInstanceFactory(dag_run=DagRunFactory(conf={"n": big, "s": "žluť 😀"}))
    event = AssetEventFactory(
        asset=AssetFactory(name="a", uri="a", extra={"n": -big}), extra={"n": big, "s": "é"}
    )
    ti.dag_run.consumed_links.create(dag=ti.dag_run.dag, asset_event=event)

    response = worker_api.request("PATCH", f"/task-instances/{ti.id}/run", RUN_BODY, ti_id=ti.id)

    assert response.status_code == 200, response.content
    run = response.json()["dag_run"]
    assert run["conf"] == {"n": big, "s": "žluť 😀"}
    (consumed,) = run["consumed_asset_events"]
    assert consumed["extra"] == {"n": big, "s": "é"}
    assert consumed["asset"]["extra"] == {"n": -big}
