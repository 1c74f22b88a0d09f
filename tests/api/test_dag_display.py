"""What a synced Dag says about itself (issue 39): its tags, owners and doc_md are kept and shown
as Airflow 3.3.2's public API shows them (`DAGResponse.tags` sorted `{name, dag_id,
dag_display_name}`, `owners` its tasks' owners, `doc_md` de-indented on the details), filtered on
as Airflow's `tags` / `tags_match_mode` / `owners`, and on the admin's Dag page."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from assets_app.api.public_auth import create_api_token
from assets_app.definitions import sync
from assets_app.models import Dag, DagImportError, Task

pytestmark = pytest.mark.django_db

DOC = """
    # Orders

    Loads the **orders**.
    """


@pytest.fixture
def api():
    get_user_model().objects.create_user("ops", password="pw", is_staff=True, is_superuser=True)
    _, key = create_api_token(username="ops", name="test")
    return Client(headers={"Authorization": f"Bearer {key}"})


def _sync(*dags: dict) -> sync.SyncResult:
    return sync.sync_documents(documents=[(f"{d['dag_id']}.py", d) for d in dags])


def _world() -> None:
    _sync(
        {
            "dag_id": "orders",
            "tags": ["etl", "consumption:batch", "daily", "etl"],
            "doc_md": DOC,
            "tasks": [
                {"task_id": "load", "owner": "data-eng", "doc_md": "Loads."},
                {"task_id": "check", "owner": "qa"},
                {"task_id": "more", "owner": "data-eng"},
            ],
        },
        {"dag_id": "bare", "tasks": [{"task_id": "t"}]},
        {"dag_id": "reports", "tags": ["etl"], "tasks": []},
    )


def test_tags_owners_and_doc_md_are_stored_from_the_definition():
    _world()
    orders = Dag.objects.get(dag_id="orders")
    assert orders.tags == ["consumption:batch", "daily", "etl"]
    assert orders.owners == "data-eng, qa"
    assert orders.doc_md == DOC
    assert Task.objects.get(dag_id="orders", task_id="load").owner == "data-eng"
    assert Task.objects.get(dag_id="orders", task_id="load").doc_md == "Loads."
    bare = Dag.objects.get(dag_id="bare")
    assert (bare.tags, bare.owners, bare.doc_md) == ([], "airflow", "")
    # A Dag without tasks: Airflow's `dag.owner or [operators] default_owner`.
    assert Dag.objects.get(dag_id="reports").owners == "airflow"


def test_a_second_sync_of_new_tags_updates_and_the_same_writes_nothing():
    _world()
    again = _sync({"dag_id": "reports", "tags": ["etl"], "tasks": []})
    assert again.dags_unchanged == 1
    changed = _sync({"dag_id": "reports", "tags": ["finance"], "doc_md": "x", "tasks": []})
    assert changed.dags_updated == 1
    reports = Dag.objects.get(dag_id="reports")
    assert (reports.tags, reports.doc_md) == (["finance"], "x")


def test_the_api_shows_them_in_airflows_shapes(api):
    _world()
    body = api.get("/api/v2/dags/orders").json()
    assert body["tags"] == [
        {"name": name, "dag_id": "orders", "dag_display_name": "orders"}
        for name in ("consumption:batch", "daily", "etl")
    ]
    assert body["owners"] == ["data-eng", "qa"]
    assert "doc_md" not in body  # DAGDetailsResponse only, as Airflow
    details = api.get("/api/v2/dags/orders/details").json()
    assert details["doc_md"] == "# Orders\n\nLoads the **orders**."  # inspect.cleandoc
    assert details["tags"] == body["tags"] and details["owners"] == ["data-eng", "qa"]
    bare = api.get("/api/v2/dags/bare/details").json()
    assert (bare["tags"], bare["owners"], bare["doc_md"]) == ([], ["airflow"], None)


def test_the_tags_and_owners_filters_match_as_airflows(api):
    _world()

    def listed(**params) -> list[str]:
        body = api.get("/api/v2/dags", params).json()
        return sorted(d["dag_id"] for d in body["dags"])

    assert listed(tags=["etl"]) == ["orders", "reports"]
    assert listed(tags=["daily", "etl"]) == ["orders", "reports"]  # any, the default
    assert listed(tags=["daily", "etl"], tags_match_mode="any") == ["orders", "reports"]
    assert listed(tags=["daily", "etl"], tags_match_mode="all") == ["orders"]
    assert listed(tags=["nope"]) == []
    assert listed(owners=["DATA"]) == ["orders"]  # ilike %owner%
    assert listed(owners=["qa", "airflow"]) == ["bare", "orders", "reports"]
    assert listed(owners=["%"]) == []  # the pattern's wildcard is escaped, as Airflow's
    assert api.get("/api/v2/dags", {"tags_match_mode": "some"}).status_code == 422


def test_the_admin_dag_page_shows_them():
    _world()
    get_user_model().objects.create_user("admin", password="pw", is_staff=True, is_superuser=True)
    client = Client()
    client.login(username="admin", password="pw")
    page = client.get("/admin/assets_app/dag/orders/change/").content.decode()
    assert "consumption:batch, daily, etl" in page
    assert "data-eng, qa" in page
    assert "Loads the **orders**." in page


def test_a_tag_longer_than_airflows_limit_is_refused_naming_it():
    result = _sync({"dag_id": "long", "tags": ["x" * 101], "tasks": []})
    assert result.import_errors == ("long.py",)
    assert not Dag.objects.filter(dag_id="long").exists()


def test_a_dag_without_a_time_schedule_shows_its_zone_and_dates(api):
    """Issue 39: Airflow's Dag details show `start_date`, `end_date` and `timezone` of a Dag
    with schedule=None or an asset schedule too; the admin's page shows them."""
    _sync(
        {
            "dag_id": "manual",
            "timezone": "Europe/Zurich",
            "start_date": "2024-03-01T00:00:00",
            "end_date": "2030-01-01T00:00:00+00:00",
            "tasks": [{"task_id": "t"}],
        },
        {"dag_id": "plain", "tasks": [{"task_id": "t"}]},
    )
    details = api.get("/api/v2/dags/manual/details").json()
    assert details["timezone"] == "Europe/Zurich"
    assert details["start_date"] == "2024-02-29T23:00:00Z"
    assert details["end_date"] == "2030-01-01T00:00:00Z"
    assert details["next_dagrun_run_after"] is None
    plain = api.get("/api/v2/dags/plain/details").json()
    assert (plain["timezone"], plain["start_date"], plain["end_date"]) == ("UTC", None, None)
    # Airflow's DAGResponse turns a NullTimetable's summary "None" into null.
    assert (
        plain["timetable_summary"],
        api.get("/api/v2/dags/plain").json()["timetable_summary"],
    ) == (
        None,
        None,
    )
    get_user_model().objects.create_user("admin", password="pw", is_staff=True, is_superuser=True)
    client = Client()
    client.login(username="admin", password="pw")
    page = client.get("/admin/assets_app/dag/manual/change/").content.decode()
    assert "Europe/Zurich; from 2024-" in page


def test_a_refused_attribute_on_the_json_door_names_the_ledgers_reason():
    """Issue 39: a definition key that is an attribute the ledger refuses (`executor`) is refused
    with the ledger's reason, naming the Dag, task and key, not as an unknown key; nothing of
    that file is written and the other files sync."""
    result = _sync(
        {"dag_id": "pooled", "tasks": [{"task_id": "t", "executor": "LocalExecutor"}]},
        {"dag_id": "fine", "tasks": [{"task_id": "t"}]},
    )
    assert result.import_errors == ("pooled.py",)
    trace = DagImportError.objects.get(filename="pooled.py").stack_trace
    assert trace.startswith(
        "refused by the asset service (Dag 'pooled', task 't', attribute 'executor'): "
    )
    assert (
        "attribute 'executor' is refused by the asset service: choosing an executor is not "
        "supported" in trace
    )
    assert "unknown key" not in trace
    assert list(Dag.objects.values_list("dag_id", flat=True)) == ["fine"]


# --- GET /api/v2/dags/{dag_id}/tasks (Airflow's TaskCollectionResponse / TaskResponse) -------


def _tasks_world() -> None:
    _sync(
        {
            "dag_id": "pipeline",
            "start_date": "2024-03-01T00:00:00+00:00",
            "tasks": [
                {"task_id": "extract", "owner": "data-eng", "retries": 2, "doc_md": "Pulls."},
                {
                    "task_id": "load",
                    "upstream": ["extract"],
                    "retry_delay_seconds": 90061.5,
                    "trigger_rule": "all_done",
                },
                {"task_id": "check", "upstream": ["extract"], "expand": {"x": [1, 2]}},
            ],
        }
    )


def test_the_tasks_of_a_dag_in_airflows_shapes(api):
    _tasks_world()
    body = api.get("/api/v2/dags/pipeline/tasks").json()
    assert body["total_entries"] == 3
    assert [t["task_id"] for t in body["tasks"]] == ["check", "extract", "load"]
    extract = body["tasks"][1]
    assert extract == {
        "task_id": "extract",
        "task_display_name": "extract",
        "owner": "data-eng",
        "start_date": "2024-03-01T00:00:00Z",
        "end_date": None,
        "trigger_rule": "all_success",
        "depends_on_past": False,
        "wait_for_downstream": False,
        "retries": 2.0,
        "queue": "default",
        "pool": "default_pool",
        "pool_slots": 1.0,
        "execution_timeout": None,
        "retry_delay": {"__type": "TimeDelta", "days": 0, "seconds": 300, "microseconds": 0},
        "retry_exponential_backoff": 0.0,
        "priority_weight": 1.0,
        "weight_rule": "downstream",
        "ui_color": "#fff",
        "ui_fgcolor": "#000",
        "template_fields": [],
        "downstream_task_ids": ["check", "load"],
        "doc_md": "Pulls.",
        "operator_name": None,
        "params": {},
        "class_ref": None,
        "is_mapped": False,
        "extra_links": [],
    }
    load = api.get("/api/v2/dags/pipeline/tasks/load").json()
    assert load["retry_delay"] == {
        "__type": "TimeDelta",
        "days": 1,
        "seconds": 3661,
        "microseconds": 500000,
    }
    assert (load["trigger_rule"], load["downstream_task_ids"], load["owner"]) == (
        "all_done",
        [],
        "airflow",
    )
    assert api.get("/api/v2/dags/pipeline/tasks/check").json()["is_mapped"] is True


def test_tasks_sort_as_airflows_order_by_and_refuse_what_it_refuses(api):
    _tasks_world()

    def order(order_by: str) -> list[str]:
        answer = api.get("/api/v2/dags/pipeline/tasks", {"order_by": order_by})
        assert answer.status_code == 200, answer.content
        return [t["task_id"] for t in answer.json()["tasks"]]

    assert order("-task_id") == ["load", "extract", "check"]
    assert order("-retries") == ["extract", "check", "load"]
    assert order("retry_delay") == ["check", "extract", "load"]
    assert order("pool") == ["check", "extract", "load"]  # the same for all: by task_id
    bad = api.get("/api/v2/dags/pipeline/tasks", {"order_by": "downstream_task_ids"})
    assert bad.status_code == 400
    assert "Ordering with 'downstream_task_ids' is disallowed" in bad.json()["detail"]["message"]


def test_unknown_dags_and_tasks_are_404_and_reads_are_flat(api, django_assert_num_queries):
    _tasks_world()
    assert api.get("/api/v2/dags/nope/tasks").status_code == 404
    missing = api.get("/api/v2/dags/pipeline/tasks/nope")
    assert missing.status_code == 404
    assert missing.json()["detail"]["message"] == "Task with id nope was not found"
    api.get("/api/v2/dags/pipeline/tasks")  # the token's last_used_at update
    with django_assert_num_queries(4):  # the token, the Dag, its tasks, their links
        api.get("/api/v2/dags/pipeline/tasks")
    _sync({"dag_id": "pipeline", "tasks": [{"task_id": f"t{i}"} for i in range(40)]})
    with django_assert_num_queries(4):
        assert api.get("/api/v2/dags/pipeline/tasks").json()["total_entries"] == 40


def test_tasks_need_the_dag_view_permission(api):
    _tasks_world()
    get_user_model().objects.create_user("nobody", password="pw")
    _, key = create_api_token(username="nobody", name="none")
    other = Client(headers={"Authorization": f"Bearer {key}"})
    assert other.get("/api/v2/dags/pipeline/tasks").status_code == 403
    assert other.get("/api/v2/dags/pipeline/tasks/extract").status_code == 403
    assert Client().get("/api/v2/dags/pipeline/tasks").status_code == 401


def test_owners_too_long_together_are_refused_naming_the_dag():
    """Each owner fits, but joined they would not fit Airflow's 2000 characters of a Dag's
    owners: the file is refused (an import error naming the Dag), not a database error."""
    tasks = [{"task_id": f"t{i}", "owner": f"{i}" + "o" * 300} for i in range(8)]
    result = _sync({"dag_id": "crowded", "tasks": tasks})
    assert result.import_errors == ("crowded.py",)
    trace = DagImportError.objects.get(filename="crowded.py").stack_trace
    assert "Dag 'crowded'" in trace and "longer than the 2000 characters" in trace
    assert not Dag.objects.filter(dag_id="crowded").exists()
