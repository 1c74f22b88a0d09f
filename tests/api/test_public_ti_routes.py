"""Task instance routes of issue 49, as Airflow 3.3.2's `task_instances.py` / `extra_links.py`:
`/tries` and `/tries/{n}` (the current try: earlier tries are not kept here, and an earlier
one says so), `/links` (no task declares extra links: an empty map), `DELETE` (the TI and its
history by retention's deleter, audited; a running one refused)."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from assets_app.api.public_auth import create_api_token
from assets_app.models import AuditEntry, TaskInstance, TaskUpstream, TIState, XCom
from assets_app.runtime import xcoms
from tests.api.snapshots import db_snapshot
from tests.factories import DagFactory, DagRunFactory, TaskFactory, TaskInstanceFactory

pytestmark = pytest.mark.django_db

TI = "/api/v2/dags/d/dagRuns/r/taskInstances"


@pytest.fixture
def api():
    get_user_model().objects.create_user("ops", password="pw", is_staff=True, is_superuser=True)
    _, key = create_api_token(username="ops", name="test")
    return Client(headers={"Authorization": f"Bearer {key}"})


@pytest.fixture
def run():
    dag = DagFactory(dag_id="d")
    TaskFactory(dag=dag, task_id="t")
    TaskFactory(dag=dag, task_id="m")
    run = DagRunFactory(dag=dag, run_id="r", state="failed")
    TaskInstanceFactory(dag_run=run, task_id="t", succeeded=True, try_number=2)
    for index in (0, 1):
        TaskInstanceFactory(dag_run=run, task_id="m", map_index=index, state=TIState.FAILED)
    return run


def test_tries_list_the_current_try_and_an_earlier_one_says_it_is_not_kept(api, run):
    body = api.get(f"{TI}/t/tries").json()
    assert body["total_entries"] == 1
    assert (body["task_instances"][0]["try_number"], body["task_instances"][0]["state"]) == (
        2,
        "success",
    )
    assert api.get(f"{TI}/t/tries/2").json()["dag_run_id"] == "r"
    earlier = api.get(f"{TI}/t/tries/1")
    assert earlier.status_code == 404
    assert earlier.json()["detail"]["reason"] == "task_instance_try_not_kept"
    assert "earlier tries are not kept" in earlier.json()["detail"]["message"]
    (mapped,) = api.get(f"{TI}/m/1/tries").json()["task_instances"]
    assert mapped["map_index"] == 1
    assert api.get(f"{TI}/m/1/tries/{mapped['try_number']}").json()["map_index"] == 1
    missing = api.get(f"{TI}/m/tries")
    assert missing.status_code == 404
    assert missing.json()["detail"]["message"] == (
        "The Task Instance with dag_id: `d`, run_id: `r`, task_id: `m` and map_index: `-1` "
        "was not found"
    )


def test_links_are_an_empty_map_for_an_existing_ti(api, run):
    assert api.get(f"{TI}/t/links").json() == {"extra_links": {}, "total_entries": 0}
    assert api.get(f"{TI}/m/links", {"map_index": 0}).json()["total_entries"] == 0
    response = api.get(f"{TI}/nope/links")
    assert response.status_code == 404
    assert response.json()["detail"]["message"] == "TaskInstance not found"


def test_delete_task_instance_with_its_xcoms_audited_and_a_replay_is_404(api, run):
    xcoms.push(dag_id="d", run_id="r", task_id="m", key="k", value=1, map_index=0)
    xcoms.push(dag_id="d", run_id="r", task_id="m", key="k", value=2, map_index=1)
    response = api.delete(f"{TI}/m", {}, content_type="application/json")
    assert response.status_code == 404  # map index -1: none
    response = api.delete(f"{TI}/m?map_index=0")
    assert response.status_code == 200, response.content
    assert response.json() is None
    assert list(TaskInstance.objects.filter(task_id="m").values_list("map_index", flat=True)) == [1]
    assert list(XCom.objects.values_list("map_index", flat=True)) == [1]
    assert AuditEntry.objects.get(action="task_instance.delete").detail["map_index"] == 0
    before = db_snapshot()
    assert api.delete(f"{TI}/m?map_index=0").status_code == 404
    assert db_snapshot() == before


def test_a_running_task_instance_is_not_deleted(api, run):
    TaskInstance.objects.filter(task_id="t").update(state=TIState.RUNNING)
    before = db_snapshot()
    response = api.delete(f"{TI}/t")
    assert response.status_code == 409
    assert response.json()["detail"]["reason"] == "task_instance_running"
    assert db_snapshot() == before


# --- PATCH .../taskInstances/{task_id}[/{map_index}][/dry_run] -----------------------------


@pytest.fixture
def chain():
    """`a` -> `b` -> `c` in a failed run: `a` failed, `b` upstream_failed, `c` upstream_failed."""
    dag = DagFactory(dag_id="d")
    tasks = {t: TaskFactory(dag=dag, task_id=t) for t in ("a", "b", "c")}
    TaskUpstream.objects.create(task=tasks["b"], upstream=tasks["a"])
    TaskUpstream.objects.create(task=tasks["c"], upstream=tasks["b"])
    run = DagRunFactory(dag=dag, run_id="r", state="failed")
    TaskInstanceFactory(dag_run=run, task_id="a", state=TIState.FAILED, try_number=1)
    for t in ("b", "c"):
        TaskInstanceFactory(dag_run=run, task_id=t, state=TIState.UPSTREAM_FAILED, try_number=1)
    return run


def test_marking_a_failed_ti_success_clears_its_failed_downstream_and_a_replay_is_409(api, chain):
    response = api.patch(f"{TI}/a", {"new_state": "SUCCESS"}, content_type="application/json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["total_entries"] == 1 and body["task_instances"][0]["state"] == "success"
    # Airflow's set_task_instance_state: the failed downstream are cleared (a new try), the
    # run queued again; `b` is queued as its upstream is done.
    states = dict(TaskInstance.objects.values_list("task_id", "state"))
    assert states["a"] == "success"
    assert states["b"] == "queued" and states["c"] == "scheduled"
    assert TaskInstance.objects.get(task_id="b").try_number == 2
    assert AuditEntry.objects.filter(action="task_instance.patch").count() == 1
    before = db_snapshot()
    again = api.patch(f"{TI}/a", {"new_state": "success"}, content_type="application/json")
    assert again.status_code == 409
    assert again.json()["detail"]["message"] == "Task id a is already in success state"
    assert db_snapshot() == before


def test_dry_run_answers_what_would_change_and_writes_nothing(api, run):
    before = db_snapshot()
    response = api.patch(
        f"{TI}/m/dry_run", {"new_state": "failed"}, content_type="application/json"
    )
    assert response.status_code == 200
    assert response.json()["total_entries"] == 0  # both map indexes are failed already
    one = api.patch(f"{TI}/m/1/dry_run", {"new_state": "skipped"}, content_type="application/json")
    assert [ti["map_index"] for ti in one.json()["task_instances"]] == [1]
    assert db_snapshot() == before


def test_note_by_map_index_with_update_mask_and_an_empty_note_removes_it(api, run):
    response = api.patch(
        f"{TI}/m/0?update_mask=note",
        {"new_state": "success", "note": "checked"},
        content_type="application/json",
    )
    assert response.status_code == 200
    (ti,) = response.json()["task_instances"]
    assert (ti["state"], ti["note"]) == ("failed", "checked")
    assert TaskInstance.objects.get(task_id="m", map_index=1).note is None
    cleared = api.patch(f"{TI}/m/0", {"note": ""}, content_type="application/json")
    assert cleared.json()["task_instances"][0]["note"] is None


@pytest.mark.parametrize(
    ("body", "status", "named"),
    [
        ({"new_state": "running"}, 422, "new_state"),
        ({"new_state": None}, 422, "new_state"),
        ({"new_state": "success", "colour": 1}, 422, "colour"),
        ({"new_state": "success", "include_downstream": True}, 400, "include_downstream"),
    ],
)
def test_bad_ti_patches_are_4xx_naming_the_problem_and_write_nothing(api, run, body, status, named):
    before = db_snapshot()
    response = api.patch(f"{TI}/t", body, content_type="application/json")
    assert response.status_code == status, response.content
    assert named in response.content.decode()
    assert db_snapshot() == before


def test_unknown_task_and_missing_ti_are_airflows_404s(api, run):
    response = api.patch(f"{TI}/nope", {"new_state": "success"}, content_type="application/json")
    assert response.json()["detail"]["message"] == "Task 'nope' not found in Dag 'd'"
    response = api.patch(f"{TI}/m/7", {"new_state": "success"}, content_type="application/json")
    assert response.status_code == 404
    assert response.json()["detail"]["message"] == (
        "The Task Instance with dag_id: `d`, run_id: `r`, task_id: `m` and map_index: `7` "
        "was not found"
    )
