"""Public API v2 beyond events: list endpoints' query counts (flat in the number of rows), cursor
pages, order_by validation, clear semantics, TI state mapping, JSON 404/405, and that every
route declares its model permission."""

import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from assets_app.api import public_api
from assets_app.api.public_auth import create_api_token
from assets_app.api.public_permissions import permission_of
from assets_app.catalog import run_reads
from assets_app.models import Asset, DagRun, Task, TaskInstance, TIState
from assets_app.registration import outlets as registration
from assets_app.scheduling import runs
from tests.asset_flow import scheduled_dag
from tests.factories import (
    AssetFactory,
    DagFactory,
    DagRunFactory,
    TaskFactory,
    TaskInstanceFactory,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def api():
    get_user_model().objects.create_user("ops", password="pw", is_staff=True, is_superuser=True)
    _, key = create_api_token(username="ops", name="test")
    return Client(headers={"Authorization": f"Bearer {key}"})


def _world(n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        dag = scheduled_dag(f"d{i}", f"a{i}")
        Task.objects.get_or_create(dag=dag, task_id="t")
        runs.trigger_dag(dag_id=dag.dag_id)
        registration.register_external_event(asset=Asset.objects.get(name=f"a{i}"), extra={})


@pytest.mark.parametrize(
    ("url", "queries"),
    [
        ("/api/v2/assets", 6),
        ("/api/v2/dags", 3),
        # + the page's Dag versions (one query, `dags.versions_of_runs`)
        ("/api/v2/dags/~/dagRuns", 4),
        ("/api/v2/dags/~/dagRuns?cursor=", 4),
        ("/api/v2/dags/~/dagRuns/~/taskInstances", 3),
        ("/api/v2/assets/events", 4),
    ],
)
def test_list_endpoints_make_the_same_queries_for_1_and_12_rows(
    api, django_assert_num_queries, url, queries
):
    """Auth (token lookup) plus count, page and a fixed number of prefetches."""
    _world(1)
    api.get(url)  # the token's last_used_at update happens once a minute
    with django_assert_num_queries(queries):
        assert api.get(url).status_code == 200
    _world(12, start=1)
    for i in range(12):
        AssetFactory(name=f"extra{i}")
    with django_assert_num_queries(queries):
        body = api.get(url).json()
    assert body["total_entries"] >= 13


def test_cursor_pages_walk_forward_and_back_without_overlap(api):
    _world(5)
    seen, cursor = [], ""
    while cursor is not None:
        page = api.get("/api/v2/dags/~/dagRuns", {"cursor": cursor, "limit": 2, "order_by": "-id"})
        body = page.json()
        seen += [r["dag_id"] for r in body["dag_runs"]]
        cursor = body["next_cursor"]
        last = body
    assert seen == [f"d{i}" for i in reversed(range(5))]
    assert last["total_entries"] == 5 and last["total_entries_limit"] == 50_000
    back = api.get(
        "/api/v2/dags/~/dagRuns", {"cursor": last["previous_cursor"], "limit": 2, "order_by": "-id"}
    ).json()
    assert [r["dag_id"] for r in back["dag_runs"]] == ["d2", "d1"]
    bad = api.get("/api/v2/dags/~/dagRuns", {"cursor": "!!not-a-cursor"})
    assert (bad.status_code, bad.json()["detail"]["reason"]) == (400, "invalid_cursor")


def test_order_by_lists_are_validated_and_honoured(api):
    _world(3)
    names = api.get("/api/v2/assets", {"order_by": ["-name"], "only_active": "false"}).json()
    assert [a["name"] for a in names["assets"]] == ["a2", "a1", "a0"]
    bad = api.get("/api/v2/dags", {"order_by": ["dag_id", "-nope"]})
    assert bad.status_code == 400
    assert bad.json()["detail"] | {"message": ""} == {
        "reason": "invalid_order_by",
        "message": "",
        "field": "nope",
    }
    too_many = api.get("/api/v2/dags", {"order_by": ["dag_id"] * 11})
    assert too_many.status_code == 400
    for name in ("dag_id", "dag_display_name", "next_dagrun", "last_run_state"):
        page = api.get("/api/v2/dags", {"order_by": [name, "-last_run_start_date"]})
        assert page.status_code == 200, (name, page.content)
        assert sorted(d["dag_id"] for d in page.json()["dags"]) == ["d0", "d1", "d2"]
    runs_by = api.get("/api/v2/dags/~/dagRuns", {"order_by": ["-duration", "conf", "updated_at"]})
    assert runs_by.status_code == 200 and runs_by.json()["total_entries"] == 3
    tis_by = api.get(
        "/api/v2/dags/~/dagRuns/~/taskInstances", {"order_by": ["operator", "-run_after"]}
    )
    assert tis_by.status_code == 200 and tis_by.json()["total_entries"] == 3


def test_patterns_prefixes_and_pipes(api):
    _world(3)
    AssetFactory(name="orders_eu", uri="s3://orders/eu")
    AssetFactory(name="ordersXeu", uri="s3://orders/x")

    def names(**params):
        body = api.get("/api/v2/assets", {"only_active": "false", **params}).json()
        return sorted(a["name"] for a in body["assets"])

    assert names(name_pattern="ORDERS_EU") == ["ordersXeu", "orders_eu"]  # _ is a wildcard
    assert names(name_prefix_pattern="orders_") == ["orders_eu"]  # literal in a prefix
    assert names(name_pattern="a1|a2") == ["a1", "a2"]
    assert len(names(name_pattern="~")) == 5
    assert names(name_prefix_pattern="~") == names()


def test_clear_requeues_a_finished_run_with_new_tries(api):
    _world(1)
    run = DagRun.objects.get(dag_id="d0")
    Task.objects.filter(dag_id="d0").update(retries=2)
    TaskInstance.objects.filter(dag_run=run).update(state=TIState.FAILED, end_date=timezone.now())
    DagRun.objects.filter(pk=run.pk).update(state="failed", end_date=timezone.now())
    url = f"/api/v2/dags/d0/dagRuns/{run.run_id}/clear"
    dry = api.post(url, {}, content_type="application/json").json()
    assert dry["total_entries"] == 1 and dry["task_instances"][0]["state"] == "failed"
    assert TaskInstance.objects.get(dag_run=run).state == TIState.FAILED  # a dry run writes nothing
    done = api.post(url, {"dry_run": False, "note": "again"}, content_type="application/json")
    assert done.status_code == 200, done.content
    body = done.json()
    assert (body["state"], body["end_date"], body["note"]) == ("queued", None, "again")
    ti = TaskInstance.objects.get(dag_run=run)
    assert (ti.state, ti.try_number, ti.max_tries) == (TIState.QUEUED, 2, 3)
    assert DagRun.objects.get(pk=run.pk).clear_number == 1
    only_failed = api.post(
        url, {"dry_run": True, "only_failed": True}, content_type="application/json"
    ).json()
    assert only_failed["total_entries"] == 0


def test_every_ti_state_maps_to_an_airflow_state_or_no_status():
    for state in TIState.values:
        assert state in run_reads.TI_STATE_TO_AIRFLOW, state
        mapped = run_reads.TI_STATE_TO_AIRFLOW[state]
        assert mapped is None or mapped in run_reads.AIRFLOW_TI_STATES


def test_unknown_routes_and_methods_answer_json(api):
    missing = api.get("/api/v2/no-such-route")
    assert missing.status_code == 404 and missing.json()["detail"]["reason"] == "not_found"
    wrong = api.delete("/api/v2/dags")
    assert wrong.status_code == 405
    assert wrong.json()["detail"]["reason"] == "method_not_allowed"
    assert "PATCH" in wrong["Allow"]


def test_every_authenticated_route_declares_its_model_permission():
    undeclared = []
    for prefix, path_view in public_api._routers[0][1].path_operations.items():
        for operation in path_view.operations:
            if operation.auth_callbacks and permission_of(operation.view_func) is None:
                undeclared.append(f"{operation.methods} {prefix}")
    assert not undeclared
    declared = {
        permission_of(op.view_func).codename
        for _, router in public_api._routers
        for view in router.path_operations.values()
        for op in view.operations
        if permission_of(op.view_func)
    }
    assert {"assets_app.view_dag", "assets_app.change_dag", "assets_app.add_dagrun"} <= declared


@pytest.mark.parametrize("value", ["1e300", "inf", "nan", "-1e11"])
def test_a_duration_filter_no_run_could_have_is_a_422_naming_it(api, value):
    """The public fuzz run found `duration_gt=1e300` overflowing timedelta: a 500."""
    _world(1)
    for path, params in (
        ("/api/v2/dags/~/dagRuns", {"duration_gt": value}),
        ("/api/v2/dags/~/dagRuns/~/taskInstances", {"duration_gt": value}),
    ):
        response = api.get(path, params)
        assert response.status_code == 422, (path, value, response.content)
        assert "duration_gt" in response.content.decode()
    body = api.post(
        "/api/v2/dags/~/dagRuns/list",
        data=json.dumps({"duration_lt": 1e300}),
        content_type="application/json",
    )
    assert body.status_code == 422, body.content
    assert api.get("/api/v2/dags/~/dagRuns", {"duration_gt": "3600"}).status_code == 200


def test_a_mapped_task_asked_for_without_its_map_index_is_airflows_404(api):
    """Airflow 3.3.2 answers GET .../taskInstances/{task_id} of a mapped task with its own 404
    message; the map index's path finds each one."""
    run = DagRunFactory(dag=DagFactory(dag_id="fan"), run_id="r1")
    for i in range(3):
        TaskInstanceFactory(dag_run=run, task_id="each", map_index=i)
    base = "/api/v2/dags/fan/dagRuns/r1/taskInstances"
    answer = api.get(f"{base}/each")
    assert answer.status_code == 404
    assert answer.json()["detail"]["message"] == (
        "Task instance is mapped, add the map_index value to the URL"
    )
    assert api.get(f"{base}/each/2").json()["map_index"] == 2
    missing = api.get(f"{base}/nothing")
    assert missing.status_code == 404
    assert (
        "task_id: `nothing` and map_index: `-1` was not found"
        in missing.json()["detail"]["message"]
    )


def test_list_mapped_pages_a_mapped_tasks_map_indexes_as_airflow(api):
    """Airflow 3.3.2's GET .../taskInstances/{task_id}/listMapped: a mapped task's map indexes
    (ordered by map_index, filtered and paged like the run's list), an empty page for a mapped
    task not expanded yet, 404 for a task that is not mapped or does not exist."""
    dag = DagFactory(dag_id="fan")
    TaskFactory(dag=dag, task_id="each", map_upstream="make")
    TaskFactory(dag=dag, task_id="later", map_upstream="make")
    TaskFactory(dag=dag, task_id="plain")
    run = DagRunFactory(dag=dag, run_id="r1")
    for i in (2, 0, 1, 3):
        TaskInstanceFactory(
            dag_run=run, task_id="each", map_index=i, state="success" if i < 3 else "failed"
        )
    TaskInstanceFactory(dag_run=run, task_id="later")  # map index -1: not expanded yet
    TaskInstanceFactory(dag_run=run, task_id="plain")
    base = "/api/v2/dags/fan/dagRuns/r1/taskInstances"

    page = api.get(f"{base}/each/listMapped").json()
    assert [ti["map_index"] for ti in page["task_instances"]] == [0, 1, 2, 3]
    assert page["total_entries"] == 4
    failed = api.get(f"{base}/each/listMapped", {"state": "failed"}).json()
    assert [ti["map_index"] for ti in failed["task_instances"]] == [3]
    second = api.get(f"{base}/each/listMapped", {"limit": 2, "offset": 2}).json()
    assert [ti["map_index"] for ti in second["task_instances"]] == [2, 3]
    newest = api.get(f"{base}/each/listMapped", {"order_by": "-map_index", "limit": 1}).json()
    assert [ti["map_index"] for ti in newest["task_instances"]] == [3]

    assert api.get(f"{base}/later/listMapped").json()["total_entries"] == 0
    plain = api.get(f"{base}/plain/listMapped")
    assert plain.status_code == 404
    assert plain.json()["detail"]["message"] == "Task id plain is not mapped"
    assert api.get(f"{base}/nothing/listMapped").json()["detail"]["message"] == (
        "Task id nothing not found"
    )
    assert api.get("/api/v2/dags/fan/dagRuns/nope/taskInstances/each/listMapped").status_code == 404
