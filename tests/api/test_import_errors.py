"""Issue 27: the Dag files that did not import (Airflow's import errors). A sync reports them
beside the files that did; those files still sync, the broken file's Dags stay as last synced and
say `has_import_errors`; each reporting sync replaces the stored set, a replay writes nothing;
`GET /api/v2/importErrors` answers with Airflow 3.3.2's shapes and filters."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from assets_app.api.public_auth import create_api_token
from assets_app.models import AuditEntry, Dag, DagImportError
from tests.proof.conftest import app_table_counts

pytestmark = pytest.mark.django_db

TRACE = (
    'Traceback (most recent call last):\n  File "broken.py", line 3\nSyntaxError: invalid syntax'
)


def _doc(dag_id: str) -> dict:
    return {"dag_id": dag_id, "tasks": [{"task_id": "t"}]}


@pytest.fixture
def sync(client, settings):
    settings.DAG_SYNC_KEY = "deploy-key-" + "d" * 30

    def post(files, import_errors=None, bundle_name=None):
        body = {"files": [{"file": f, "definitions": d} for f, d in files.items()]}
        if bundle_name is not None:
            body["bundle_name"] = bundle_name
        if import_errors is not None:
            body["import_errors"] = [{"file": f, "error": e} for f, e in import_errors.items()]
        return client.post(
            "/execution/dags/sync",
            body,
            content_type="application/json",
            headers={"Authorization": f"Bearer {settings.DAG_SYNC_KEY}"},
        )

    return post


@pytest.fixture
def api():
    get_user_model().objects.create_user("ops", password="pw", is_superuser=True)
    _, key = create_api_token(username="ops", name="test")
    return Client(headers={"Authorization": f"Bearer {key}"})


def test_the_other_files_sync_and_the_broken_files_dags_stay_as_last_synced(sync):
    first = sync({"good.py": [_doc("good")], "broken.py": [_doc("was_fine")]}, import_errors={})
    assert first.status_code == 200, first.content
    assert first.json()["import_errors"] == []
    reported = sync({"good.py": [_doc("good"), _doc("good_2")]}, import_errors={"broken.py": TRACE})
    assert reported.status_code == 200, reported.content
    body = reported.json()
    assert body["dags_created"] == 1 and body["import_errors"] == ["broken.py"]
    assert "1 files did not import, their Dags kept as last synced: broken.py" in body["summary"]
    assert Dag.objects.filter(dag_id="was_fine", fileloc="broken.py").exists()
    (error,) = DagImportError.objects.all()
    assert (error.filename, error.stack_trace, error.bundle_name) == (
        "broken.py",
        TRACE,
        "dags-folder",
    )
    audit = AuditEntry.objects.filter(action="sync_dags").latest("id")
    assert audit.detail["import_errors"] == ["broken.py"]


def test_a_replayed_sync_writes_nothing_and_a_fixed_file_loses_its_error(sync):
    files = {"good.py": [_doc("good")]}
    sync(files, import_errors={"broken.py": TRACE, "other.py": "ImportError: no module x"})
    before = app_table_counts()
    stored = list(DagImportError.objects.values_list("id", "filename", "timestamp"))
    again = sync(files, import_errors={"broken.py": TRACE, "other.py": "ImportError: no module x"})
    assert again.status_code == 200
    assert app_table_counts() == before  # no audit entry, no row rewritten
    assert list(DagImportError.objects.values_list("id", "filename", "timestamp")) == stored
    # other.py imports again; broken.py fails differently: its row is new, other.py's gone.
    changed = sync(files, import_errors={"broken.py": "NameError: name 'x' is not defined"})
    assert changed.json()["import_errors"] == ["broken.py"]
    (error,) = DagImportError.objects.all()
    assert error.stack_trace == "NameError: name 'x' is not defined"
    assert error.timestamp > stored[0][2]
    # A sync that reports nothing (an older worker) leaves them alone; an empty list clears them.
    sync(files)
    assert DagImportError.objects.count() == 1
    sync(files, import_errors={})
    assert DagImportError.objects.count() == 0


def test_import_errors_are_kept_per_bundle_and_dags_record_theirs(sync, api):
    """Issue 44: a clean sync of bundle B keeps bundle A's import errors (Airflow keeps
    `ParseImportError` per bundle); each Dag records the bundle it was synced from."""
    a = sync({"a.py": [_doc("from_a")]}, import_errors={"broken.py": TRACE}, bundle_name="team-a")
    assert a.status_code == 200, a.content
    b = sync({"b.py": [_doc("from_b")]}, import_errors={}, bundle_name="team-b")
    assert b.status_code == 200, b.content
    assert list(DagImportError.objects.values_list("filename", "bundle_name")) == [
        ("broken.py", "team-a")
    ]
    assert dict(Dag.objects.values_list("dag_id", "bundle_name")) == {
        "from_a": "team-a",
        "from_b": "team-b",
    }
    # The same file name broken in B: its own row, A's untouched; A's clean sync clears A's.
    sync({"b.py": [_doc("from_b")]}, import_errors={"broken.py": "B's trace"}, bundle_name="team-b")
    sync({"a.py": [_doc("from_a")]}, import_errors={}, bundle_name="team-a")
    assert list(DagImportError.objects.values_list("filename", "bundle_name")) == [
        ("broken.py", "team-b")
    ]
    # Left out: Airflow's default bundle. Airflow's DAGResponse and its filter name the bundle.
    sync({"c.py": [_doc("from_default")]})
    assert Dag.objects.get(dag_id="from_default").bundle_name == "dags-folder"
    listed = api.get("/api/v2/dags", {"bundle_name": "team-a"}).json()
    assert [d["dag_id"] for d in listed["dags"]] == ["from_a"]
    assert listed["dags"][0]["bundle_name"] == "team-a"
    assert sync({"d.py": [_doc("d")]}, bundle_name="no spaces").status_code == 422


def test_an_import_error_outside_the_bundle_is_refused_and_nothing_is_written(sync):
    before = app_table_counts()
    refused = sync({"good.py": [_doc("good")]}, import_errors={"../etc/passwd": TRACE})
    assert refused.status_code == 422, refused.content
    assert refused.json()["detail"]["reason"] == "invalid_fileloc"
    assert app_table_counts() == before


def test_dags_say_whether_their_file_imported_and_filter_on_it(sync, api):
    sync({"good.py": [_doc("good")], "broken.py": [_doc("stale")]}, import_errors={})
    sync({"good.py": [_doc("good")]}, import_errors={"broken.py": TRACE})
    dags = {d["dag_id"]: d["has_import_errors"] for d in api.get("/api/v2/dags").json()["dags"]}
    assert dags == {"good": False, "stale": True}
    assert api.get("/api/v2/dags/stale").json()["has_import_errors"] is True
    flagged = api.get("/api/v2/dags", {"has_import_errors": "true"}).json()["dags"]
    assert [d["dag_id"] for d in flagged] == ["stale"]
    clean = api.get("/api/v2/dags", {"has_import_errors": "false"}).json()["dags"]
    assert [d["dag_id"] for d in clean] == ["good"]


def test_import_errors_list_and_get_with_airflows_shapes_and_filters(sync, api):
    sync({}, import_errors={"b/two.py": "E2", "a/one.py": "E1", "a/three.py": "E3"})
    page = api.get("/api/v2/importErrors").json()
    assert page["total_entries"] == 3
    assert [e["filename"] for e in page["import_errors"]] == ["a/one.py", "a/three.py", "b/two.py"]
    first = page["import_errors"][0]
    assert set(first) == {"import_error_id", "timestamp", "filename", "bundle_name", "stack_trace"}
    assert first["stack_trace"] == "E1" and first["bundle_name"] == "dags-folder"
    got = api.get(f"/api/v2/importErrors/{first['import_error_id']}")
    assert got.status_code == 200 and got.json() == first
    by_prefix = api.get("/api/v2/importErrors", {"filename_prefix_pattern": "a/"}).json()
    assert by_prefix["total_entries"] == 2
    exact = api.get("/api/v2/importErrors", {"filename": "b/two.py"}).json()
    assert [e["stack_trace"] for e in exact["import_errors"]] == ["E2"]
    ordered = api.get("/api/v2/importErrors", {"order_by": "-filename", "limit": 1}).json()
    assert [e["filename"] for e in ordered["import_errors"]] == ["b/two.py"]
    assert ordered["total_entries"] == 3
    missing = api.get("/api/v2/importErrors/999999")
    assert missing.status_code == 404
    assert "999999" in missing.json()["detail"]["message"]
    bad_order = api.get("/api/v2/importErrors", {"order_by": "colour"})
    assert bad_order.status_code == 400


def test_reading_import_errors_needs_the_view_permission(sync):
    sync({}, import_errors={"x.py": "E"})
    user = get_user_model().objects.create_user("viewer", password="x")
    user.user_permissions.set(Permission.objects.filter(codename="view_dag"))
    _, key = create_api_token(username="viewer", name="v")
    viewer = Client(headers={"Authorization": f"Bearer {key}"})
    refused = viewer.get("/api/v2/importErrors")
    assert refused.status_code == 403
    assert "view_dagimporterror" in refused.json()["detail"]["message"]
    user.user_permissions.add(Permission.objects.get(codename="view_dagimporterror"))
    assert viewer.get("/api/v2/importErrors").json()["total_entries"] == 1
