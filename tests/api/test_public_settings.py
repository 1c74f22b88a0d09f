"""Public API v2 Variables and Connections: Airflow 3.3.2's shapes, secrets masked and
encrypted at rest, bad input refused with nothing written."""

import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from assets_app.api.public_auth import create_api_token
from assets_app.models import Connection, Variable
from assets_app.runtime.variables import get_connection, value_of
from tests.api.snapshots import db_snapshot

pytestmark = pytest.mark.django_db


@pytest.fixture
def api():
    get_user_model().objects.create_superuser("ops", password="pw")
    _, key = create_api_token(username="ops", name="test")
    return Client(headers={"Authorization": f"Bearer {key}"})


def _send(api, method, path, body=None):
    return getattr(api, method)(
        f"/api/v2{path}", data=json.dumps(body), content_type="application/json"
    )


def test_variable_crud_and_listing(api):
    made = _send(api, "post", "/variables", {"key": "greeting", "value": "hello"})
    assert made.status_code == 201, made.content
    assert made.json() == {
        "key": "greeting",
        "value": "hello",
        "description": None,
        "is_encrypted": True,  # stored encrypted, as Airflow's (issue 38)
        "team_name": None,
    }
    assert _send(api, "post", "/variables", {"key": "greeting", "value": "x"}).status_code == 409
    _send(api, "post", "/variables", {"key": "limits", "value": {"rows": 5}})
    # Airflow 3.3.2's VariableBody: a non-string value is stored as JSON indented by 2, null as
    # "null" (its `serialize_non_string_value`, checked in its own model).
    assert value_of(Variable.objects.get(key="limits")) == '{\n  "rows": 5\n}'
    _send(api, "post", "/variables", {"key": "nothing", "value": None})
    assert api.get("/api/v2/variables/nothing").json()["value"] == "null"
    listed = api.get("/api/v2/variables", {"variable_key_pattern": "greet", "order_by": "key"})
    assert listed.json()["total_entries"] == 1
    patched = _send(
        api,
        "patch",
        "/variables/greeting?update_mask=description",
        {"key": "greeting", "value": "ignored", "description": "d"},
    )
    assert patched.json()["value"] == "hello" and patched.json()["description"] == "d"
    assert api.delete("/api/v2/variables/greeting").status_code == 204
    assert api.get("/api/v2/variables/greeting").status_code == 404


def test_connection_crud_masks_and_encrypts(api):
    body = {
        "connection_id": "warehouse",
        "conn_type": "postgres",
        "host": "db",
        "schema": "analytics",
        "login": "etl",
        "password": "hunter2",
        "extra": '{"sslmode": "require", "api_key": "abc"}',
    }
    made = _send(api, "post", "/connections", body)
    assert made.status_code == 201, made.content
    shown = made.json()
    assert shown["password"] == "***" and shown["schema"] == "analytics"
    assert json.loads(shown["extra"]) == {"sslmode": "require", "api_key": "***"}
    stored = Connection.objects.get()
    assert "hunter2" not in stored.password and "sslmode" not in stored.extra
    assert get_connection(conn_id="warehouse").password == "hunter2"
    patched = _send(
        api,
        "patch",
        "/connections/warehouse?update_mask=password",
        {**body, "host": "ignored", "password": "new"},
    )
    assert patched.status_code == 200 and patched.json()["host"] == "db"
    assert get_connection(conn_id="warehouse").password == "new"
    assert api.get("/api/v2/connections").json()["total_entries"] == 1
    assert _send(api, "post", "/connections", body).status_code == 409
    assert api.delete("/api/v2/connections/warehouse").status_code == 204
    assert api.get("/api/v2/connections/warehouse").status_code == 404


def test_bad_connection_body_writes_nothing(api):
    bad = _send(api, "post", "/connections", {"connection_id": "x y", "conn_type": "http"})
    assert bad.status_code == 422
    assert not Connection.objects.exists()


def test_admin_connection_form_encrypts_and_never_shows_the_password(client):
    get_user_model().objects.create_superuser("root", password="pw")
    client.login(username="root", password="pw")
    form = {
        "conn_id": "admin_made",
        "conn_type": "http",
        "host": "h",
        "new_password": "p4ss",
        "new_extra": '{"token": "t0k", "region": "eu"}',
    }
    added = client.post("/admin/assets_app/connection/add/", form)
    assert added.status_code == 302, added.content[:2000]
    stored = Connection.objects.get(conn_id="admin_made")
    assert "p4ss" not in stored.password
    assert get_connection(conn_id="admin_made").password == "p4ss"
    page = client.get(f"/admin/assets_app/connection/{stored.pk}/change/").content.decode()
    assert "p4ss" not in page and "t0k" not in page and "eu" in page
    # Saving without typing a password keeps the stored one.
    kept = client.post(
        f"/admin/assets_app/connection/{stored.pk}/change/", {**form, "new_password": ""}
    )
    assert kept.status_code == 302
    assert get_connection(conn_id="admin_made").password == "p4ss"
    listing = client.get("/admin/assets_app/connection/").content.decode()
    assert "p4ss" not in listing


# --- PATCH /connections as Airflow 3.3.2 updates (`update_orm_from_pydantic`) ----------------


def test_a_variable_patch_changes_only_what_the_body_carries(api):
    """Airflow 3.3.2's variable PATCH (`update_orm_from_pydantic`): a description the body left
    out keeps its value, with or without an update_mask naming it; `key` in the mask, or a body
    naming another key, is a 400 with Airflow's message and writes nothing."""
    _send(api, "post", "/variables", {"key": "v", "value": "one", "description": "kept"})
    patched = _send(api, "patch", "/variables/v", {"key": "v", "value": "two"})
    assert patched.status_code == 200, patched.content
    assert (patched.json()["value"], patched.json()["description"]) == ("two", "kept")
    masked = _send(
        api,
        "patch",
        "/variables/v?update_mask=description&update_mask=value",
        {"key": "v", "value": "three"},
    )
    assert (masked.json()["value"], masked.json()["description"]) == ("three", "kept")
    before = db_snapshot()
    immutable = _send(api, "patch", "/variables/v?update_mask=key", {"key": "v", "value": "4"})
    assert immutable.status_code == 400, immutable.content
    assert "immutable and cannot be modified: {'key'}" in immutable.json()["detail"]["message"]
    other = _send(api, "patch", "/variables/v", {"key": "w", "value": "4"})
    assert other.status_code == 400, other.content
    assert "key from request body doesn't match uri parameter" in other.json()["detail"]["message"]
    assert db_snapshot() == before
    assert value_of(Variable.objects.get(key="v")) == "three"


@pytest.fixture
def warehouse(api):
    body = {
        "connection_id": "warehouse",
        "conn_type": "postgres",
        "description": "the warehouse",
        "host": "db",
        "login": "etl",
        "password": "hunter2",
        "extra": '{"sslmode": "require", "api_key": "abc"}',
    }
    assert _send(api, "post", "/connections", body).status_code == 201
    return body


def test_a_patch_without_update_mask_keeps_the_password_it_sends_as_null(api, warehouse):
    """What `airflowctl connections update --connection-id warehouse --conn-type http --host
    example.org --port 8443` sends (issue 49): `"password": null`, no update_mask. Airflow keeps
    the stored password and every field the body does not carry."""
    patched = _send(
        api,
        "patch",
        "/connections/warehouse",
        {
            "connection_id": "warehouse",
            "conn_type": "http",
            "host": "example.org",
            "port": 8443,
            "password": None,
        },
    )
    assert patched.status_code == 200, patched.content
    shown = patched.json()
    assert (shown["conn_type"], shown["host"], shown["port"]) == ("http", "example.org", 8443)
    assert shown["password"] == "***"
    assert (shown["description"], shown["login"]) == ("the warehouse", "etl")
    stored = get_connection(conn_id="warehouse")
    assert stored.password == "hunter2"
    assert json.loads(stored.extra) == {"sslmode": "require", "api_key": "abc"}


def test_a_patch_of_what_a_get_showed_puts_the_masked_secrets_back(api, warehouse):
    """A client that reads a Connection (password and secret keys of `extra` masked) and sends
    it back with one change keeps the stored secrets, as Airflow's `merge` does."""
    shown = api.get("/api/v2/connections/warehouse").json()
    extra = json.loads(shown["extra"])
    assert extra == {"sslmode": "require", "api_key": "***"}
    sent = {**shown, "host": "db2", "extra": json.dumps({**extra, "sslmode": "disable"})}
    patched = _send(api, "patch", "/connections/warehouse", sent)
    assert patched.status_code == 200, patched.content
    stored = get_connection(conn_id="warehouse")
    assert stored.password == "hunter2"
    assert json.loads(stored.extra) == {"sslmode": "disable", "api_key": "abc"}
    assert stored.connection.host == "db2"
    # An empty password is no password either (Airflow's `set_password` ignores it); a new one
    # replaces the stored one.
    _send(api, "patch", "/connections/warehouse", {**sent, "password": ""})
    assert get_connection(conn_id="warehouse").password == "hunter2"
    _send(api, "patch", "/connections/warehouse", {**sent, "password": "s3cret"})
    assert get_connection(conn_id="warehouse").password == "s3cret"


def test_a_patch_with_update_mask_changes_only_the_named_fields_it_sends(api, warehouse):
    patched = _send(
        api,
        "patch",
        "/connections/warehouse?update_mask=host&update_mask=password",
        {"connection_id": "warehouse", "conn_type": "http", "host": "db3", "login": "x"},
    )
    assert patched.status_code == 200, patched.content
    stored = get_connection(conn_id="warehouse")
    assert (stored.connection.host, stored.connection.conn_type) == ("db3", "postgres")
    assert (stored.connection.login, stored.password) == ("etl", "hunter2")


def test_a_patch_naming_another_connection_is_refused_and_writes_nothing(api, warehouse):
    refused = _send(
        api,
        "patch",
        "/connections/warehouse",
        {"connection_id": "other", "conn_type": "http", "host": "elsewhere"},
    )
    assert refused.status_code == 400
    assert "does not match" in refused.json()["detail"]["message"]
    assert get_connection(conn_id="warehouse").connection.host == "db"
