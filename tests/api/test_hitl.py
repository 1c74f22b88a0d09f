"""Human-in-the-loop (issue 42), as Airflow 3.3.2 serves it: the worker's `/execution/hitlDetails`
routes, the `awaiting_input` state, the public `hitlDetails` routes (list, get, respond) with
their permissions, the audited response, a second response refused, the TI queued again with
the response as its event, and the timeout sweep. Shapes are checked against Airflow's own
models in tests/compat/test_hitl_shapes.py."""

import json
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone

from assets_app.api.public_auth import create_api_token
from assets_app.models import AuditEntry, HITLDetail, TIState
from assets_app.task_state import hitl
from tests.api.snapshots import db_snapshot
from tests.factories import TaskInstanceFactory

pytestmark = pytest.mark.django_db

REQUEST = {
    "ti_id": None,
    "options": ["Approve", "Reject"],
    "subject": "Ship it?",
    "body": "release 1.2",
    "defaults": None,
    "multiple": False,
    "params": {},
    "assigned_users": [],
    # The SDK sends its comms message as it is: Airflow's model ignores `type`.
    "type": "CreateHITLDetailPayload",
}
PARK = {
    "state": "awaiting_input",
    "timeout": "PT1H",
    "next_method": "execute_complete",
    "next_kwargs": {},
}


def _user(username: str, *codenames: str) -> Client:
    user = get_user_model().objects.create_user(username, password="pw", is_staff=True)
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    _, key = create_api_token(username=username, name="t")
    return Client(headers={"Authorization": f"Bearer {key}"})


def _ti_path(ti) -> str:
    return f"/api/v2/dags/{ti.dag_id}/dagRuns/{ti.run_id}/taskInstances/{ti.task_id}/-1/hitlDetails"


def _answer(api, ti, options, **extra):
    body = {"chosen_options": options, **extra}
    return api.patch(_ti_path(ti), data=json.dumps(body), content_type="application/json")


def _parked(worker_api, *, request=None, park=None):
    ti = TaskInstanceFactory(running=True, task_id="approve")
    body = {**REQUEST, **(request or {}), "ti_id": str(ti.id)}
    created = worker_api.request("POST", f"/hitlDetails/{ti.id}", body, ti_id=ti.id)
    assert created.status_code == 201, created.content
    parked = worker_api.request(
        "PATCH", f"/task-instances/{ti.id}/state", {**PARK, **(park or {})}, ti_id=ti.id
    )
    assert parked.status_code == 204, parked.content
    ti.refresh_from_db()
    return ti


def test_the_worker_writes_its_request_and_the_ti_awaits_input(worker_api):
    before = timezone.now()
    ti = _parked(worker_api)

    assert ti.state == TIState.AWAITING_INPUT
    assert ti.next_method == "execute_complete"
    assert ti.trigger_id is None
    assert before + timedelta(hours=1) <= ti.trigger_timeout
    detail = HITLDetail.objects.get(ti=ti)
    assert (detail.options, detail.subject, detail.response_received) == (
        ["Approve", "Reject"],
        "Ship it?",
        False,
    )
    got = worker_api.request("GET", f"/hitlDetails/{ti.id}", ti_id=ti.id)
    assert got.json() == {
        "response_received": False,
        "responded_by_user": None,
        "responded_at": None,
        "chosen_options": [],
        "params_input": {},
    }
    # A replayed park writes nothing.
    snapshot = db_snapshot()
    again = worker_api.request("PATCH", f"/task-instances/{ti.id}/state", PARK, ti_id=ti.id)
    assert again.status_code == 200
    assert db_snapshot() == snapshot


def test_a_token_of_another_ti_cannot_touch_a_request(worker_api):
    ti = TaskInstanceFactory(running=True)
    other = TaskInstanceFactory(running=True)
    body = {**REQUEST, "ti_id": str(ti.id)}
    refused = worker_api.request("POST", f"/hitlDetails/{ti.id}", body, ti_id=other.id)
    assert refused.status_code == 403
    missing = worker_api.request("GET", f"/hitlDetails/{ti.id}", ti_id=ti.id)
    assert missing.status_code == 404
    assert not HITLDetail.objects.exists()


def test_a_response_resumes_the_ti_with_it_and_is_audited(worker_api):
    ti = _parked(worker_api)
    api = _user("alice", "view_hitldetail", "change_hitldetail")

    response = _answer(api, ti, ["Approve"])

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["chosen_options"] == ["Approve"]
    assert body["responded_by"]["name"] == "alice"
    ti.refresh_from_db()
    assert ti.state == TIState.QUEUED
    assert ti.try_number == 1
    assert ti.next_method == "execute_complete"
    event = ti.next_kwargs["event"]
    assert event["chosen_options"] == ["Approve"]
    assert event["responded_by_user"]["name"] == "alice"
    assert event["timedout"] is False
    assert event["responded_at"]["__classname__"] == "datetime.datetime"
    entry = AuditEntry.objects.get(action="hitl_respond")
    assert entry.actor_name == "alice"
    assert entry.detail["chosen_options"] == ["Approve"]
    # The worker's read sees it.
    got = worker_api.request("GET", f"/hitlDetails/{ti.id}", ti_id=ti.id).json()
    assert got["response_received"] is True
    assert got["chosen_options"] == ["Approve"]


def test_a_second_response_is_refused_and_changes_nothing(worker_api):
    ti = _parked(worker_api)
    api = _user("alice", "change_hitldetail")
    assert _answer(api, ti, ["Approve"]).status_code == 200
    before = db_snapshot()

    again = _answer(api, ti, ["Reject"])

    assert again.status_code == 409
    assert "already been updated" in json.dumps(again.json())
    assert db_snapshot() == before


def test_only_a_user_allowed_to_respond_may_answer(worker_api):
    ti = _parked(worker_api, request={"assigned_users": [{"id": "424242", "name": "bob"}]})
    viewer = _user("viewer", "view_hitldetail")
    responder = _user("carol", "change_hitldetail")
    before = db_snapshot()

    assert viewer.get(_ti_path(ti)).status_code == 200
    assert _answer(viewer, ti, ["Approve"]).status_code == 403
    # Allowed to respond, but not one of the assigned users (Airflow's 403).
    not_assigned = _answer(responder, ti, ["Approve"])
    assert not_assigned.status_code == 403
    assert "is not a respondent" in json.dumps(not_assigned.json())
    assert Client().get(_ti_path(ti)).status_code == 401
    assert db_snapshot() == before


def test_options_not_offered_or_several_for_one_choice_are_400(worker_api):
    ti = _parked(worker_api)
    api = _user("alice", "change_hitldetail")
    before = db_snapshot()

    assert _answer(api, ti, ["Maybe"]).status_code == 400
    assert _answer(api, ti, ["Approve", "Reject"]).status_code == 400
    assert _answer(api, ti, []).status_code == 422
    assert db_snapshot() == before


def test_list_and_get_with_airflow_filters(worker_api):
    waiting = _parked(worker_api)
    answered = _parked(worker_api)
    api = _user("alice", "view_hitldetail", "change_hitldetail")
    assert _answer(api, answered, ["Reject"]).status_code == 200

    every = api.get("/api/v2/dags/~/dagRuns/~/hitlDetails").json()
    assert every["total_entries"] == 2
    pending = api.get("/api/v2/dags/~/dagRuns/~/hitlDetails", {"response_received": "false"})
    assert [d["task_instance"]["id"] for d in pending.json()["hitl_details"]] == [str(waiting.id)]
    one = api.get(_ti_path(answered)).json()
    assert one["chosen_options"] == ["Reject"]
    assert one["response_received"] is True
    assert one["task_instance"]["state"] == "queued"
    assert api.get(_ti_path(waiting)).json()["task_instance"]["state"] == "awaiting_input"
    bad = api.get("/api/v2/dags/~/dagRuns/~/hitlDetails", {"order_by": "nope"})
    assert bad.status_code == 400


def test_a_response_before_the_park_resumes_at_once(worker_api):
    ti = TaskInstanceFactory(running=True, task_id="approve")
    body = {**REQUEST, "ti_id": str(ti.id)}
    assert worker_api.request("POST", f"/hitlDetails/{ti.id}", body, ti_id=ti.id).status_code == 201
    api = _user("alice", "change_hitldetail")
    assert _answer(api, ti, ["Approve"]).status_code == 200
    ti.refresh_from_db()
    assert ti.state == TIState.RUNNING  # answered while it ran: nothing to resume yet

    parked = worker_api.request("PATCH", f"/task-instances/{ti.id}/state", PARK, ti_id=ti.id)

    assert parked.status_code == 204
    ti.refresh_from_db()
    assert ti.state == TIState.QUEUED
    assert ti.next_kwargs["event"]["chosen_options"] == ["Approve"]


def test_timeout_applies_the_defaults_or_resumes_to_fail(worker_api):
    with_defaults = _parked(
        worker_api,
        request={"defaults": ["Reject"], "params": {"n": {"value": 3, "schema": {}}}},
        park={"timeout": "PT0S"},
    )
    without = _parked(worker_api, park={"timeout": "PT0S"})
    forever = _parked(worker_api, park={"timeout": None})

    resumed = hitl.time_out_awaiting_input(now=timezone.now() + timedelta(seconds=1))

    assert resumed == 2
    with_defaults.refresh_from_db()
    assert with_defaults.state == TIState.QUEUED
    event = with_defaults.next_kwargs["event"]
    assert (event["chosen_options"], event["params_input"], event["timedout"]) == (
        ["Reject"],
        {"n": 3},
        True,
    )
    assert event["responded_by_user"] is None
    assert HITLDetail.objects.get(ti=with_defaults).response_received
    without.refresh_from_db()
    assert without.state == TIState.QUEUED
    assert without.next_kwargs["event"]["error_type"] == "timeout"
    forever.refresh_from_db()
    assert forever.state == TIState.AWAITING_INPUT
    # A response after the sweep answered with the defaults is refused, as Airflow refuses it.
    api = _user("alice", "change_hitldetail")
    assert _answer(api, with_defaults, ["Approve"]).status_code == 409


def test_list_prefix_and_created_at_filters(worker_api):
    ti = _parked(worker_api)
    api = _user("alice", "view_hitldetail")
    url = "/api/v2/dags/~/dagRuns/~/hitlDetails"

    def count(**params):
        response = api.get(url, params)
        assert response.status_code == 200, response.content
        return response.json()["total_entries"]

    assert count(task_id_prefix_pattern="appr") == 1
    assert count(task_id_prefix_pattern="nope") == 0
    assert count(dag_id_prefix_pattern=ti.dag_id[:3]) == 1
    later = (timezone.now() + timedelta(minutes=1)).isoformat()
    assert count(created_at_lt=later) == 1
    assert count(created_at_gte=later) == 0
    assert api.get(url, {"map_index": -2}).status_code == 422
