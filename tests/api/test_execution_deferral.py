"""Deferral (issue 42): PATCH .../state with Airflow's deferred payload, the triggerer's claim,
event and failure routes, trigger timeouts, and the resumed TI's run context."""

import json
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from assets_app.models import Pool, TaskInstance, TIState, Trigger, XCom
from assets_app.runtime import pools
from assets_app.task_state import claims, deferral, liveness
from tests.factories import DagFactory, DagRunFactory, TaskFactory, TaskInstanceFactory
from tests.test_invariant_guards import lock_timeout, other_connection

from .snapshots import db_snapshot
from .test_execution_lock_hold import kinds, statement_log

pytestmark = pytest.mark.django_db

KEY = "dev-worker-api-key"
# What the Task SDK 1.3.2 sends for `TimeDeltaSensor(deferrable=True)` (its `_defer_task`,
# trigger kwargs and next kwargs through its serde).
MOMENT = {
    "__classname__": "pendulum.datetime.DateTime",
    "__version__": 2,
    "__data__": {"timestamp": 1780000000.0, "tz": "UTC"},
}
DEFERRED = {
    "state": "deferred",
    "classpath": "airflow.providers.standard.triggers.temporal.DateTimeTrigger",
    "trigger_kwargs": {"moment": MOMENT, "end_from_trigger": False},
    "trigger_timeout": "PT1H",
    "next_method": "execute_complete",
    "next_kwargs": {"note": "kept"},
}
RUN = {
    "state": "running",
    "hostname": "w2",
    "unixname": "airflow",
    "pid": 4242,
    "start_date": "2026-06-30T11:00:00+00:00",
}


@pytest.fixture(autouse=True)
def _api_key(settings):
    settings.WORKER_API_KEY = KEY


def patch_state(worker_api, ti, body):
    return worker_api.request("PATCH", f"/task-instances/{ti.id}/state", body, ti_id=ti.id)


def post(worker_api, path, body):
    return worker_api.client.post(
        f"/execution{path}",
        data=json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {KEY}"},
    )


def claim(worker_api, *, triggerer="t1", limit=10, held=()):
    response = post(
        worker_api, "/triggers/claim", {"triggerer": triggerer, "limit": limit, "held": held}
    )
    assert response.status_code == 200, response.content
    return response.json()


def test_deferral_stores_the_trigger_and_parks_the_ti(worker_api):
    ti = TaskInstanceFactory(running=True, try_number=2)
    before = timezone.now()

    response = patch_state(worker_api, ti, DEFERRED)

    assert response.status_code == 204, response.content
    ti.refresh_from_db()
    assert ti.state == TIState.DEFERRED
    assert ti.next_method == "execute_complete"
    assert ti.next_kwargs == {"note": "kept"}
    assert before + timedelta(hours=1) <= ti.trigger_timeout <= timezone.now() + timedelta(hours=1)
    trigger = Trigger.objects.get()
    assert ti.trigger_id == trigger.id
    assert trigger.classpath == DEFERRED["classpath"]
    assert json.loads(trigger.kwargs) == DEFERRED["trigger_kwargs"]


def test_a_replayed_deferral_is_200_and_writes_nothing(worker_api):
    ti = TaskInstanceFactory(running=True)
    assert patch_state(worker_api, ti, DEFERRED).status_code == 204
    before = db_snapshot()

    assert patch_state(worker_api, ti, DEFERRED).status_code == 200

    assert db_snapshot() == before


def test_a_deferral_of_a_ti_not_running_is_409_and_writes_nothing(worker_api):
    ti = TaskInstanceFactory(state=TIState.QUEUED)
    before = db_snapshot()

    response = patch_state(worker_api, ti, DEFERRED)

    assert response.status_code == 409
    assert response.json()["detail"]["previous_state"] == "queued"
    assert db_snapshot() == before


def test_a_stale_token_cannot_defer(worker_api):
    ti = TaskInstanceFactory(running=True, try_number=2)
    from assets_app.api import auth

    token = auth.issue_token(ti.id, try_number=1)
    before = db_snapshot()

    response = worker_api.request("PATCH", f"/task-instances/{ti.id}/state", DEFERRED, token=token)

    assert response.status_code == 409
    assert response.json()["detail"]["reason"] == "stale_try"
    assert db_snapshot() == before


@pytest.mark.parametrize(
    "change",
    [
        {"classpath": None},
        {"next_method": None},
        {"unknown": 1},
        {"trigger_timeout": "not a duration"},
        {"next_kwargs": "a string"},
    ],
)
def test_a_bad_deferred_body_is_422_and_writes_nothing(worker_api, change):
    ti = TaskInstanceFactory(running=True)
    body = {k: v for k, v in {**DEFERRED, **change}.items() if v is not None}
    before = db_snapshot()

    response = patch_state(worker_api, ti, body)

    assert response.status_code == 422
    assert db_snapshot() == before


def test_an_encrypted_kwargs_string_is_stored_as_sent(worker_api):
    ti = TaskInstanceFactory(running=True)

    response = patch_state(worker_api, ti, {**DEFERRED, "trigger_kwargs": "gAAAA-encrypted"})

    assert response.status_code == 204
    assert Trigger.objects.get().kwargs == "gAAAA-encrypted"


def test_an_event_resumes_the_ti_in_its_next_method(worker_api):
    ti = TaskInstanceFactory(running=True, try_number=3)
    assert patch_state(worker_api, ti, DEFERRED).status_code == 204
    ti.refresh_from_db()
    first_start = ti.start_date
    (claimed,) = claim(worker_api)["triggers"]
    assert claimed["id"] == ti.trigger_id
    assert claimed["classpath"] == DEFERRED["classpath"]
    assert json.loads(claimed["encrypted_kwargs"]) == DEFERRED["trigger_kwargs"]
    assert claimed["ti"]["id"] == str(ti.id) and claimed["ti"]["try_number"] == 3
    # A token of the TI's try: the trigger's execution API reads (a deferred TI's token reads).
    count = worker_api.request(
        "GET", "/task-instances/count", token=claimed["token"], dag_id=ti.dag_id
    )
    assert count.status_code == 200, count.content

    event = post(worker_api, f"/triggers/{claimed['id']}/event", {"payload": MOMENT})

    assert event.status_code == 200 and event.json() == {"resumed": True}
    ti.refresh_from_db()
    assert ti.state == TIState.QUEUED and ti.try_number == 3
    assert ti.trigger_id is None and ti.claimed_at is None
    assert ti.next_method == "execute_complete"
    assert ti.next_kwargs == {"note": "kept", "event": MOMENT}

    run = worker_api.request("PATCH", f"/task-instances/{ti.id}/run", RUN, ti_id=ti.id)

    assert run.status_code == 200, run.content
    context = run.json()
    assert context["next_method"] == "execute_complete"
    assert context["next_kwargs"] == {"note": "kept", "event": MOMENT}
    assert context["start_date"] is not None
    assert context["xcom_keys_to_clear"] == []
    ti.refresh_from_db()
    assert ti.start_date == first_start


def test_a_second_event_for_the_same_trigger_changes_nothing(worker_api):
    ti = TaskInstanceFactory(running=True)
    patch_state(worker_api, ti, DEFERRED)
    trigger_id = TaskInstance.objects.get(id=ti.id).trigger_id
    assert post(worker_api, f"/triggers/{trigger_id}/event", {"payload": 1}).json()["resumed"]
    before = db_snapshot()

    again = post(worker_api, f"/triggers/{trigger_id}/event", {"payload": 2})

    assert again.status_code == 200 and again.json() == {"resumed": False}
    assert db_snapshot() == before


def test_a_failure_resumes_the_ti_to_fail(worker_api):
    ti = TaskInstanceFactory(running=True)
    patch_state(worker_api, ti, DEFERRED)
    trigger_id = TaskInstance.objects.get(id=ti.id).trigger_id

    response = post(worker_api, f"/triggers/{trigger_id}/failure", {"traceback": ["boom\n"]})

    assert response.json() == {"resumed": True}
    ti.refresh_from_db()
    assert ti.state == TIState.QUEUED
    assert ti.next_method == "__fail__"
    assert ti.next_kwargs == {"error": "Trigger failure", "traceback": ["boom\n"]}


def test_a_timed_out_trigger_resumes_the_ti_to_fail_and_is_deleted(worker_api):
    ti = TaskInstanceFactory(running=True)
    patch_state(worker_api, ti, {**DEFERRED, "trigger_timeout": "PT10S"})
    other = TaskInstanceFactory(running=True)
    patch_state(worker_api, other, DEFERRED)
    assert deferral.next_timeout_at() == TaskInstance.objects.get(id=ti.id).trigger_timeout

    result = deferral.time_out_triggers(now=timezone.now() + timedelta(seconds=11))

    assert result == deferral.TimeoutPass(timed_out=1, deleted=1)
    ti.refresh_from_db()
    assert ti.state == TIState.QUEUED
    assert (ti.next_method, ti.next_kwargs) == ("__fail__", {"error": "Trigger timeout"})
    assert TaskInstance.objects.get(id=other.id).state == TIState.DEFERRED
    assert list(Trigger.objects.values_list("id", flat=True)) == [
        TaskInstance.objects.get(id=other.id).trigger_id
    ]


def test_a_timed_out_trigger_is_not_claimed(worker_api):
    ti = TaskInstanceFactory(running=True)
    patch_state(worker_api, ti, {**DEFERRED, "trigger_timeout": "-PT1S"})

    assert claim(worker_api)["triggers"] == []


def test_a_lease_keeps_others_off_until_it_ends(worker_api, settings):
    settings.TRIGGER_LEASE_SECONDS = 30
    ti = TaskInstanceFactory(running=True)
    patch_state(worker_api, ti, DEFERRED)
    (mine,) = claim(worker_api, triggerer="t1")["triggers"]

    assert claim(worker_api, triggerer="t2")["triggers"] == []
    renewed = claim(worker_api, triggerer="t1", held=[mine["id"]])
    assert renewed == {"triggers": [], "released": [], "lease_seconds": 30.0}

    Trigger.objects.update(lease_until=timezone.now() - timedelta(seconds=1))  # t1 died
    (theirs,) = claim(worker_api, triggerer="t2")["triggers"]
    assert theirs["id"] == mine["id"]
    assert claim(worker_api, triggerer="t1", held=[mine["id"]])["released"] == [mine["id"]]


def test_a_resumed_trigger_is_released_from_its_holder(worker_api):
    ti = TaskInstanceFactory(running=True)
    patch_state(worker_api, ti, DEFERRED)
    (held,) = claim(worker_api)["triggers"]
    post(worker_api, f"/triggers/{held['id']}/event", {"payload": None})

    assert claim(worker_api, held=[held["id"]])["released"] == [held["id"]]


def test_the_triggerer_routes_need_the_worker_api_key(worker_api):
    response = worker_api.client.post(
        "/execution/triggers/claim",
        data=json.dumps({"triggerer": "t"}),
        content_type="application/json",
    )
    assert response.status_code == 401


def test_the_heartbeat_sweep_leaves_a_deferred_ti_alone(worker_api, settings):
    settings.TASK_HEARTBEAT_TIMEOUT_SECONDS = 1
    ti = TaskInstanceFactory(running=True)
    patch_state(worker_api, ti, DEFERRED)
    TaskInstance.objects.filter(id=ti.id).update(
        last_heartbeat_at=timezone.now() - timedelta(hours=1)
    )

    assert liveness.fail_dead_task_instances() == liveness.HeartbeatSweep(retried=(), failed=())
    assert TaskInstance.objects.get(id=ti.id).state == TIState.DEFERRED


def test_a_retry_after_resuming_starts_the_task_afresh(worker_api):
    ti = TaskInstanceFactory(running=True, max_tries=2)
    patch_state(worker_api, ti, DEFERRED)
    trigger_id = TaskInstance.objects.get(id=ti.id).trigger_id
    post(worker_api, f"/triggers/{trigger_id}/event", {"payload": 1})
    run = worker_api.request("PATCH", f"/task-instances/{ti.id}/run", RUN, ti_id=ti.id)
    assert run.status_code == 200

    retry = {"state": "up_for_retry", "end_date": "2026-06-30T11:01:00+00:00"}
    assert patch_state(worker_api, ti, retry).status_code == 204

    ti.refresh_from_db()
    assert (ti.state, ti.try_number) == (TIState.QUEUED, 2)
    assert (ti.next_method, ti.next_kwargs, ti.trigger_id) == (None, None, None)


@pytest.mark.django_db(transaction=True)
def test_two_triggerers_claiming_at_once_never_share_a_trigger(worker_api):
    for _ in range(20):
        patch_state(worker_api, TaskInstanceFactory(running=True), DEFERRED)
    got: dict[str, list[int]] = {}
    barrier = threading.Barrier(4)

    def run(name: str) -> None:
        try:
            barrier.wait()
            claim_ = deferral.claim_triggers(triggerer=name, limit=8, held=[])
            got[name] = [t.id for t in claim_.triggers]
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(f"t{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    claimed = [i for ids in got.values() for i in ids]
    assert len(claimed) == len(set(claimed)) == 20


# --- what a deferred TI holds (Airflow's pool and concurrency counts) -------------------------


def _queued(run, task, n):
    now = timezone.now()
    return [
        TaskInstanceFactory(
            dag_run=run, task_id=task.task_id, map_index=i, queued_at=now + timedelta(0, i)
        )
        for i in range(n)
    ]


def _claimed_ids() -> list:
    return [w.ti.id for w in claims.claim_workloads(hostname="w", limit=100)]


@pytest.mark.parametrize("include_deferred", [True, False])
def test_a_deferred_ti_holds_its_pool_slot_only_with_include_deferred(include_deferred):
    Pool.objects.create(name="one", slots=1, include_deferred=include_deferred)
    run = DagRunFactory()
    task = TaskFactory(dag=run.dag, pool="one")
    deferred, waiting = _queued(run, task, 2)
    TaskInstance.objects.filter(id=deferred.id).update(state=TIState.DEFERRED)

    assert _claimed_ids() == ([] if include_deferred else [waiting.id])
    (slots,) = pools.with_slots([Pool.objects.get(name="one")])
    # With include_deferred the deferred TI is the occupant; without, the claimed one is.
    assert (slots.deferred, slots.occupied) == (1, 1)


def test_a_deferred_ti_counts_against_its_task_limits_not_max_active_tasks():
    dag = DagFactory(max_active_tasks=1)
    run = DagRunFactory(dag=dag)
    limited = TaskFactory(dag=dag, task_id="limited", max_active_tis_per_dag=1)
    free = TaskFactory(dag=dag, task_id="free")
    deferred, held_back = _queued(run, limited, 2)
    TaskInstance.objects.filter(id=deferred.id).update(state=TIState.DEFERRED)
    (other,) = _queued(run, free, 1)

    assert _claimed_ids() == [other.id]
    assert held_back.id not in _claimed_ids()


# --- end_from_trigger ---------------------------------------------------------------------------


def test_a_trigger_ending_its_task_succeeds_it_with_its_xcoms(worker_api):
    ti = TaskInstanceFactory(running=True)
    patch_state(worker_api, ti, DEFERRED)
    trigger_id = TaskInstance.objects.get(id=ti.id).trigger_id

    response = post(
        worker_api,
        f"/triggers/{trigger_id}/end",
        {"state": "success", "xcoms": {"moment": MOMENT}},
    )

    assert response.status_code == 200 and response.json() == {"state": "success"}
    ti.refresh_from_db()
    assert (ti.state, ti.trigger_id, ti.next_method) == (TIState.SUCCESS, None, None)
    assert ti.end_date is not None
    assert XCom.objects.get(run_id=ti.run_id, task_id=ti.task_id, key="moment").value == MOMENT
    again = post(worker_api, f"/triggers/{trigger_id}/end", {"state": "success"})
    assert again.json() == {"state": None}


@pytest.mark.parametrize(("max_tries", "ends"), [(1, "up_for_retry"), (0, "failed")])
def test_a_trigger_failing_its_task_retries_it_while_tries_remain(worker_api, max_tries, ends):
    ti = TaskInstanceFactory(running=True, max_tries=max_tries)
    patch_state(worker_api, ti, DEFERRED)
    trigger_id = TaskInstance.objects.get(id=ti.id).trigger_id

    response = post(worker_api, f"/triggers/{trigger_id}/end", {"state": "failed"})

    assert response.json() == {"state": ends}
    ti.refresh_from_db()
    if ends == "up_for_retry":
        assert (ti.state, ti.try_number, ti.next_method) == (TIState.QUEUED, 2, None)
    else:
        assert (ti.state, ti.try_number) == (TIState.FAILED, 1)


def test_a_ti_that_left_deferred_otherwise_lets_go_of_its_trigger(worker_api):
    """Airflow's `clean_unused`: a TI no longer deferred (its run timed out, an operator marked
    it) is unlinked from its trigger, which is then deleted; a live trigger stays."""
    gone = TaskInstanceFactory(running=True)
    patch_state(worker_api, gone, DEFERRED)
    live = TaskInstanceFactory(running=True)
    patch_state(worker_api, live, DEFERRED)
    TaskInstance.objects.filter(id=gone.id).update(state=TIState.SKIPPED)

    result = deferral.time_out_triggers()

    assert result == deferral.TimeoutPass(timed_out=0, deleted=1)
    assert TaskInstance.objects.get(id=gone.id).trigger_id is None
    live.refresh_from_db()
    assert list(Trigger.objects.values_list("id", flat=True)) == [live.trigger_id]


# --- invariant 1: the TI lock covers only the state change ------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_deferral_inserts_its_trigger_before_the_lock_and_holds_it_for_one_statement():
    ti = TaskInstanceFactory(running=True)
    with statement_log() as log:
        deferral.defer(
            ti_id=ti.id,
            try_number=ti.try_number,
            classpath=DEFERRED["classpath"],
            trigger_kwargs=DEFERRED["trigger_kwargs"],
            trigger_timeout=timedelta(hours=1),
            queue=None,
            next_method="execute_complete",
            next_kwargs={},
        )
    assert kinds(log.under_ti_lock()) == ["UPDATE"]
    assert TaskInstance.objects.get(id=ti.id).state == TIState.DEFERRED


@pytest.mark.django_db(transaction=True)
def test_a_resume_holds_the_lock_for_one_statement():
    (trigger_id,) = _deferred_triggers(1)
    with statement_log() as log:
        assert deferral.resume_with_event(trigger_id=trigger_id, payload={"x": 1})
    assert kinds(log.under_ti_lock()) == ["UPDATE"]


@pytest.mark.django_db(transaction=True)
def test_a_trigger_ending_its_task_holds_the_lock_for_two_statements():
    (trigger_id,) = _deferred_triggers(1)
    with statement_log() as log:
        assert deferral.end_from_trigger(trigger_id=trigger_id, state="success", xcoms={"k": 1})
    assert kinds(log.under_ti_lock()) == ["SELECT FOR UPDATE", "UPDATE"]


# --- invariant 5: a trigger claim never waits; nothing under a TI lock waits for a trigger ----


def _deferred_triggers(n: int) -> list[int]:
    ids = []
    for _ in range(n):
        ti = TaskInstanceFactory(running=True)
        deferral.defer(
            ti_id=ti.id,
            try_number=ti.try_number,
            classpath=DEFERRED["classpath"],
            trigger_kwargs={},
            trigger_timeout=None,
            queue=None,
            next_method="execute_complete",
            next_kwargs={},
        )
        ids.append(TaskInstance.objects.get(id=ti.id).trigger_id)
    return ids


@pytest.mark.django_db(transaction=True)
def test_a_trigger_claim_skips_a_trigger_another_claim_holds_and_never_waits():
    held, *free = _deferred_triggers(3)
    with other_connection() as other:
        other.execute("SELECT id FROM assets_app_trigger WHERE id = %s FOR UPDATE", [held])
        with lock_timeout():
            claimed = deferral.claim_triggers(triggerer="t2", limit=10, held=[])
    assert [t.id for t in claimed.triggers] == free


@pytest.mark.django_db(transaction=True)
def test_a_resume_and_the_cleanup_never_wait_for_a_claimed_trigger():
    held, other_id = _deferred_triggers(2)
    with other_connection() as other:
        other.execute(
            "SELECT id FROM assets_app_trigger WHERE id IN (%s, %s) FOR UPDATE", [held, other_id]
        )
        with lock_timeout():
            assert deferral.resume_with_event(trigger_id=held, payload=None)
            # The resumed trigger is unused, but a claim holds it: skipped, not waited for.
            assert deferral.time_out_triggers().deleted == 0
    assert deferral.time_out_triggers().deleted == 1
    assert list(Trigger.objects.values_list("id", flat=True)) == [other_id]
