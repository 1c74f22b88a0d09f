"""Issue 45: a DAG file's source as the worker synced it (Airflow's `DagCode`). The sync stores
each file's text, replaces it when it changed (a replay writes nothing), deletes it with the
file, cuts a file over the limit and says so (the other files sync); `GET
/api/v2/dagSources/{dag_id}` answers as Airflow 3.3.2's route (the JSON shape is validated
against Airflow's document in `tests/compat/test_public_answers_schema.py`)."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from airflow_worker import dag_files
from assets_app.api.public_auth import create_api_token
from assets_app.definitions import sources
from assets_app.models import AuditEntry, DagCode
from assets_app.models.dags import DAG_SOURCE_MAX_BYTES

pytestmark = pytest.mark.django_db

LIMIT = DAG_SOURCE_MAX_BYTES


def _doc(dag_id: str) -> dict:
    return {"dag_id": dag_id, "tasks": [{"task_id": "t"}]}


@pytest.fixture
def sync(client, settings):
    settings.DAG_SYNC_KEY = "deploy-key-" + "d" * 30

    def post(files, import_errors=None, **extra):
        body = {
            "files": [
                {"file": f, "definitions": [_doc(dag_id)], "source": text, **extra.get(f, {})}
                for f, (dag_id, text) in files.items()
            ],
            "import_errors": [{"file": f, "error": e} for f, e in (import_errors or {}).items()],
        }
        answer = client.post(
            "/execution/dags/sync",
            body,
            content_type="application/json",
            headers={"Authorization": f"Bearer {settings.DAG_SYNC_KEY}"},
        )
        assert answer.status_code == 200, answer.content
        return answer.json()

    return post


@pytest.fixture
def api():
    get_user_model().objects.create_user("ops", password="pw", is_superuser=True)
    _, key = create_api_token(username="ops", name="test")
    return Client(headers={"Authorization": f"Bearer {key}"})


def _stored() -> dict[str, str]:
    return dict(DagCode.objects.values_list("fileloc", "source_code"))


def test_the_sync_stores_replaces_and_deletes_each_files_source(sync):
    sync({"a.py": ("a", "A = 1\n"), "b.py": ("b", "B = 1\n")})
    assert _stored() == {"a.py": "A = 1\n", "b.py": "B = 1\n"}
    row = DagCode.objects.get(fileloc="a.py")
    assert row.source_code_hash == sources.source_hash("A = 1\n") and not row.truncated

    audits = AuditEntry.objects.filter(action="sync_dags").count()
    replay = sync({"a.py": ("a", "A = 1\n"), "b.py": ("b", "B = 1\n")})
    assert "source" not in replay["summary"]
    assert DagCode.objects.get(fileloc="a.py").last_updated == row.last_updated  # nothing written
    assert AuditEntry.objects.filter(action="sync_dags").count() == audits

    # A comment changed: the definitions are the same, the source is replaced (and audited).
    sync({"a.py": ("a", "A = 1  # two\n"), "b.py": ("b", "B = 1\n")})
    assert _stored()["a.py"] == "A = 1  # two\n"
    assert AuditEntry.objects.filter(action="sync_dags").count() == audits + 1

    # b.py left the folder: its source goes; a file that did not import keeps its last source.
    sync({"c.py": ("c", "C = 1\n")}, import_errors={"a.py": "SyntaxError: nope"})
    assert _stored() == {"a.py": "A = 1  # two\n", "c.py": "C = 1\n"}


def test_a_refused_file_keeps_its_source_and_the_others_sync(sync):
    sync({"a.py": ("a", "A = 1\n")})
    body = {"files": [{"file": "a.py", "definitions": [{"dag_id": "a", "nope": 1}], "source": "x"}]}
    client_answer = Client().post(
        "/execution/dags/sync",
        {**body, "import_errors": []},
        content_type="application/json",
        headers={"Authorization": "Bearer deploy-key-" + "d" * 30},
    )
    assert client_answer.status_code == 200, client_answer.content
    assert _stored() == {"a.py": "A = 1\n"}


def test_a_file_over_the_limit_is_stored_cut_with_a_note_and_the_others_sync(sync, api):
    big = "# é\n" * (LIMIT // 5 + 10)  # 5 bytes a line: over the limit
    answer = sync({"big.py": ("big", big), "small.py": ("small", "S = 1\n")})
    assert "big.py: its source is longer than 524,288 bytes" in answer["summary"]
    row = DagCode.objects.get(fileloc="big.py")
    assert row.truncated and row.source_size == len(big.encode())
    assert len(row.source_code.encode()) <= LIMIT and big.startswith(row.source_code)
    assert _stored()["small.py"] == "S = 1\n"
    text = api.get("/api/v2/dagSources/big", headers={"Accept": "text/plain"}).content.decode()
    assert text.endswith(
        f"truncated: the file is {len(big.encode()):,} bytes; only its first "
        f"{LIMIT:,} bytes are stored (the service's limit for a DAG file's source)\n"
    )


def test_the_worker_cuts_a_long_file_at_a_character_and_sends_its_size(tmp_path):
    assert dag_files.SOURCE_MAX_BYTES == LIMIT
    path = tmp_path / "big.py"
    path.write_bytes(b"a" + "é".encode() * LIMIT)  # the limit falls inside a character
    text, size = dag_files.read_source(path)
    assert size == 1 + 2 * LIMIT
    assert len(text.encode()) == LIMIT - 1 and text == "a" + "é" * ((LIMIT - 1) // 2)
    small = tmp_path / "small.py"
    small.write_text("x = 'é'\n")
    assert dag_files.read_source(small) == ("x = 'é'\n", 9)
    payload = dag_files.DagFile(rel_path="s.py", definitions=[], source="x", source_size=1)
    assert payload.payload() == {"file": "s.py", "definitions": [], "source": "x", "source_size": 1}


def test_the_route_answers_as_airflows(sync, api):
    sync({"dags/a.py": ("a", "from airflow import DAG\n<b>&</b>\n")})
    answer = api.get("/api/v2/dagSources/a")
    assert answer.status_code == 200
    assert answer.json() == {
        "content": "from airflow import DAG\n<b>&</b>\n",
        "dag_id": "a",
        "version_number": 1,  # the latest version's: only the current source is kept
        "dag_display_name": "a",
    }
    assert api.get("/api/v2/dagSources/a", {"version_number": 1}).status_code == 200
    text = api.get("/api/v2/dagSources/a", headers={"Accept": "text/plain"})
    assert text["Content-Type"].startswith("text/plain")
    assert text.content.decode() == "from airflow import DAG\n<b>&</b>\n"
    assert api.get("/api/v2/dagSources/a", headers={"Accept": "application/json"}).json()["dag_id"]

    refused = api.get("/api/v2/dagSources/a", headers={"Accept": "text/html"})
    assert refused.status_code == 406
    assert refused.json()["detail"]["message"] == "Only application/json or text/plain is supported"
    unknown = api.get("/api/v2/dagSources/nope")
    assert unknown.status_code == 404
    assert unknown.json()["detail"]["message"] == (
        "The source code of the Dag nope, version_number None was not found"
    )
    version = api.get("/api/v2/dagSources/a", {"version_number": 2})
    assert version.json()["detail"]["message"] == (
        "The source code of the Dag a, version_number 2 was not found"
    )
    DagCode.objects.all().delete()
    gone = api.get("/api/v2/dagSources/a")
    assert gone.status_code == 404
    assert gone.json()["detail"]["message"] == "Code not found. dag_id='a' version_number='None'"


def test_the_route_needs_the_read_permission_of_dags(sync):
    sync({"a.py": ("a", "A = 1\n")})
    get_user_model().objects.create_user("nobody", password="pw", is_staff=True)
    _, key = create_api_token(username="nobody", name="test")
    answer = Client(headers={"Authorization": f"Bearer {key}"}).get("/api/v2/dagSources/a")
    assert answer.status_code == 403
    assert "assets_app.view_dag" in answer.content.decode()
