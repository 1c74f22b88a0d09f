"""Task instance routes of issue 49, as Airflow 3.3.2's `task_instances.py` / `extra_links.py`:
`/tries` and `/tries/{n}` (the current try: earlier tries are not kept here, and an earlier
one says so), `/links` (no task declares extra links: an empty map), `DELETE` (the TI and its
history by retention's deleter, audited; a running one refused)."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from assets_app.api.public_auth import create_api_token
from assets_app.models import AuditEntry, TaskInstance, TIState, XCom
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
