"""Issue 49: Airflow 3.3.2's bulk routes (`PATCH /api/v2/variables`, `/connections`, `/pools`,
`runtime.bulk`), which `airflowctl variables|connections|pools import` use: create / update /
delete actions with `action_on_existence` / `action_on_non_existence`, Airflow's messages and
BulkResponse, an action that fails writes nothing, every write audited, the permissions each
action needs. (Their answers are validated against Airflow's document in
`tests/compat/test_public_answers_schema.py`.)"""

import json

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from assets_app.api.public_auth import create_api_token
from assets_app.models import AuditEntry, Connection, Pool, Variable
from assets_app.runtime import bulk
from assets_app.runtime.variables import get_connection, value_of
from tests.api.snapshots import db_snapshot

pytestmark = pytest.mark.django_db


def _client(username: str, *, superuser: bool = True, perms: tuple[str, ...] = ()) -> Client:
    user = get_user_model().objects.create_user(username, password="pw", is_superuser=superuser)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="assets_app", codename__in=perms)
    )
    _, key = create_api_token(username=username, name="test")
    return Client(headers={"Authorization": f"Bearer {key}"})


@pytest.fixture
def api() -> Client:
    return _client("ops")


def _bulk(api: Client, path: str, *actions: dict):
    return api.patch(
        f"/api/v2/{path}",
        data=json.dumps({"actions": list(actions)}),
        content_type="application/json",
    )


def test_variables_create_fail_skip_overwrite_update_and_delete(api):
    Variable.objects.create(key="a", val="old", description="kept")
    refused = _bulk(api, "variables", {"action": "create", "entities": [{"key": "a", "value": 1}]})
    assert refused.status_code == 200, refused.content
    assert refused.json() == {
        "create": {
            "success": [],
            "errors": [
                {"error": "The variables with these keys: {'a'} already exist.", "status_code": 409}
            ],
        },
        "update": None,
        "delete": None,
    }
    answer = _bulk(
        api,
        "variables",
        {
            "action": "create",
            "entities": [{"key": "a", "value": "x"}, {"key": "b", "value": {"n": 1}}],
            "action_on_existence": "skip",
        },
        {
            "action": "update",
            "entities": [{"key": "a", "value": "new"}, {"key": "zz", "value": "y"}],
            "action_on_non_existence": "skip",
        },
        {"action": "delete", "entities": ["gone"], "action_on_non_existence": "fail"},
    ).json()
    assert answer["create"] == {"success": ["b"], "errors": []}
    assert answer["update"] == {"success": ["a"], "errors": []}
    assert answer["delete"] == {
        "success": [],
        "errors": [
            {"error": "The variables with these keys: {'gone'} were not found.", "status_code": 404}
        ],
    }
    a = Variable.objects.get(key="a")
    assert (value_of(a), a.description) == ("new", "kept")  # an update keeps what it did not send
    assert value_of(Variable.objects.get(key="b")) == '{\n  "n": 1\n}'
    over = _bulk(
        api,
        "variables",
        {
            "action": "create",
            "entities": [{"key": "a", "value": "o"}],
            "action_on_existence": "overwrite",
        },
        {"action": "delete", "entities": ["b", "nope"], "action_on_non_existence": "skip"},
    ).json()
    assert (over["create"]["success"], over["delete"]["success"]) == (["a"], ["b"])
    a.refresh_from_db()
    assert (value_of(a), a.description) == ("o", None)  # Airflow's Variable.set
    assert not Variable.objects.filter(key="b").exists()
    audited = AuditEntry.objects.filter(action__startswith="variable.").order_by("id")
    actions = list(audited.values_list("action", flat=True))
    assert actions == [
        "variable.create",
        "variable.update",
        "variable.update",
        "variable.delete",
    ]


def test_a_failing_action_writes_nothing_and_the_others_apply(api):
    Pool.objects.create(name="p1", slots=1)
    before = db_snapshot()
    answer = _bulk(
        api,
        "pools",
        {
            "action": "update",
            "entities": [{"name": "p1", "slots": 9}, {"name": "default_pool", "slots": 3}],
        },
    ).json()
    assert answer["update"]["success"] == []
    assert answer["update"]["errors"] == [
        {
            "error": "Only slots and included_deferred can be modified on Default Pool",
            "status_code": 400,
        }
    ]
    assert db_snapshot() == before  # p1 was not left at 9 slots
    answer = _bulk(
        api,
        "pools",
        {"action": "create", "entities": [{"name": "p2", "slots": 2, "description": "d"}]},
        {"action": "update", "entities": [{"name": "p1", "slots": 4}], "update_mask": ["slots"]},
        {"action": "delete", "entities": ["default_pool"]},
    ).json()
    assert (answer["create"]["success"], answer["update"]["success"]) == (["p2"], ["p1"])
    assert answer["delete"]["errors"][0]["error"] == "Default Pool can't be deleted"
    assert Pool.objects.get(name="p1").slots == 4
    assert Pool.objects.filter(name="default_pool").exists()


def test_a_connection_update_keeps_the_password_it_does_not_send(api):
    Connection.objects.create(conn_id="c", conn_type="http")
    api.patch(
        "/api/v2/connections/c",
        data=json.dumps({"connection_id": "c", "conn_type": "http", "password": "pw1"}),
        content_type="application/json",
    )
    answer = _bulk(
        api,
        "connections",
        {
            "action": "update",
            "entities": [
                {"connection_id": "c", "conn_type": "http", "host": "h", "password": None}
            ],
        },
        {
            "action": "create",
            "entities": [{"connection_id": "d", "conn_type": "postgres", "password": "pw2"}],
        },
    ).json()
    assert (answer["update"]["success"], answer["create"]["success"]) == (["c"], ["d"])
    c = get_connection(conn_id="c")
    assert (c.connection.host, c.password) == ("h", "pw1")
    assert get_connection(conn_id="d").password == "pw2"
    assert Connection.objects.get(conn_id="d").password != "pw2"  # encrypted at rest


@pytest.mark.parametrize(
    ("perms", "action", "status"),
    [
        (("add_variable",), {"action": "create", "entities": [{"key": "k", "value": 1}]}, 200),
        (
            ("add_variable",),
            {"action": "create", "entities": [], "action_on_existence": "overwrite"},
            403,
        ),
        (("add_variable",), {"action": "delete", "entities": ["k"]}, 403),
        (("add_variable", "delete_variable"), {"action": "delete", "entities": ["k"]}, 200),
        (("add_variable",), {"action": "update", "entities": []}, 403),
    ],
)
def test_each_action_needs_its_own_permission_and_a_refusal_writes_nothing(perms, action, status):
    api = _client("limited", superuser=False, perms=perms)
    before = db_snapshot()
    response = _bulk(api, "variables", action)
    assert response.status_code == status, response.content
    if status == 403:
        assert db_snapshot() == before


@pytest.mark.parametrize(
    "body",
    [
        {"actions": [{"action": "create", "entities": [{"key": "k"}]}]},
        {"actions": [{"action": "upsert", "entities": []}]},
        {"actions": [{"action": "create", "entities": [], "action_on_existence": "replace"}]},
        {"actions": [{"action": "create", "entities": [], "unknown": 1}]},
        {"actions": [{"action": "create", "entities": [{"key": "k", "value": 1}]}], "x": 1},
    ],
)
def test_a_bad_body_is_a_422_and_writes_nothing(api, body):
    before = db_snapshot()
    response = api.patch(
        "/api/v2/variables", data=json.dumps(body), content_type="application/json"
    )
    assert response.status_code == 422, response.content
    assert db_snapshot() == before


def test_more_entities_than_the_limit_are_refused_before_anything_is_written(api, monkeypatch):
    monkeypatch.setattr(bulk, "MAX_ENTITIES", 2)
    before = db_snapshot()
    entities = [{"key": f"k{i}", "value": i} for i in range(3)]
    response = _bulk(api, "variables", {"action": "create", "entities": entities})
    assert response.status_code == 400, response.content
    assert "at most 2 entities; this one carries 3" in response.json()["detail"]["message"]
    assert db_snapshot() == before
