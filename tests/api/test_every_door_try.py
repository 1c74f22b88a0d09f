"""Invariant 12 on every door (issue 50): each worker route a task token opens refuses the token
of an earlier try of its TI with 409 `stale_try` and writes nothing, in any table.

The doors are read from the mounted execution API itself, so a new route that takes a task
token and writes must be added to `DOORS` (with a body that would write) or to `READS`, else
`test_every_task_token_route_is_a_door_or_a_read` fails. Each door is called twice on a TI whose
try 1 asked for a retry and whose try 2 runs: with try 1's token (refused, every row of every
table unchanged), then with try 2's (accepted): the body is one that goes through, so the refusal
is the try check and not a bad request.

Routes that do not take a task token accept other tries by design and are not doors here:
- `PUT /task-instances/{id}/logs/{try_number}` (worker API key): a try's log is addressed by
  its try number in the path, and a late chunk of try 1 belongs to try 1's log.
- the trigger, claim, dag-callback and dag-sync routes (worker API key or the sync token): no
  TI try is involved.
"""

from urllib.parse import urlencode

import pytest

from assets_app.api import auth, execution_api
from assets_app.api.auth import TaskTokenAuth
from assets_app.models import HITLDetail, TaskInstance, TaskStateStore, TIState
from tests.factories import AssetFactory, DagFactory, TaskInstanceFactory

from .snapshots import every_row

pytestmark = pytest.mark.django_db

END = "2026-06-30T10:05:00+00:00"
LATER = "2036-06-30T10:05:00+00:00"
OUTLETS = [{"name": "orders", "uri": "s3://b/orders", "type": "Asset"}]
MOMENT = {"__classname__": "pendulum.datetime.DateTime", "__version__": 2}
MOMENT["__data__"] = {"timestamp": 1780000000.0, "tz": "UTC"}
HITL_REQUEST = {
    "ti_id": "{ti}",
    "options": ["Approve", "Reject"],
    "subject": "Ship it?",
    "body": None,
    "defaults": None,
    "multiple": False,
    "params": {},
    "assigned_users": [],
}
XCOM = "/xcoms/{dag}/{run}/{task}/k"

# (method, route as mounted) -> (path with {ti}/{dag}/{run}/{task}/{asset} filled, body).
DOORS = {
    ("PATCH", "/task-instances/{task_instance_id}/run"): (
        "/task-instances/{ti}/run",
        {
            "state": "running",
            "hostname": "h",
            "unixname": "u",
            "pid": 2,
            "start_date": END,
        },
    ),
    ("PATCH", "/task-instances/{task_instance_id}/state#success"): (
        "/task-instances/{ti}/state",
        {"state": "success", "end_date": END, "task_outlets": OUTLETS, "outlet_events": []},
    ),
    ("PATCH", "/task-instances/{task_instance_id}/state#failed"): (
        "/task-instances/{ti}/state",
        {"state": "failed", "end_date": END},
    ),
    ("PATCH", "/task-instances/{task_instance_id}/state#skipped"): (
        "/task-instances/{ti}/state",
        {"state": "skipped", "end_date": END},
    ),
    ("PATCH", "/task-instances/{task_instance_id}/state#up_for_retry"): (
        "/task-instances/{ti}/state",
        {"state": "up_for_retry", "end_date": END, "retry_delay_seconds": 60},
    ),
    ("PATCH", "/task-instances/{task_instance_id}/state#up_for_reschedule"): (
        "/task-instances/{ti}/state",
        {"state": "up_for_reschedule", "reschedule_date": LATER, "end_date": END},
    ),
    ("PATCH", "/task-instances/{task_instance_id}/state#deferred"): (
        "/task-instances/{ti}/state",
        {
            "state": "deferred",
            "classpath": "airflow.providers.standard.triggers.temporal.DateTimeTrigger",
            "trigger_kwargs": {"moment": MOMENT, "end_from_trigger": False},
            "trigger_timeout": "PT1H",
            "next_method": "execute_complete",
            "next_kwargs": {},
        },
    ),
    ("PATCH", "/task-instances/{task_instance_id}/state#awaiting_input"): (
        "/task-instances/{ti}/state",
        {"state": "awaiting_input", "timeout": "PT1H", "next_method": "m", "next_kwargs": {}},
    ),
    ("PUT", "/task-instances/{task_instance_id}/heartbeat"): (
        "/task-instances/{ti}/heartbeat",
        {"hostname": "h", "pid": 2},
    ),
    ("PATCH", "/task-instances/{task_instance_id}/skip-downstream"): (
        "/task-instances/{ti}/skip-downstream",
        {"tasks": ["downstream"]},
    ),
    ("PUT", "/task-instances/{task_instance_id}/rtif"): (
        "/task-instances/{ti}/rtif",
        {"bash_command": "echo 1"},
    ),
    ("POST", "/xcoms/{dag_id}/{run_id}/{task_id}/{path:key}"): (XCOM, {"x": 1}),
    ("DELETE", "/xcoms/{dag_id}/{run_id}/{task_id}/{path:key}"): (XCOM, None),
    ("PUT", "/variables/{path:variable_key}"): ("/variables/v", {"val": "x"}),
    ("DELETE", "/variables/{path:variable_key}"): ("/variables/v", None),
    ("POST", "/dag-runs/{dag_id}/{run_id}"): ("/dag-runs/target/manual__door", {"conf": {}}),
    ("POST", "/dag-runs/{dag_id}/{run_id}/clear"): ("/dag-runs/{dag}/{run}/clear", None),
    ("PUT", "/store/ti/{task_instance_id}/{path:key}"): ("/store/ti/{ti}/k", {"value": 2}),
    ("DELETE", "/store/ti/{task_instance_id}/{path:key}"): ("/store/ti/{ti}/k", None),
    ("DELETE", "/store/ti/{task_instance_id}"): ("/store/ti/{ti}", None),
    ("PUT", "/store/asset/by-name/value"): ("/store/asset/by-name/value?{by_name}", {"value": 1}),
    ("DELETE", "/store/asset/by-name/value"): ("/store/asset/by-name/value?{by_name}", None),
    ("DELETE", "/store/asset/by-name/clear"): ("/store/asset/by-name/clear?{name}", None),
    ("PUT", "/store/asset/by-uri/value"): ("/store/asset/by-uri/value?{by_uri}", {"value": 1}),
    ("DELETE", "/store/asset/by-uri/value"): ("/store/asset/by-uri/value?{by_uri}", None),
    ("DELETE", "/store/asset/by-uri/clear"): ("/store/asset/by-uri/clear?{uri}", None),
    ("POST", "/hitlDetails/{task_instance_id}"): ("/hitlDetails/{ti}", HITL_REQUEST),
    ("PATCH", "/hitlDetails/{task_instance_id}"): (
        "/hitlDetails/{ti}",
        {"ti_id": "{ti}", "chosen_options": ["Approve"], "params_input": {}},
    ),
}

# Task-token routes that only read: they write nothing whatever the token's try, so a stale
# token there changes nothing by construction (the ones on a TI's path answer about the TI,
# which is the same row for every try).
READS = {"GET", "HEAD"}


def task_token_routes() -> set[tuple[str, str]]:
    """(METHOD, path) of every route of the execution API that takes a task token."""
    found = set()
    for _, router in execution_api._routers:
        for path, view in router.path_operations.items():
            for operation in view.operations:
                callbacks = operation.auth_callbacks or [router.auth]
                if any(isinstance(c, TaskTokenAuth) for c in callbacks):
                    found.update((method, path) for method in operation.methods)
    return found


def test_every_task_token_route_is_a_door_or_a_read():
    routes = task_token_routes()
    doors = {(method, route.split("#")[0]) for method, route in DOORS}
    assert {r for r in routes if r[0] not in READS} == doors
    # The listing sees the routes it must (a router-level auth, a route-level one).
    assert ("PATCH", "/task-instances/{task_instance_id}/state") in routes
    assert ("PUT", "/task-instances/{task_instance_id}/rtif") in routes


@pytest.fixture
def second_try(worker_api):
    """A TI whose try 1 asked for a retry and whose try 2 runs, with what the doors act on:
    a request for a person, a state-store key, an XCom, a Variable, an asset's state and a
    Dag to trigger. Returns (ti, try 1's token, try 2's token, placeholders)."""
    ti = TaskInstanceFactory(running=True, max_tries=2, task_id="produce")
    first = auth.issue_token(ti.id, try_number=1)
    retried = worker_api.request(
        "PATCH",
        f"/task-instances/{ti.id}/state",
        {"state": "up_for_retry", "end_date": END, "retry_delay_seconds": 0},
        token=first,
    )
    assert retried.status_code == 204, retried.content
    TaskInstanceFactory(dag_run=ti.dag_run, task_id="downstream")
    DagFactory(dag_id="target")
    asset = AssetFactory(name="orders", uri="s3://b/orders")
    second = auth.issue_token(ti.id, try_number=2)
    started = worker_api.request(
        "PATCH",
        f"/task-instances/{ti.id}/run",
        {"state": "running", "hostname": "h", "unixname": "u", "pid": 2, "start_date": END},
        token=second,
    )
    assert started.status_code == 200, started.content
    for method, path, body in (
        ("POST", f"/hitlDetails/{ti.id}", {**HITL_REQUEST, "ti_id": str(ti.id)}),
        ("PUT", f"/store/ti/{ti.id}/k", {"value": 1}),
        ("POST", f"/xcoms/{ti.dag_id}/{ti.run_id}/produce/k", 1),
        ("PUT", "/variables/v", {"val": "v"}),
        ("PUT", "/store/asset/by-name/value?name=orders&key=k", {"value": 0}),
    ):
        done = worker_api.request(method, path, body, token=second)
        assert done.status_code < 300, (path, done.content)
    assert HITLDetail.objects.exists() and TaskStateStore.objects.exists()
    names = {
        "ti": ti.id,
        "dag": ti.dag_id,
        "run": ti.run_id,
        "task": "produce",
        "by_name": urlencode({"name": asset.name, "key": "k"}),
        "by_uri": urlencode({"uri": asset.uri, "key": "k"}),
        "name": urlencode({"name": asset.name}),
        "uri": urlencode({"uri": asset.uri}),
    }
    return ti, first, second, names


@pytest.mark.parametrize("door", list(DOORS), ids=lambda d: f"{d[0]} {d[1]}")
def test_a_token_of_an_earlier_try_is_refused_at_every_door_and_writes_nothing(
    worker_api, second_try, door
):
    ti, first, second, names = second_try
    template, body = DOORS[door]
    path = template.format(**names)
    if isinstance(body, dict) and body.get("ti_id") == "{ti}":
        body = {**body, "ti_id": str(ti.id)}
    before = every_row()

    refused = worker_api.request(door[0], path, body, token=first)

    assert refused.status_code == 409, refused.content
    detail = refused.json()["detail"]
    assert detail["reason"] == "stale_try", detail
    assert (detail["token_try_number"], detail["current_try_number"]) == (1, 2)
    assert every_row() == before
    assert TaskInstance.objects.get(id=ti.id).state == TIState.RUNNING
    # The same call with the current try's token goes through: the body is one that acts.
    accepted = worker_api.request(door[0], path, body, token=second)
    assert accepted.status_code < 300, accepted.content
