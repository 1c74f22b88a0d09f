"""Issue 26: the audit trail records every write through every door. Variables and Connections
created, changed and deleted through the public API, the admin and the worker API; runs a task
triggers or clears with its token. A worker-API entry names the acting TI (`via` "task",
`detail["ti_id"]`), never "system"; no entry holds a secret value."""

import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from assets_app.api.public_auth import create_api_token
from assets_app.models import AuditEntry, Connection, TaskInstance, Variable
from assets_app.runtime import variables
from tests.api.conftest import WorkerClient
from tests.factories import DagFactory, TaskFactory, TaskInstanceFactory

pytestmark = pytest.mark.django_db


def _entries(prefix: str) -> list[tuple[str, str, str, str]]:
    found = AuditEntry.objects.filter(action__startswith=prefix).order_by("id")
    for entry in found:
        assert "s3cret" not in entry.summary and "s3cret" not in json.dumps(entry.detail)
    return [
        (e.action, e.via, e.actor_name, e.targets.get().object_id)
        for e in found.prefetch_related("targets")
    ]


def test_public_api_writes_of_variables_and_connections_are_audited():
    get_user_model().objects.create_superuser("ops", password="pw")
    _, key = create_api_token(username="ops", name="t")
    api = Client(headers={"Authorization": f"Bearer {key}"})

    def send(method, path, body=None):
        response = getattr(api, method)(
            f"/api/v2{path}", data=json.dumps(body), content_type="application/json"
        )
        assert response.status_code < 300, response.content
        return response

    send("post", "/variables", {"key": "v", "value": "s3cret-1"})
    send("patch", "/variables/v", {"key": "v", "value": "s3cret-2"})
    send("delete", "/variables/v")
    send("post", "/connections", {"connection_id": "c", "conn_type": "http", "password": "s3cret"})
    send("patch", "/connections/c", {"connection_id": "c", "conn_type": "ftp"})
    send("delete", "/connections/c")
    assert _entries("variable.") == [
        ("variable.create", "api", "ops", "v"),
        ("variable.update", "api", "ops", "v"),
        ("variable.delete", "api", "ops", "v"),
    ]
    assert _entries("connection.") == [
        ("connection.create", "api", "ops", "c"),
        ("connection.update", "api", "ops", "c"),
        ("connection.delete", "api", "ops", "c"),
    ]
    created = AuditEntry.objects.get(action="connection.create")
    assert "password" in created.detail["fields"]


def test_admin_writes_of_variables_and_connections_are_audited():
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("operator", password="pw"))
    base = "/admin/assets_app"
    assert client.post(f"{base}/variable/add/", {"key": "v", "val": "s3cret"}).status_code == 302
    variable = Variable.objects.get(key="v")
    changed = client.post(f"{base}/variable/{variable.pk}/change/", {"val": "s3cret-2"})
    assert changed.status_code == 302
    deleted = client.post(f"{base}/variable/{variable.pk}/delete/", {"post": "yes"})
    assert deleted.status_code == 302 and not Variable.objects.exists()
    added = client.post(
        f"{base}/connection/add/",
        {"conn_id": "c", "conn_type": "http", "new_password": "s3cret"},
    )
    assert added.status_code == 302, added.content[:3000]
    connection = Connection.objects.get(conn_id="c")
    changed = client.post(f"{base}/connection/{connection.pk}/change/", {"conn_type": "ftp"})
    assert changed.status_code == 302, changed.content[:3000]
    assert Connection.objects.get().conn_type == "ftp"
    variables.set_variable(key="w", value="x")
    bulk = client.post(
        f"{base}/connection/",
        {"action": "delete_selected", "_selected_action": [connection.pk], "post": "yes"},
    )
    assert bulk.status_code == 302 and not Connection.objects.exists()
    assert _entries("variable.") == [
        ("variable.create", "admin", "operator", "v"),
        ("variable.update", "admin", "operator", "v"),
        ("variable.delete", "admin", "operator", "v"),
        ("variable.set", "system", "system", "w"),
    ]
    assert _entries("connection.") == [
        ("connection.create", "admin", "operator", "c"),
        ("connection.update", "admin", "operator", "c"),
        ("connection.delete", "admin", "operator", "c"),
    ]


def test_worker_api_writes_name_the_task_instance():
    worker = WorkerClient()
    ti = TaskInstanceFactory(running=True)
    put = worker.request("PUT", "/variables/v", {"val": "s3cret"}, ti_id=ti.id)
    assert put.status_code == 201, put.content
    assert worker.request("DELETE", "/variables/v", ti_id=ti.id).status_code == 204
    entries = list(AuditEntry.objects.filter(action__startswith="variable.").order_by("id"))
    assert [(e.action, e.via) for e in entries] == [
        ("variable.set", "task"),
        ("variable.delete", "task"),
    ]
    for entry in entries:
        assert entry.actor_name == f"task instance {ti.id}"
        assert entry.detail["ti_id"] == str(ti.id) and entry.detail["try_number"] == 1


def test_runs_a_task_triggers_or_clears_are_audited_with_the_task_instance():
    worker = WorkerClient()
    ti = TaskInstanceFactory(running=True)
    TaskFactory(dag=DagFactory(dag_id="target"), task_id="t")
    path = "/dag-runs/target/from_task"
    assert worker.request("POST", path, {"conf": {}}, ti_id=ti.id).status_code == 204
    assert TaskInstance.objects.filter(dag_id="target").update(state="success") == 1
    assert worker.request("POST", f"{path}/clear", ti_id=ti.id).status_code == 204
    entries = list(AuditEntry.objects.filter(dag_id="target").order_by("id"))
    assert [e.action for e in entries] == ["dag_run.trigger", "dag_run.clear"]
    for entry in entries:
        assert (entry.via, entry.actor_name) == ("task", f"task instance {ti.id}")
        assert entry.detail["ti_id"] == str(ti.id)
