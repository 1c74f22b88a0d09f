"""Both registration modes (DESIGN 5) through the HTTP endpoint, and racing successes."""

import threading

import pytest
from django.db import connection, transaction
from django.utils import timezone

from assets_app import task_state
from assets_app.cluster import nudges
from assets_app.models import (
    AssetDagRunQueue,
    AssetEvent,
    AssetEventQueue,
    DagRunState,
    DagScheduleAssetReference,
    TIState,
)
from assets_app.sql import locks
from assets_app.task_state import success
from tests.factories import AssetFactory, DagFactory, TaskInstanceFactory

from .snapshots import db_snapshot
from .test_execution_state import OUTLET_EVENTS, OUTLETS, SUCCESS, patch_state


@pytest.mark.django_db
def test_inline_success_registers_events_and_writes_no_outbox_row(worker_api, settings):
    settings.ASSET_REGISTRATION_MODE = "inline"
    ti = TaskInstanceFactory(running=True)

    response = patch_state(worker_api, ti, SUCCESS)

    assert response.status_code == 204
    ti.refresh_from_db()
    assert ti.state == TIState.SUCCESS
    assert AssetEventQueue.objects.count() == 0
    events = {
        (e.asset.name, tuple(a.name for a in e.source_aliases.all())): e
        for e in AssetEvent.objects.select_related("asset")
    }
    assert set(events) == {("orders", ()), ("orders_clean", ("cleaned",))}
    assert events[("orders", ())].extra == {"rows": 5}
    assert events[("orders", ())].source_ti_id == ti.id
    ti.dag_run.refresh_from_db()
    assert ti.dag_run.state == DagRunState.SUCCESS


@pytest.mark.django_db
def test_inline_success_nudges_the_scheduler_for_dags_with_new_queued_events(
    worker_api, settings, django_capture_on_commit_callbacks
):
    settings.ASSET_REGISTRATION_MODE = "inline"
    orders = AssetFactory(name="orders", uri="s3://bucket/orders")
    consumer = DagFactory(dag_id="consumer")
    DagScheduleAssetReference.objects.create(dag=consumer, asset=orders)
    ti = TaskInstanceFactory(running=True)

    with django_capture_on_commit_callbacks() as callbacks:
        assert patch_state(worker_api, ti, SUCCESS).status_code == 204

    sent = [cb for cb in callbacks if getattr(cb, "args", ())[:1] == (nudges.nudge_scheduler,)]
    assert [n.keywords for n in sent] == [{"dag_ids": frozenset({"consumer"})}]
    assert AssetDagRunQueue.objects.filter(target_dag=consumer).count() == 1


@pytest.mark.django_db
def test_inline_replayed_success_is_200_and_writes_nothing(worker_api, settings):
    settings.ASSET_REGISTRATION_MODE = "inline"
    ti = TaskInstanceFactory(running=True)
    assert patch_state(worker_api, ti, SUCCESS).status_code == 204
    before = db_snapshot()

    assert patch_state(worker_api, ti, SUCCESS).status_code == 200
    assert db_snapshot() == before


@pytest.mark.django_db
def test_inline_success_of_a_queued_ti_is_409_and_registers_nothing(worker_api, settings):
    settings.ASSET_REGISTRATION_MODE = "inline"
    ti = TaskInstanceFactory()
    before = db_snapshot()

    response = patch_state(worker_api, ti, SUCCESS)

    assert response.status_code == 409
    assert response.json()["detail"]["previous_state"] == "queued"
    assert db_snapshot() == before


@pytest.mark.django_db
def test_inline_registration_error_is_422_and_rolls_back_everything(worker_api, settings):
    settings.ASSET_REGISTRATION_MODE = "inline"
    ti = TaskInstanceFactory(running=True)
    other = TaskInstanceFactory(running=True)
    # First success creates asset orders <-> s3://bucket/orders; a second outlet claiming the name
    # with another uri cannot be registered.
    assert patch_state(worker_api, other, SUCCESS).status_code == 204
    before = db_snapshot()
    body = {
        **SUCCESS,
        "task_outlets": [{"name": "orders", "uri": "s3://elsewhere/orders", "type": "Asset"}],
        "outlet_events": [],
    }

    response = patch_state(worker_api, ti, body)

    assert response.status_code == 422
    assert response.json()["detail"]["reason"] == "asset_key_conflict"
    assert db_snapshot() == before


def _hold_ti_lock_then(ti_id, *, locked: threading.Event, release: threading.Event, new_state):
    try:
        with transaction.atomic():
            ti = locks.lock_task_instance(ti_id)
            locked.set()
            release.wait(10)
            ti.state = new_state
            ti.end_date = timezone.now()
            ti.save()
    finally:
        connection.close()


def _succeed_in_thread(ti_id, results: list) -> threading.Thread:
    def run():
        try:
            results.append(
                success.succeed(
                    ti_id=ti_id,
                    try_number=1,
                    end_date=timezone.now(),
                    task_outlets=OUTLETS,
                    outlet_events=OUTLET_EVENTS,
                )
            )
        except Exception as exc:  # the assertion below names it
            results.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.parametrize("mode", ["queue", "inline"])
@pytest.mark.django_db(transaction=True)
def test_success_racing_another_success_is_a_replay_that_writes_nothing(settings, mode):
    """Another transaction marks the TI success while ours waits for the TI lock: ours returns
    `replayed` and (inline) rolls back the events it registered before the lock."""
    settings.ASSET_REGISTRATION_MODE = mode
    ti = TaskInstanceFactory(running=True)
    locked, release = threading.Event(), threading.Event()
    holder = threading.Thread(
        target=_hold_ti_lock_then,
        args=(ti.id,),
        kwargs={"locked": locked, "release": release, "new_state": TIState.SUCCESS},
    )
    holder.start()
    assert locked.wait(10)
    results: list = []
    racer = _succeed_in_thread(ti.id, results)
    racer.join(0.5)
    assert racer.is_alive()  # waiting on the TI lock
    release.set()
    holder.join(10)
    racer.join(10)

    (result,) = results
    assert isinstance(result, task_state.StateChange), result
    assert result.replayed is True
    assert AssetEvent.objects.count() == 0
    assert AssetEventQueue.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_inline_success_racing_a_failure_is_409_and_registers_nothing(settings):
    from assets_app.guards import exceptions

    settings.ASSET_REGISTRATION_MODE = "inline"
    ti = TaskInstanceFactory(running=True)
    locked, release = threading.Event(), threading.Event()
    holder = threading.Thread(
        target=_hold_ti_lock_then,
        args=(ti.id,),
        kwargs={"locked": locked, "release": release, "new_state": TIState.FAILED},
    )
    holder.start()
    assert locked.wait(10)
    results: list = []
    racer = _succeed_in_thread(ti.id, results)
    racer.join(0.5)
    release.set()
    holder.join(10)
    racer.join(10)

    (result,) = results
    assert isinstance(result, exceptions.InvalidState)
    assert result.extra == {"previous_state": "failed"}
    assert AssetEvent.objects.count() == 0
