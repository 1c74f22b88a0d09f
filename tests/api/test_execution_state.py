"""PATCH /execution/task-instances/{id}/state and PUT .../heartbeat."""

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from assets_app.cluster import nudges
from assets_app.guards.exceptions import InvalidState
from assets_app.models import (
    AssetDagRunQueue,
    AssetEventQueue,
    DagRunState,
    TaskInstance,
    TIState,
)
from assets_app.outbox import drain
from tests.factories import AssetEventFactory, DagRunFactory, TaskInstanceFactory

from .snapshots import db_snapshot

pytestmark = pytest.mark.django_db

END = "2026-06-30T10:05:00+00:00"
OUTLETS = [
    {"name": "orders", "uri": "s3://bucket/orders", "type": "Asset"},
    {"name": "cleaned", "type": "AssetAlias"},
]
OUTLET_EVENTS = [
    {"dest_asset_key": {"name": "orders", "uri": "s3://bucket/orders"}, "extra": {"rows": 5}},
    {
        "source_alias_name": "cleaned",
        "dest_asset_key": {"name": "orders_clean", "uri": "s3://bucket/orders_clean"},
        "dest_asset_extra": {},
        "extra": {"by": "alias"},
    },
]
SUCCESS = {
    "state": "success",
    "end_date": END,
    "task_outlets": OUTLETS,
    "outlet_events": OUTLET_EVENTS,
    "rendered_map_index": None,
}


def patch_state(worker_api, ti, body):
    return worker_api.request("PATCH", f"/task-instances/{ti.id}/state", body, ti_id=ti.id)


def test_success_sets_state_and_writes_one_outbox_row(worker_api):
    ti = TaskInstanceFactory(running=True, try_number=2)

    response = patch_state(worker_api, ti, SUCCESS)

    assert response.status_code == 204
    assert response.content == b""
    ti.refresh_from_db()
    assert ti.state == TIState.SUCCESS
    assert ti.end_date.isoformat() == END
    (row,) = AssetEventQueue.objects.all()
    assert (row.ti_id, row.try_number) == (ti.id, 2)
    assert (row.source_dag_id, row.source_run_id, row.source_task_id, row.source_map_index) == (
        ti.dag_id,
        ti.run_id,
        ti.task_id,
        -1,
    )
    assert row.payload == {
        "outlets": OUTLETS,
        "outlet_events": OUTLET_EVENTS,
        "source": {
            "ti_id": str(ti.id),
            "dag_id": ti.dag_id,
            "run_id": ti.run_id,
            "task_id": ti.task_id,
            "map_index": -1,
            "try_number": 2,
        },
        "end_date": END,
    }


def test_success_nudges_the_drain_after_commit(worker_api, django_capture_on_commit_callbacks):
    ti = TaskInstanceFactory(running=True)
    with django_capture_on_commit_callbacks() as callbacks:
        assert patch_state(worker_api, ti, SUCCESS).status_code == 204
    assert nudges.nudge_drain in [_sent(cb) for cb in callbacks]


def test_replayed_success_is_200_and_writes_nothing(worker_api):
    ti = TaskInstanceFactory(running=True)
    assert patch_state(worker_api, ti, SUCCESS).status_code == 204
    before = db_snapshot()

    response = patch_state(worker_api, ti, {**SUCCESS, "end_date": "2026-06-30T11:00:00Z"})

    assert response.status_code == 200
    assert db_snapshot() == before
    assert AssetEventQueue.objects.count() == 1


def test_a_success_replayed_after_the_drain_writes_nothing(worker_api):
    """Once the first outbox row is drained (deleted), no unique index refuses a second one:
    the replay itself must write nothing, not lean on the events' idempotency keys."""
    ti = TaskInstanceFactory(running=True)
    assert patch_state(worker_api, ti, SUCCESS).status_code == 204
    assert drain.drain_batch(batch_size=10).registered == 1
    assert AssetEventQueue.objects.count() == 0
    before = db_snapshot()

    response = patch_state(worker_api, ti, SUCCESS)

    assert response.status_code == 200
    assert db_snapshot() == before
    assert AssetEventQueue.objects.count() == 0


@pytest.mark.parametrize("state", ["queued", "failed", "skipped", "upstream_failed"])
def test_success_of_a_ti_that_is_not_running_is_409(worker_api, state):
    ti = TaskInstanceFactory(state=state)
    before = db_snapshot()

    response = patch_state(worker_api, ti, SUCCESS)

    assert response.status_code == 409
    assert response.json() == {
        "detail": {
            "reason": "invalid_state",
            "message": f"task instance is {state}, not running, so it cannot be marked success",
            "previous_state": state,
        }
    }
    assert db_snapshot() == before


def test_state_of_an_unknown_ti_is_404(worker_api):
    ti_id = uuid.uuid4()
    response = worker_api.request("PATCH", f"/task-instances/{ti_id}/state", SUCCESS, ti_id=ti_id)
    assert response.status_code == 404
    assert response.json()["detail"]["reason"] == "not_found"


@pytest.mark.parametrize(
    "body",
    [
        {**SUCCESS, "extra_field": True},
        {**SUCCESS, "state": "deferred"},
        {"state": "success"},
        {**SUCCESS, "task_outlets": [{"name": "x", "type": "Asset", "color": "red"}]},
        {**SUCCESS, "outlet_events": "nope"},
        {"state": "failed", "end_date": END, "task_outlets": []},
        {"state": "up_for_retry", "end_date": END, "retry_delay_seconds": -1},
        [SUCCESS],
    ],
)
def test_invalid_state_body_is_422_and_writes_nothing(worker_api, body):
    ti = TaskInstanceFactory(running=True)
    before = db_snapshot()

    response = patch_state(worker_api, ti, body)

    assert response.status_code == 422, response.content
    assert response.json()["detail"]["reason"] == "validation_error"
    assert db_snapshot() == before


@pytest.mark.parametrize("state", ["failed", "skipped", "removed", "upstream_failed"])
def test_terminal_state_is_204_then_replay_is_200(worker_api, state):
    ti = TaskInstanceFactory(running=True)

    response = patch_state(worker_api, ti, {"state": state, "end_date": END})

    assert response.status_code == 204
    ti.refresh_from_db()
    assert ti.state == state
    assert ti.end_date.isoformat() == END
    assert AssetEventQueue.objects.count() == 0
    before = db_snapshot()
    assert patch_state(worker_api, ti, {"state": state, "end_date": END}).status_code == 200
    assert db_snapshot() == before


def test_retry_with_retries_left_requeues_the_next_try_after_the_delay(worker_api):
    ti = TaskInstanceFactory(running=True, max_tries=2, claimed_by="w", claimed_at=timezone.now())
    before = timezone.now()

    response = patch_state(
        worker_api,
        ti,
        {"state": "up_for_retry", "end_date": END, "retry_delay_seconds": 60, "retry_reason": "x"},
    )

    assert response.status_code == 204
    ti.refresh_from_db()
    assert ti.state == TIState.QUEUED
    assert ti.try_number == 2
    assert (ti.claimed_by, ti.claimed_at, ti.hostname, ti.pid) == ("", None, "", None)
    assert before + timedelta(seconds=59) < ti.retry_at < timezone.now() + timedelta(seconds=61)
    ti.dag_run.refresh_from_db()
    assert ti.dag_run.state == DagRunState.QUEUED  # a queued TI keeps the run unfinished


def test_retry_without_delay_uses_the_default_delay(worker_api):
    ti = TaskInstanceFactory(running=True, max_tries=1)
    assert (
        patch_state(worker_api, ti, {"state": "up_for_retry", "end_date": END}).status_code == 204
    )
    ti.refresh_from_db()
    assert timezone.now() + timedelta(seconds=290) < ti.retry_at


def test_retry_with_no_retries_left_fails_the_ti_and_its_run(worker_api):
    ti = TaskInstanceFactory(running=True, max_tries=1, try_number=2)

    response = patch_state(worker_api, ti, {"state": "up_for_retry", "end_date": END})

    assert response.status_code == 204
    ti.refresh_from_db()
    assert (ti.state, ti.try_number) == (TIState.FAILED, 2)
    ti.dag_run.refresh_from_db()
    assert ti.dag_run.state == DagRunState.FAILED


def test_retry_of_a_ti_that_is_not_running_is_409(worker_api):
    ti = TaskInstanceFactory(max_tries=3)
    before = db_snapshot()
    response = patch_state(worker_api, ti, {"state": "up_for_retry", "end_date": END})
    assert response.status_code == 409
    assert response.json()["detail"]["previous_state"] == "queued"
    assert db_snapshot() == before


def test_dag_run_finishes_when_its_last_ti_finishes(worker_api):
    run = DagRunFactory(state=DagRunState.RUNNING)
    first = TaskInstanceFactory(dag_run=run, running=True)
    second = TaskInstanceFactory(dag_run=run, running=True)

    assert patch_state(worker_api, first, SUCCESS).status_code == 204
    run.refresh_from_db()
    assert run.state == DagRunState.RUNNING
    assert patch_state(worker_api, second, {"state": "skipped", "end_date": END}).status_code == 204
    run.refresh_from_db()
    assert run.state == DagRunState.SUCCESS
    assert run.end_date is not None


def test_dag_run_fails_when_a_ti_failed(worker_api):
    run = DagRunFactory(state=DagRunState.RUNNING)
    first = TaskInstanceFactory(dag_run=run, running=True)
    second = TaskInstanceFactory(dag_run=run, running=True)

    assert patch_state(worker_api, first, {"state": "failed", "end_date": END}).status_code == 204
    assert patch_state(worker_api, second, SUCCESS).status_code == 204
    run.refresh_from_db()
    assert run.state == DagRunState.FAILED


# --- heartbeat -------------------------------------------------------------------------------


def heartbeat(worker_api, ti, hostname="worker-1", pid=4242):
    return worker_api.request(
        "PUT", f"/task-instances/{ti.id}/heartbeat", {"hostname": hostname, "pid": pid}, ti_id=ti.id
    )


def test_heartbeat_updates_last_heartbeat_and_refreshes_the_token(worker_api):
    ti = TaskInstanceFactory(running=True)

    response = heartbeat(worker_api, ti)

    assert response.status_code == 204
    assert response["Refreshed-API-Token"]
    ti.refresh_from_db()
    assert timezone.now() - ti.last_heartbeat_at < timedelta(seconds=5)


def test_heartbeat_from_another_process_is_409_running_elsewhere(worker_api):
    ti = TaskInstanceFactory(running=True)
    before = db_snapshot()

    response = heartbeat(worker_api, ti, pid=7)

    assert response.status_code == 409
    assert response.json() == {
        "detail": {
            "reason": "running_elsewhere",
            "message": "TI is already running elsewhere",
            "current_hostname": "worker-1",
            "current_pid": 4242,
        }
    }
    assert db_snapshot() == before


def test_heartbeat_of_a_finished_ti_is_409_not_running(worker_api):
    ti = TaskInstanceFactory(succeeded=True)
    before = db_snapshot()

    response = heartbeat(worker_api, ti)

    assert response.status_code == 409
    assert response.json() == {
        "detail": {
            "reason": "not_running",
            "message": "TI is no longer in the running state and task should terminate",
            "current_state": "success",
        }
    }
    assert db_snapshot() == before


def test_heartbeat_of_an_unknown_ti_is_404(worker_api):
    ti_id = uuid.uuid4()
    response = worker_api.request(
        "PUT", f"/task-instances/{ti_id}/heartbeat", {"hostname": "h", "pid": 1}, ti_id=ti_id
    )
    assert response.status_code == 404
    assert response.json()["detail"]["reason"] == "not_found"


def test_heartbeat_with_unknown_field_is_422(worker_api):
    ti = TaskInstanceFactory(running=True)
    response = worker_api.request(
        "PUT",
        f"/task-instances/{ti.id}/heartbeat",
        {"hostname": "worker-1", "pid": 4242, "x": 1},
        ti_id=ti.id,
    )
    assert response.status_code == 422


def _sent(callback):
    """The nudge an on-commit callback sends (`nudges.send_robustly(nudge, ...)`), else None."""
    if getattr(callback, "func", None) is nudges.send_robustly:
        return callback.args[0]
    return None


def _nudged_dag_ids(callbacks) -> list[list[str]]:
    return [cb.keywords["dag_ids"] for cb in callbacks if _sent(cb) is nudges.nudge_scheduler]


def test_finishing_a_run_nudges_the_scheduler_when_its_dag_has_waiting_events(
    worker_api, django_capture_on_commit_callbacks
):
    """A finished run frees a max_active_runs slot: waiting events must not wait for the sweep."""
    run = DagRunFactory(state=DagRunState.RUNNING)
    ti = TaskInstanceFactory(dag_run=run, running=True)
    event = AssetEventFactory()
    AssetDagRunQueue.objects.create(target_dag=run.dag, asset_event=event, asset=event.asset)

    with django_capture_on_commit_callbacks() as callbacks:
        assert patch_state(worker_api, ti, {"state": "failed", "end_date": END}).status_code == 204
    assert _nudged_dag_ids(callbacks) == [[run.dag_id]]


def test_finishing_a_run_without_waiting_events_sends_no_scheduler_nudge(
    worker_api, django_capture_on_commit_callbacks
):
    run = DagRunFactory(state=DagRunState.RUNNING)
    first = TaskInstanceFactory(dag_run=run, running=True)
    second = TaskInstanceFactory(dag_run=run, running=True)

    with django_capture_on_commit_callbacks() as callbacks:
        assert (
            patch_state(worker_api, first, {"state": "failed", "end_date": END}).status_code == 204
        )
        assert (
            patch_state(worker_api, second, {"state": "failed", "end_date": END}).status_code == 204
        )
    assert _nudged_dag_ids(callbacks) == []


@pytest.mark.django_db(transaction=True)
def test_concurrent_successes_of_one_try_write_one_outbox_row_and_one_is_a_replay():
    """Two success requests for the same running TI race: the outbox row's unique index makes
    the loser wait, then it answers from the committed state (replay), writing nothing."""
    import threading

    from django.db import connection

    from assets_app.task_state import success

    ti = TaskInstanceFactory(running=True)
    barrier = threading.Barrier(8)
    results: list = []

    def succeed() -> None:
        try:
            barrier.wait(5)
            results.append(
                success.succeed(
                    ti_id=ti.id,
                    try_number=ti.try_number,
                    end_date=timezone.now(),
                    task_outlets=OUTLETS,
                    outlet_events=[],
                ).replayed
            )
        finally:
            connection.close()

    threads = [threading.Thread(target=succeed) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(results) == [False] + [True] * 7
    assert AssetEventQueue.objects.filter(ti_id=ti.id).count() == 1
    ti.refresh_from_db()
    assert ti.state == TIState.SUCCESS


def test_success_rolls_back_its_outbox_row_when_the_ti_changed_before_the_lock(monkeypatch):
    """The TI is read, its outbox row inserted, then the locking UPDATE finds it no longer
    running: the row is rolled back with the transaction and the answer is a 409."""
    from assets_app.task_state import success

    ti = TaskInstanceFactory(running=True)
    real_lock = success._set_success_if_running

    def lock_after_a_concurrent_failure(*, ti, end_date):
        TaskInstance.objects.filter(id=ti.id).update(state=TIState.FAILED)
        return real_lock(ti=ti, end_date=end_date)

    monkeypatch.setattr(success, "_set_success_if_running", lock_after_a_concurrent_failure)
    with pytest.raises(InvalidState) as raised:
        success.succeed(
            ti_id=ti.id,
            try_number=ti.try_number,
            end_date=timezone.now(),
            task_outlets=OUTLETS,
            outlet_events=[],
        )
    assert raised.value.extra["previous_state"] == TIState.FAILED
    assert not AssetEventQueue.objects.exists()
