"""Issue 26, masking as Airflow's secrets masker does it (`assets_app.guards.masking`): sensitive
keys at any depth of a Connection's `extra`, Variables whose key (or a key inside their JSON value)
names a secret, in the admin (list and change pages) and every public API answer; the worker
API still gives running tasks the real values (as Airflow's does)."""

import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from assets_app.api.public_auth import create_api_token
from assets_app.guards import masking
from assets_app.models import AuditEntry, Variable
from assets_app.operations import audit
from assets_app.runtime import variables
from assets_app.runtime.variables import value_of
from assets_app.scheduling import runs
from tests.api.conftest import WorkerClient
from tests.factories import DagFactory, TaskInstanceFactory

pytestmark = pytest.mark.django_db

NESTED_EXTRA = {
    "region": "eu-west-1",
    "session": {"auth": {"password": "s3cret-pw", "user": "svc"}},
    "headers": [{"Authorization": "Bearer s3cret-bearer"}, {"Accept": "json"}],
    "ssh": {"private_key": "s3cret-pem", "passwd": "s3cret-passwd"},
    "X-Api-Key": "s3cret-apikey",
}
SECRETS = ("s3cret-pw", "s3cret-bearer", "s3cret-pem", "s3cret-passwd", "s3cret-apikey")


@pytest.fixture
def stored():
    variables.save_connection(
        conn_id="warehouse",
        create=True,
        conn_type="http",
        host="h",
        password="s3cret-conn",
        extra=json.dumps(NESTED_EXTRA),
    )
    variables.set_variable(key="db_password", value="s3cret-var")
    variables.set_variable(key="settings", value=json.dumps({"api": {"token": "s3cret-json"}}))
    variables.set_variable(key="greeting", value="hello")


@pytest.fixture
def staff_client():
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("operator", password="pw"))
    return client


def _assert_masked(text: str) -> None:
    for secret in (*SECRETS, "s3cret-conn", "s3cret-var", "s3cret-json"):
        assert secret not in text, secret


def test_redact_masks_nested_keys_at_any_depth_and_keeps_the_rest():
    redacted = masking.redact(NESTED_EXTRA)
    assert redacted == {
        "region": "eu-west-1",
        "session": {"auth": {"password": "***", "user": "svc"}},
        "headers": [{"Authorization": "***"}, {"Accept": "json"}],
        "ssh": {"private_key": "***", "passwd": "***"},
        "X-Api-Key": "***",
    }
    # Stricter than Airflow: a number under a sensitive key is masked too.
    assert masking.redact({"pin": {"password": 1234}}) == {"pin": {"password": "***"}}
    deep: dict = {"password": "x"}
    for _ in range(5000):  # deeper than Python's recursion limit
        deep = {"k": deep}
    node = masking.redact(deep)
    while "k" in node:
        node = node["k"]
    assert node == {"password": "***"}
    assert masking.masked_extra("not json") == "***"
    # Stored text too deep for Python's parser (or to compare) is masked whole, never a 500.
    for levels in (950, 5_000):
        text = '{"k": ' * levels + '{"password": "x"}' + "}" * levels
        assert "x" not in masking.masked_extra(text)
        assert "x" not in (masking.masked_variable("settings", text) or "")


def test_public_api_answers_are_masked(stored):
    get_user_model().objects.create_superuser("ops", password="pw")
    _, key = create_api_token(username="ops", name="t")
    api = Client(headers={"Authorization": f"Bearer {key}"})
    one = api.get("/api/v2/connections/warehouse")
    assert one.status_code == 200
    assert json.loads(one.json()["extra"])["session"]["auth"] == {"password": "***", "user": "svc"}
    assert one.json()["password"] == "***"
    for path in ("/api/v2/connections", "/api/v2/variables"):
        listed = api.get(path)
        assert listed.status_code == 200
        _assert_masked(listed.content.decode())
    answers = {v["key"]: v["value"] for v in api.get("/api/v2/variables").json()["variables"]}
    assert answers["db_password"] == "***"
    assert json.loads(answers["settings"]) == {"api": {"token": "***"}}
    assert answers["greeting"] == "hello"
    _assert_masked(api.get("/api/v2/variables/db_password").content.decode())
    patched = api.patch(
        "/api/v2/variables/db_password",
        data=json.dumps({"key": "db_password", "value": "s3cret-var"}),
        content_type="application/json",
    )
    assert patched.status_code == 200 and patched.json()["value"] == "***"


def test_worker_api_returns_real_values_to_a_running_task(stored):
    worker_api = WorkerClient()
    ti = TaskInstanceFactory(running=True)
    conn = worker_api.request("GET", "/connections/warehouse", ti_id=ti.id).json()
    assert json.loads(conn["extra"]) == NESTED_EXTRA and conn["password"] == "s3cret-conn"
    var = worker_api.request("GET", "/variables/db_password", ti_id=ti.id).json()
    assert var["value"] == "s3cret-var"


def test_admin_list_and_change_pages_are_masked(stored, staff_client):
    for url in ("/admin/assets_app/connection/", "/admin/assets_app/variable/"):
        page = staff_client.get(url)
        assert page.status_code == 200
        _assert_masked(page.content.decode())
    for model, key in (("connection", "warehouse"), ("variable", "db_password")):
        obj = (
            variables.get_connection(conn_id=key).connection
            if model == "connection"
            else Variable.objects.get(key=key)
        )
        page = staff_client.get(f"/admin/assets_app/{model}/{obj.pk}/change/")
        assert page.status_code == 200
        _assert_masked(page.content.decode())
    # Saving the masked text back keeps the stored value.
    variable = Variable.objects.get(key="db_password")
    saved = staff_client.post(
        f"/admin/assets_app/variable/{variable.pk}/change/",
        {"val": "***", "description": "rotated monthly"},
    )
    assert saved.status_code == 302, saved.content[:2000]
    variable.refresh_from_db()
    assert (value_of(variable), variable.description) == ("s3cret-var", "rotated monthly")


def test_the_audit_entry_of_a_trigger_keeps_the_conf_masked():
    DagFactory(dag_id="d")
    conf = {"db": {"password": "s3cret-conf", "host": "h"}}
    runs.trigger_dag(dag_id="d", conf=conf, actor=audit.Actor(name="ops", via="api"))
    entry = AuditEntry.objects.get(action="dag_run.trigger")
    assert entry.detail["conf"] == {"db": {"password": "***", "host": "h"}}
