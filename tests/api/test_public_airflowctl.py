"""Issue 49, first step: the public API routes airflowctl calls that answered 404, 405 or a
misleading 422, and the values it showed wrong.

- Route order: `.../taskInstances/{task_id}/xcomEntries` is the XCom list (not a map index),
  `/connections/test` and `/connections/defaults` are those routes (not connection ids).
- XCom entries: list with Airflow's filters and `~`, one entry as stored or `deserialize`d.
- Airflow's answers when it has none of a feature: `/config` 403 (`expose_config` off),
  `/connections/test` 403 (`test_connection` off), empty `/jobs`, `/plugins`, `/providers`,
  `/dagWarnings`; `/dagVersions` one per synced definition change.
- Values: `is_backfillable`, `timetable_summary` null, Variables `is_encrypted`, a backfill's
  `dag_run_conf` null when none was given.

Each answer's shape is validated against Airflow's own document in
`tests/compat/test_public_answers_schema.py`, which reuses `answers()` below.
"""

from datetime import UTC, datetime

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from assets_app.api.public_auth import create_api_token
from assets_app.definitions import sync as definitions
from assets_app.models import AuditEntry, Backfill, Connection, Dag, DagRun, Variable, XCom
from assets_app.runtime import xcoms
from tests.factories import DagRunFactory

pytestmark = pytest.mark.django_db

RUN = "/api/v2/dags/daily/dagRuns/r1/taskInstances"


@pytest.fixture
def api() -> Client:
    get_user_model().objects.create_user("ops", password="pw", is_staff=True, is_superuser=True)
    _, key = create_api_token(username="ops", name="test")
    return Client(headers={"Authorization": f"Bearer {key}"})


def world() -> None:
    """Four Dags (tags, a daily timetable, one not allowing backfills, one manual-only), two
    runs of `daily` and XComs on them."""
    start = {"start_date": "2026-01-01", "is_paused": True}
    documents = [
        {
            "dag_id": "daily",
            "timetable": "@daily",
            "tags": ["etl", "Team-A"],
            "tasks": [{"task_id": t} for t in ("extract", "load", "mapped")],
            **start,
        },
        {
            "dag_id": "no_backfill",
            "timetable": "@daily",
            "allowed_run_types": ["manual", "scheduled"],
            **start,
        },
        {"dag_id": "once", "timetable": "@once", "tags": ["etl"], **start},
        {"dag_id": "manual", "tags": ["team-b"], "is_paused": True},
    ]
    definitions.sync_definitions(
        dags=[
            d
            for doc in documents
            for d in definitions.parse_document(doc, file=f"{doc['dag_id']}.json")
        ]
    )
    when = datetime(2026, 3, 1, tzinfo=UTC)
    daily, manual = Dag.objects.get(dag_id="daily"), Dag.objects.get(dag_id="manual")
    DagRunFactory(dag=daily, run_id="r1", run_after=when, logical_date=when, state="success")
    DagRunFactory(dag=daily, run_id="r2", run_after=when, state="failed")
    DagRunFactory(dag=manual, run_id="m1", run_after=when, state="running")
    for run_id, task_id, key, value, map_index in (
        ("r1", "extract", "return_value", {"rows": 3}, -1),
        ("r1", "extract", "note", "plain text", -1),
        ("r1", "load", "return_value", 7, -1),
        ("r1", "mapped", "return_value", 1, 0),
        ("r1", "mapped", "return_value", 2, 1),
        ("r2", "extract", "return_value", {"rows": 5}, -1),
        (
            "r1",
            "extract",
            "custom",
            {"__classname__": "mymod.Point", "__version__": 1, "__data__": {"x": 1, "y": "b"}},
            -1,
        ),
    ):
        xcoms.push(
            dag_id="daily",
            run_id=run_id,
            task_id=task_id,
            key=key,
            value=value,
            map_index=map_index,
        )


# --- route order --------------------------------------------------------------------------------


def test_xcom_entries_is_a_route_not_a_map_index(api):
    world()
    response = api.get(f"{RUN}/extract/xcomEntries")
    assert response.status_code == 200, response.content
    assert [e["key"] for e in response.json()["xcom_entries"]] == ["custom", "note", "return_value"]
    # A map index still reaches the mapped task instance route (404: no such TI here).
    assert api.get(f"{RUN}/extract/3").json()["detail"]["reason"] == "task_instance_not_found"


def test_connections_test_and_defaults_are_routes_not_connection_ids(api):
    body = {"connection_id": "c", "conn_type": "http", "host": "example.org"}
    tested = api.post("/api/v2/connections/test", body, content_type="application/json")
    assert tested.status_code == 403, tested.content
    assert tested.json()["detail"]["reason"] == "connection_test_disabled"
    assert tested.json()["detail"]["message"].startswith("Testing connections is disabled")
    defaults = api.post("/api/v2/connections/defaults")
    assert defaults.status_code == 403, defaults.content
    assert defaults.json()["detail"]["reason"] == "default_connections_not_offered"
    assert not Connection.objects.exists()
    # A connection named like neither still reads as one.
    missing = api.get("/api/v2/connections/tested").json()["detail"]["message"]
    assert missing == "Connection with ID tested not found"


def test_connection_test_validates_its_body_first_as_airflow(api):
    response = api.post("/api/v2/connections/test", {}, content_type="application/json")
    assert response.status_code == 422


# --- XCom entries -------------------------------------------------------------------------------


def test_xcom_list_filters_and_tilde(api):
    world()
    every = api.get("/api/v2/dags/~/dagRuns/~/taskInstances/~/xcomEntries").json()
    assert every["total_entries"] == 7
    first = every["xcom_entries"][0]
    assert first["dag_id"] == first["dag_display_name"] == "daily"
    assert first["task_id"] == first["task_display_name"]
    assert "value" not in first
    # Airflow's default order: dag_id, task_id, run_id, map_index, key.
    assert [(e["task_id"], e["run_id"], e["map_index"], e["key"]) for e in every["xcom_entries"]][
        :4
    ] == [
        ("extract", "r1", -1, "custom"),
        ("extract", "r1", -1, "note"),
        ("extract", "r1", -1, "return_value"),
        ("extract", "r2", -1, "return_value"),
    ]
    r1 = next(e for e in every["xcom_entries"] if e["run_id"] == "r1")
    assert (r1["logical_date"], r1["run_after"]) == ("2026-03-01T00:00:00Z", "2026-03-01T00:00:00Z")

    def keys(**params):
        body = api.get("/api/v2/dags/daily/dagRuns/~/taskInstances/~/xcomEntries", params).json()
        return sorted(
            (e["task_id"], e["run_id"], e["key"], e["map_index"]) for e in body["xcom_entries"]
        )

    assert keys(map_index=1) == [("mapped", "r1", "return_value", 1)]
    assert keys(xcom_key="note") == [("extract", "r1", "note", -1)]
    assert keys(xcom_key_pattern="OTE") == [("extract", "r1", "note", -1)]
    assert keys(task_id_prefix_pattern="lo") == [("load", "r1", "return_value", -1)]
    assert len(keys(run_id_pattern="r2")) == 1
    assert len(keys(logical_date_gte="2026-02-01T00:00:00Z")) == 6  # r2 has no logical date
    assert api.get(f"{RUN}/~/xcomEntries", {"order_by": "value"}).status_code == 400
    page = api.get(f"{RUN}/~/xcomEntries", {"limit": 2, "offset": 1, "order_by": "-timestamp"})
    assert (len(page.json()["xcom_entries"]), page.json()["total_entries"]) == (2, 6)


def test_an_xcom_of_a_run_that_no_longer_exists_is_not_listed(api):
    world()
    DagRun.objects.filter(run_id="r2").delete()
    XCom.objects.create(dag_id="daily", run_id="r2", task_id="extract", key="k", value=1)
    body = api.get("/api/v2/dags/daily/dagRuns/r2/taskInstances/~/xcomEntries").json()
    assert body == {"xcom_entries": [], "total_entries": 0}


def test_xcom_entry_as_stored_deserialized_and_stringified(api):
    world()
    url = f"{RUN}/extract/xcomEntries"
    native = api.get(f"{url}/return_value").json()
    assert native["value"] == {"rows": 3}
    assert api.get(f"{url}/return_value", {"stringify": "true"}).json()["value"] == "{'rows': 3}"
    custom = api.get(f"{url}/custom").json()["value"]
    assert custom["__classname__"] == "mymod.Point"
    # Airflow's `stringify`: a serialized object rendered for people, strings with repr.
    shown = api.get(f"{url}/custom", {"deserialize": "true"}).json()["value"]
    assert shown == "mymod.Point@version=1(x=1, y='b')"
    mapped = api.get(f"{RUN}/mapped/xcomEntries/return_value", {"map_index": 1}).json()
    assert (mapped["value"], mapped["map_index"]) == (2, 1)
    missing = api.get(f"{url}/nope")
    assert missing.status_code == 404
    assert missing.json()["detail"]["message"] == "XCom entry with key: `nope` not found"
    assert api.get(f"{url}/return_value", {"map_index": -2}).status_code == 422


def test_readable_follows_airflows_stringify():
    """The cases of Airflow 3.3.2 `airflow.serialization.stringify.stringify`."""
    assert xcoms.readable('{"a": [1, 2]}') == {"a": [1, 2]}
    assert xcoms.readable("not json") == "not json"
    assert xcoms.readable(None) is None
    assert (
        xcoms.readable({"__classname__": "builtins.tuple", "__version__": 1, "__data__": [1, "a"]})
        == "(1,a)"
    )
    old = {"__type": "dict", "__var": {"k": {"__type": "mymod.X", "__var": 3}}}
    assert xcoms.readable(old) == {"k": "mymod.X@version=0(3)"}
    prefixed = f"unusual_prefix_{'a' * 40}_dagfile.Thing"
    assert (
        xcoms.readable({"__classname__": prefixed, "__version__": 2, "__data__": [1, 2]})
        == "dagfile.Thing@version=2(1,2)"
    )
    airflow_class = {"__classname__": "airflow.sdk.Asset", "__version__": 1, "__data__": {}}
    assert xcoms.readable(airflow_class) == airflow_class


def test_xcom_entry_create_update_delete_audited(api):
    world()
    url = f"{RUN}/extract/xcomEntries"
    created = api.post(url, {"key": "added", "value": [1, "a"]}, content_type="application/json")
    assert created.status_code == 201, created.content
    assert (created.json()["key"], created.json()["value"]) == ("added", [1, "a"])
    assert created.json()["run_after"] == "2026-03-01T00:00:00Z"
    again = api.post(url, {"key": "added", "value": 2}, content_type="application/json")
    assert again.status_code == 409
    assert "already exists" in again.json()["detail"]["message"]
    mapped = api.post(url, {"key": "added", "value": 2, "map_index": 4}, "application/json")
    assert mapped.status_code == 201 and mapped.json()["map_index"] == 4
    patched = api.patch(f"{url}/added", {"value": {"k": "v"}}, content_type="application/json")
    assert patched.status_code == 200, patched.content
    assert api.get(f"{url}/added").json()["value"] == {"k": "v"}
    assert api.get(f"{url}/added", {"map_index": 4}).json()["value"] == 2
    assert api.delete(f"{url}/added", QUERY_STRING="map_index=4").status_code == 204
    assert api.delete(f"{url}/added").status_code == 204
    gone = api.delete(f"{url}/added")
    assert gone.status_code == 404
    assert gone.json()["detail"]["message"] == (
        "The XCom with key: `added` with mentioned task instance doesn't exist."
    )
    assert api.patch(f"{url}/added", {"value": 1}, "application/json").status_code == 404
    actions = list(
        AuditEntry.objects.filter(action__startswith="xcom.")
        .order_by("id")
        .values_list("action", "actor_name", "via")
    )
    assert actions == [
        ("xcom.create", "ops", "api"),
        ("xcom.create", "ops", "api"),
        ("xcom.update", "ops", "api"),
        ("xcom.delete", "ops", "api"),
        ("xcom.delete", "ops", "api"),
    ]


def test_xcom_create_refuses_unknown_dag_task_run_and_reserved_keys_writing_nothing(api):
    world()
    before = XCom.objects.count()
    base = "/api/v2/dags/{dag}/dagRuns/{run}/taskInstances/{task}/xcomEntries"
    body = {"key": "k", "value": 1}
    for (dag, run, task), message in (
        (("nope", "r1", "t"), "The Dag with ID: `nope` was not found"),
        (("daily", "r1", "nope"), "Task with ID: `nope` not found in dag: `daily`"),
        (("daily", "nope", "extract"), "Dag Run with ID: `nope` not found for dag: `daily`"),
    ):
        response = api.post(base.format(dag=dag, run=run, task=task), body, "application/json")
        assert response.status_code == 404, response.content
        assert response.json()["detail"]["message"] == message
    for value in ({"a": {"__classname__": "x"}}, '{"__var": 1}', [{"__type": "dict"}]):
        response = api.post(
            f"{RUN}/extract/xcomEntries", {"key": "k", "value": value}, "application/json"
        )
        assert response.status_code == 422, (value, response.content)
        assert response.json()["detail"][0]["ctx"]["reason"] == "reserved_xcom_keys"
    url = f"{RUN}/extract/xcomEntries"
    empty = api.post(url, {"key": "", "value": 1}, "application/json")
    assert (empty.status_code, empty.json()["detail"]["reason"]) == (400, "invalid_key")
    beyond = api.post(url, {"key": "k", "value": 1, "map_index": 2**31}, "application/json")
    assert beyond.status_code == 422
    assert api.get(f"{url}/k", {"map_index": 2**31}).status_code == 422
    assert XCom.objects.count() == before
    assert not AuditEntry.objects.filter(action__startswith="xcom.").exists()


# --- Airflow's answers when it has none of a feature ----------------------------------------------


def test_config_is_not_exposed_as_airflows_default(api):
    for url in ("/api/v2/config", "/api/v2/config/section/core/option/fernet_key"):
        response = api.get(url)
        assert response.status_code == 403, url
        detail = response.json()["detail"]
        assert detail["reason"] == "config_not_exposed"
        assert detail["message"].startswith("Your Airflow administrator chose not to expose")


def test_jobs_plugins_and_providers_are_empty_lists(api):
    assert api.get("/api/v2/jobs").json() == {"jobs": [], "total_entries": 0}
    assert api.get("/api/v2/plugins").json() == {"plugins": [], "total_entries": 0}
    assert api.get("/api/v2/plugins/importErrors").json() == {
        "import_errors": [],
        "total_entries": 0,
    }
    assert api.get("/api/v2/providers").json() == {"providers": [], "total_entries": 0}
    assert api.get("/api/v2/jobs", {"order_by": "hostname"}).status_code == 200
    assert api.get("/api/v2/jobs", {"order_by": "nope"}).status_code == 400


def test_dag_tags_are_distinct_filtered_and_paged(api):
    world()
    assert api.get("/api/v2/dagTags").json() == {
        "tags": ["Team-A", "etl", "team-b"],
        "total_entries": 3,
    }
    assert api.get("/api/v2/dagTags", {"order_by": "-name"}).json()["tags"][0] == "team-b"
    assert api.get("/api/v2/dagTags", {"tag_name_pattern": "TEAM"}).json()["tags"] == [
        "Team-A",
        "team-b",
    ]
    assert api.get("/api/v2/dagTags", {"tag_name_pattern": "t_am-b|etl"}).json()["tags"] == [
        "etl",
        "team-b",
    ]
    assert api.get("/api/v2/dagTags", {"tag_name_prefix_pattern": "te"}).json()["tags"] == [
        "team-b"
    ]
    paged = api.get("/api/v2/dagTags", {"limit": 1, "offset": 1}).json()
    assert paged == {"tags": ["etl"], "total_entries": 3}
    assert api.get("/api/v2/dagTags", {"order_by": "dag_id"}).status_code == 400


def test_dag_stats_count_runs_by_state_for_dags_with_runs(api):
    world()
    body = api.get("/api/v2/dagStats").json()
    assert body["total_entries"] == 2
    assert body["dags"][0] == {
        "dag_id": "daily",
        "dag_display_name": "daily",
        "stats": [
            {"state": "queued", "count": 0},
            {"state": "running", "count": 0},
            {"state": "success", "count": 1},
            {"state": "failed", "count": 1},
        ],
    }
    only = api.get("/api/v2/dagStats", {"dag_ids": ["manual", "once"]}).json()
    assert [d["dag_id"] for d in only["dags"]] == ["manual"]
    assert only["dags"][0]["stats"][1] == {"state": "running", "count": 1}


def test_dag_warnings_are_empty_and_versions_one_per_definition_change(api):
    world()
    assert api.get("/api/v2/dagWarnings").json() == {"dag_warnings": [], "total_entries": 0}
    assert api.get("/api/v2/dagWarnings", {"warning_type": "bad"}).status_code == 422
    listed = api.get("/api/v2/dags/daily/dagVersions").json()
    assert [(v["dag_id"], v["version_number"]) for v in listed["dag_versions"]] == [("daily", 1)]
    assert listed["total_entries"] == 1
    everyone = api.get("/api/v2/dags/~/dagVersions", {"order_by": "-version_number"}).json()
    assert everyone["total_entries"] == 4
    unknown = api.get("/api/v2/dags/nope/dagVersions")
    assert unknown.status_code == 404
    assert unknown.json()["detail"]["message"] == "The Dag with ID: `nope` was not found"
    assert api.get("/api/v2/dags/daily/dagVersions/1").json()["version_number"] == 1
    version = api.get("/api/v2/dags/daily/dagVersions/2")
    assert version.status_code == 404
    assert version.json()["detail"]["reason"] == "dag_version_not_found"
    none = api.get("/api/v2/dags/daily/dagVersions", {"bundle_name": "dags-folder"}).json()
    assert none["total_entries"] == 0


# --- values -------------------------------------------------------------------------------------


def test_is_backfillable_and_timetable_summary_as_airflows_dag_response(api):
    """Airflow's `DAGResponse.is_backfillable`: a periodic timetable whose allowed run types
    include backfill; `timetable_summary` null for a manual-only Dag (its "None" turned null)."""
    world()
    dags = {d["dag_id"]: d for d in api.get("/api/v2/dags").json()["dags"]}
    assert {dag_id: d["is_backfillable"] for dag_id, d in dags.items()} == {
        "daily": True,
        "no_backfill": False,
        "once": False,
        "manual": False,
    }
    assert dags["manual"]["timetable_summary"] is None
    assert dags["daily"]["timetable_summary"] == "0 0 * * *"  # a preset spelled out, as Airflow
    assert api.get("/api/v2/dags/daily/details").json()["is_backfillable"] is True


def test_a_variable_with_a_value_is_encrypted_as_airflow_stores_it(api):
    """Airflow's `Variable.set_val`: a value is Fernet-encrypted (`is_encrypted` true). A body's
    null value is no null there: Airflow 3.3.2's `VariableBody` stores it as the text "null"
    (`serialize_non_string_value`; `VariableBody(key="k", value=None).value == "null"` in the
    pinned Airflow), encrypted too."""
    for key, value in (("with_value", "v"), ("without", None)):
        body = {"key": key, "value": value}
        created = api.post("/api/v2/variables", body, content_type="application/json")
        assert created.status_code == 201, created.content
    listed = {v["key"]: v["is_encrypted"] for v in api.get("/api/v2/variables").json()["variables"]}
    assert listed == {"with_value": True, "without": True}
    assert api.get("/api/v2/variables/without").json()["value"] == "null"
    assert Variable.objects.get(key="with_value").val != "v"


def test_a_backfill_without_conf_answers_null(api):
    """Airflow stores the `dag_run_conf` it was given (`_create_backfill`), null included."""
    world()
    body = {
        "dag_id": "daily",
        "from_date": "2026-01-01T00:00:00Z",
        "to_date": "2026-01-02T00:00:00Z",
    }
    created = api.post("/api/v2/backfills", body, content_type="application/json")
    assert created.status_code == 200, created.content
    assert created.json()["dag_run_conf"] is None
    assert Backfill.objects.get().dag_run_conf is None
    listed = api.get("/api/v2/backfills", {"dag_id": "daily"}).json()["backfills"]
    assert listed[0]["dag_run_conf"] is None
