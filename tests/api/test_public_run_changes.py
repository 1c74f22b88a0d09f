"""`PATCH` and `DELETE /api/v2/dags/{dag_id}/dagRuns/{dag_run_id}` (issue 49) as Airflow
3.3.2's `patch_dag_run` / `delete_dag_run`: a state set as `mark_tasks` sets it (running TIs
take it, the other unfinished ones are skipped, teardowns left alone), a note replaced or
removed, only what the body sends (narrowed by `update_mask`); a run deleted with its history
by retention's deleter, a running one refused. Audited; replays write nothing; bad input is a
4xx naming the problem and writes nothing."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from assets_app.api.public_auth import create_api_token
from assets_app.models import AuditEntry, DagRun, TaskInstance, TIState, XCom
from assets_app.runtime import xcoms
from tests.api.snapshots import db_snapshot
from tests.factories import DagFactory, DagRunFactory, TaskFactory, TaskInstanceFactory

pytestmark = pytest.mark.django_db

RUN = "/api/v2/dags/d/dagRuns/r"


@pytest.fixture
def api():
    get_user_model().objects.create_user("ops", password="pw", is_staff=True, is_superuser=True)
    _, key = create_api_token(username="ops", name="test")
    return Client(headers={"Authorization": f"Bearer {key}"})


def _run(state: str = "running") -> DagRun:
    dag = DagFactory(dag_id="d")
    for task_id in ("done", "busy", "waiting", "teardown"):
        TaskFactory(dag=dag, task_id=task_id, is_teardown=task_id == "teardown")
    run = DagRunFactory(dag=dag, run_id="r", state=state)
    TaskInstanceFactory(dag_run=run, task_id="done", succeeded=True)
    TaskInstanceFactory(dag_run=run, task_id="busy", running=True)
    TaskInstanceFactory(dag_run=run, task_id="waiting", state=TIState.SCHEDULED)
    TaskInstanceFactory(dag_run=run, task_id="teardown", state=TIState.SUCCESS)
    return run


def _states(run: DagRun) -> dict[str, str]:
    return dict(TaskInstance.objects.filter(dag_run=run).values_list("task_id", "state"))


def test_failed_fails_running_tis_skips_the_others_and_a_replay_writes_nothing(api):
    run = _run()
    response = api.patch(RUN, {"state": "failed"}, content_type="application/json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["state"] == "failed" and body["end_date"] is not None
    assert _states(run) == {
        "done": "success",
        "busy": "failed",
        "waiting": "skipped",
        "teardown": "success",
    }
    assert AuditEntry.objects.filter(action="dag_run.patch").count() == 1
    before = db_snapshot()
    again = api.patch(RUN, {"state": "failed"}, content_type="application/json")
    assert again.status_code == 200 and again.json() == body
    assert db_snapshot() == before


def test_success_leaves_the_run_running_while_a_teardown_is_unfinished(api):
    run = _run()
    TaskInstance.objects.filter(dag_run=run, task_id="teardown").update(state=TIState.QUEUED)
    response = api.patch(RUN, {"state": "success"}, content_type="application/json")
    assert response.status_code == 200
    assert response.json()["state"] == "running"
    assert _states(run) == {
        "done": "success",
        "busy": "success",
        "waiting": "skipped",
        "teardown": "queued",
    }


def test_queued_requeues_the_run_alone(api):
    run = _run(state="failed")
    response = api.patch(RUN, {"state": "queued"}, content_type="application/json")
    assert response.status_code == 200
    run.refresh_from_db()
    assert (run.state, run.start_date, run.end_date) == ("queued", None, None)
    assert _states(run)["busy"] == "running"


def test_update_mask_narrows_the_body_and_an_empty_note_removes_it(api):
    run = _run()
    response = api.patch(
        RUN + "?update_mask=note",
        {"state": "failed", "note": "looked at"},
        content_type="application/json",
    )
    assert response.status_code == 200
    assert (response.json()["state"], response.json()["note"]) == ("running", "looked at")
    # A body without `note` leaves it; "" removes it.
    api.patch(RUN, {"state": None}, content_type="application/json")
    run.refresh_from_db()
    assert run.note == "looked at" and run.state == "running"
    assert api.patch(RUN, {"note": ""}, content_type="application/json").json()["note"] is None


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"state": "running"}, "state"),
        ({"state": "success", "colour": "red"}, "colour"),
        ({"note": "x" * 1001}, "note"),
    ],
)
def test_bad_patch_bodies_are_422_naming_the_field_and_write_nothing(api, body, named):
    _run()
    before = db_snapshot()
    response = api.patch(RUN, body, content_type="application/json")
    assert response.status_code == 422
    assert named in {str(part) for error in response.json()["detail"] for part in error["loc"]}
    assert db_snapshot() == before


def test_unknown_run_is_airflows_404(api):
    _run()
    for call in (api.patch, api.delete):
        response = call("/api/v2/dags/d/dagRuns/nope", {}, content_type="application/json")
        assert response.status_code == 404
        assert response.json()["detail"]["message"] == (
            "The DagRun with dag_id: `d` and run_id: `nope` was not found"
        )


def test_delete_run_removes_it_with_its_history_audited_and_a_replay_is_404(api):
    run = _run(state="failed")
    TaskInstance.objects.filter(dag_run=run, task_id="busy").update(state=TIState.FAILED)
    xcoms.push(dag_id="d", run_id="r", task_id="done", key="k", value=1)
    keep = DagRunFactory(dag=run.dag, run_id="other", state="success")
    response = api.delete(RUN)
    assert response.status_code == 204, response.content
    assert not DagRun.objects.filter(pk=run.pk).exists()
    assert not TaskInstance.objects.filter(dag_run_id=run.pk).exists()
    assert not XCom.objects.filter(dag_id="d", run_id="r").exists()
    assert DagRun.objects.filter(pk=keep.pk).exists()
    entry = AuditEntry.objects.get(action="dag_run.delete")
    assert entry.detail["counts"]["task_instance"] == 4
    before = db_snapshot()
    assert api.delete(RUN).status_code == 404
    assert db_snapshot() == before


@pytest.mark.parametrize("run_state", ["running", "queued"])
def test_a_running_run_or_a_running_ti_refuses_the_deletion(api, run_state):
    _run(state=run_state)
    before = db_snapshot()
    response = api.delete(RUN)
    assert response.status_code == 409
    assert response.json()["detail"]["message"] == (
        "The DagRun with dag_id: `d` and run_id: `r` cannot be deleted in running state"
    )
    assert db_snapshot() == before
