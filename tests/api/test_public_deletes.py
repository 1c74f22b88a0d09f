"""`DELETE /api/v2/dags/{dag_id}` (issue 49) as Airflow 3.3.2's `delete_dag`
(`airflow/api/common/delete_dag.py`): the Dag and every row keyed by it go, by retention's
deleter in short batches (`retention.delete_dag`); the asset events its tasks produced, the
outbox rows not yet drained, the other Dags' queued events and the audit trail stay; a running
TI refuses it with Airflow's 409, writing nothing."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from assets_app.api.public_auth import create_api_token
from assets_app.models import (
    Asset,
    AssetDagRunQueue,
    AssetEvent,
    AssetEventQueue,
    AuditEntry,
    Dag,
    DagImportError,
    DagRun,
    DagRunAssetEvent,
    Task,
    TaskInstance,
    TIState,
    XCom,
)
from assets_app.operations import retention
from assets_app.outbox import drain
from assets_app.registration import outlets as registration
from assets_app.runtime import xcoms
from tests.api.snapshots import db_snapshot
from tests.asset_flow import asset_outlet, outbox_row, payload, scheduled_dag
from tests.factories import DagRunFactory, TaskFactory, TaskInstanceFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def api():
    get_user_model().objects.create_user("ops", password="pw", is_staff=True, is_superuser=True)
    _, key = create_api_token(username="ops", name="test")
    return Client(headers={"Authorization": f"Bearer {key}"})


def _world(runs: int = 3) -> dict:
    """`gone` (scheduled on `a`, producing `b`) with runs, TIs, XComs, a consumed event and a
    queued one, an event it produced, an outbox row of its TI and an import error of its file;
    `other`, also scheduled on `a`, with its own queued event and run."""
    gone = scheduled_dag("gone", "a", fileloc="gone.py")
    other = scheduled_dag("other", "a")
    a = Asset.objects.get(name="a")
    TaskFactory(dag=gone, task_id="t")
    for i in range(runs):
        run = DagRunFactory(dag=gone, run_id=f"r{i}", state="success")
        TaskInstanceFactory(dag_run=run, task_id="t", succeeded=True)
        xcoms.push(dag_id="gone", run_id=run.run_id, task_id="t", key="k", value=i)
    consumed, _ = registration.register_external_event(asset=a, extra={})
    DagRunAssetEvent.objects.create(dag_run=run, dag=gone, asset_event_id=consumed.pk)
    AssetDagRunQueue.objects.filter(asset_event_id=consumed.pk).delete()
    queued, _ = registration.register_external_event(asset=a, extra={})
    produced = AssetEvent.objects.create(
        asset=Asset.objects.create(name="b", uri="b"), source_dag_id="gone", source_run_id="r0"
    )
    DagRunFactory(dag=other, run_id="o1", state="success")
    DagImportError.objects.create(filename="gone.py", timestamp=run.run_after, stack_trace="x")
    return {"queued": queued, "produced": produced, "other": other}


def test_delete_dag_removes_its_rows_in_batches_and_keeps_what_airflow_keeps(api):
    world = _world(runs=7)
    pending = outbox_row(
        payload(outlets=[asset_outlet(Asset.objects.get(name="b"))], dag_id="gone", run_id="r0")
    )
    result = retention.delete_dag(dag_id="gone", batch_size=5)
    # 7 runs by one per batch (5 // RUN_BATCH_DIVISOR), then the XComs and the Dag row.
    assert result.batches >= 8
    assert not Dag.objects.filter(dag_id="gone").exists()
    for model in (DagRun, TaskInstance, Task, DagRunAssetEvent):
        assert not model.objects.filter(dag_id="gone").exists(), model
    assert not XCom.objects.filter(dag_id="gone").exists()
    assert not AssetDagRunQueue.objects.filter(target_dag_id="gone").exists()
    assert not DagImportError.objects.exists()
    # Kept: the events (produced by it, queued for it and for `other`), `other`'s queue and
    # run, the outbox row, which the drain still registers.
    assert AssetEvent.objects.filter(pk=world["produced"].pk).exists()
    assert AssetDagRunQueue.objects.filter(
        target_dag_id="other", asset_event=world["queued"]
    ).exists()
    assert DagRun.objects.filter(dag_id="other").count() == 1
    assert AssetEventQueue.objects.filter(pk=pending.pk).exists()
    drain.drain()
    assert not AssetEventQueue.objects.exists()
    assert AssetEvent.objects.filter(source_dag_id="gone", source_run_id="r0").count() == 2
    entry = AuditEntry.objects.get(action="dag.delete")
    assert entry.dag_id == "gone"
    assert entry.detail["counts"]["dag_run"] == 7
    assert entry.detail["counts"]["task_instance"] == 7
    assert entry.detail["counts"]["xcom"] == 7


def test_delete_dag_route_answers_204_then_airflows_404(api):
    _world()
    response = api.delete("/api/v2/dags/gone")
    assert response.status_code == 204, response.content
    assert response.content == b""
    assert AuditEntry.objects.get(action="dag.delete").actor_name == "ops"
    before = db_snapshot()
    replay = api.delete("/api/v2/dags/gone")
    assert replay.status_code == 404
    assert replay.json()["detail"]["message"] == "Dag with id: gone was not found"
    assert db_snapshot() == before


def test_a_running_task_instance_refuses_the_deletion_writing_nothing(api):
    _world()
    run = DagRun.objects.get(dag_id="gone", run_id="r0")
    TaskInstance.objects.filter(dag_run=run).update(state=TIState.RUNNING)
    before = db_snapshot()
    response = api.delete("/api/v2/dags/gone")
    assert response.status_code == 409
    assert (
        response.json()["detail"]["message"]
        == "Task instances of dag with id: 'gone' are still running"
    )
    assert db_snapshot() == before


def test_a_task_instance_that_starts_meanwhile_stops_the_deletion_at_its_batch(api, monkeypatch):
    """Checked again under each batch's locks: the runs before stay deleted, the rest stays."""
    _world(runs=3)
    real = retention.locks.lock_runs_for_dag_deletion

    def start_then_lock(ids):
        TaskInstance.objects.filter(dag_run__run_id="r1", dag_id="gone").update(
            state=TIState.RUNNING
        )
        return real(ids)

    monkeypatch.setattr(retention.locks, "lock_runs_for_dag_deletion", start_then_lock)
    with pytest.raises(retention.exceptions.Conflict):
        retention.delete_dag(dag_id="gone", batch_size=5)
    assert set(DagRun.objects.filter(dag_id="gone").values_list("run_id", flat=True)) == {
        "r1",
        "r2",
    }
    assert Dag.objects.filter(dag_id="gone").exists()
    assert not AuditEntry.objects.filter(action="dag.delete").exists()


def test_every_table_pointing_at_a_dag_is_one_the_deletion_empties(api, monkeypatch):
    """A raw delete skips Django's cascade: a model added later with a foreign key into a Dag,
    its tasks, runs, TIs or backfills must be in the deletion's steps, or its rows would fail
    the commit. Every such model is named in what `delete_dag` deletes."""
    from django.apps import apps

    from assets_app.models import Backfill

    _world()
    deleted: set[type] = set()
    real = retention.retention_sql.delete_rows

    def seen(queryset):
        deleted.add(queryset.model)
        return real(queryset)

    monkeypatch.setattr(retention.retention_sql, "delete_rows", seen)
    retention.delete_dag(dag_id="gone")
    parents = {Dag, Task, DagRun, TaskInstance, Backfill}
    pointing = {
        model
        for model in apps.get_app_config("assets_app").get_models()
        for f in model._meta.get_fields()
        if f.concrete and f.is_relation and f.many_to_one and f.related_model in parents
    }
    assert pointing - deleted == set()
