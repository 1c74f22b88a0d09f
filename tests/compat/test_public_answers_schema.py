"""The answers of issue 49's routes validate against Airflow 3.3.2's own public API document
(`v2-rest-api-generated.yaml`, `airflow_env.airflow_response_problems`): every 2xx body with the
schema Airflow documents for it, and the refusals (403, 404) as Airflow's HTTPExceptionResponse.
The world is `tests/api/test_public_airflowctl.world`. The login routes (`/auth/token`,
`/auth/token/cli`) against the simple auth manager's document: every status it documents."""

import json

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction
from django.test import Client

from assets_app.api.public_auth import create_api_token
from assets_app.definitions import sources
from assets_app.models import Dag, DagRun
from tests.api.test_public_airflowctl import world
from tests.factories import TaskInstanceFactory

from .airflow_env import AUTH_DOCUMENT, airflow_openapi, airflow_response_problems

pytestmark = pytest.mark.django_db

FORM = "application/x-www-form-urlencoded"
TI = "/api/v2/dags/{dag_id}/dagRuns/{dag_run_id}/taskInstances/{task_id}"

# (method, Airflow's path template, our URL, query, expected status)
CALLS = [
    ("get", f"{TI}/xcomEntries", "/api/v2/dags/~/dagRuns/~/taskInstances/~/xcomEntries", {}, 200),
    (
        "get",
        f"{TI}/xcomEntries/{{xcom_key}}",
        "/api/v2/dags/daily/dagRuns/r1/taskInstances/extract/xcomEntries/return_value",
        {},
        200,
    ),
    (
        "get",
        f"{TI}/xcomEntries/{{xcom_key}}",
        "/api/v2/dags/daily/dagRuns/r1/taskInstances/extract/xcomEntries/custom",
        {"deserialize": "true", "stringify": "true"},
        200,
    ),
    (
        "get",
        f"{TI}/xcomEntries/{{xcom_key}}",
        "/api/v2/dags/daily/dagRuns/r1/taskInstances/extract/xcomEntries/nope",
        {},
        404,
    ),
    (
        "post",
        f"{TI}/xcomEntries",
        "/api/v2/dags/daily/dagRuns/r1/taskInstances/extract/xcomEntries",
        {"key": "added", "value": {"a": [1]}},
        201,
    ),
    (
        "post",
        f"{TI}/xcomEntries",
        "/api/v2/dags/daily/dagRuns/r1/taskInstances/extract/xcomEntries",
        {"key": "added", "value": 1},
        409,
    ),
    (
        "patch",
        f"{TI}/xcomEntries/{{xcom_key}}",
        "/api/v2/dags/daily/dagRuns/r1/taskInstances/extract/xcomEntries/added",
        {"value": "text"},
        200,
    ),
    ("get", "/api/v2/dagTags", "/api/v2/dagTags", {}, 200),
    ("get", "/api/v2/dagStats", "/api/v2/dagStats", {}, 200),
    ("get", "/api/v2/dagWarnings", "/api/v2/dagWarnings", {}, 200),
    (
        "get",
        "/api/v2/dags/{dag_id}/dagVersions",
        "/api/v2/dags/daily/dagVersions",
        {},
        200,
    ),
    (
        "get",
        "/api/v2/dags/{dag_id}/dagVersions/{version_number}",
        "/api/v2/dags/daily/dagVersions/1",
        {},
        200,
    ),
    # Issue 45: a Dag's file as synced; an unknown Dag, a Dag without a stored source and an
    # earlier version (only the current source is kept) are Airflow's 404s.
    ("get", "/api/v2/dagSources/{dag_id}", "/api/v2/dagSources/daily", {}, 200),
    ("get", "/api/v2/dagSources/{dag_id}", "/api/v2/dagSources/nope", {}, 404),
    ("get", "/api/v2/dagSources/{dag_id}", "/api/v2/dagSources/manual", {}, 404),
    (
        "get",
        "/api/v2/dagSources/{dag_id}",
        "/api/v2/dagSources/daily",
        {"version_number": 99},
        404,
    ),
    ("delete", "/api/v2/dags/{dag_id}", "/api/v2/dags/nope", None, 404),
    (
        "patch",
        "/api/v2/dags/{dag_id}/dagRuns/{dag_run_id}",
        "/api/v2/dags/daily/dagRuns/r2",
        {"note": "seen"},
        200,
    ),
    (
        "patch",
        "/api/v2/dags/{dag_id}/dagRuns/{dag_run_id}",
        "/api/v2/dags/daily/dagRuns/nope",
        {"state": "failed"},
        404,
    ),
    (
        "delete",
        "/api/v2/dags/{dag_id}/dagRuns/{dag_run_id}",
        "/api/v2/dags/manual/dagRuns/m1",
        None,
        409,
    ),
    ("get", f"{TI}/tries", "/api/v2/dags/daily/dagRuns/r1/taskInstances/load/tries", {}, 200),
    (
        "get",
        f"{TI}/tries/{{task_try_number}}",
        "/api/v2/dags/daily/dagRuns/r1/taskInstances/load/tries/1",
        {},
        200,
    ),
    (
        "get",
        f"{TI}/tries/{{task_try_number}}",
        "/api/v2/dags/daily/dagRuns/r1/taskInstances/load/tries/9",
        {},
        404,
    ),
    ("get", f"{TI}/links", "/api/v2/dags/daily/dagRuns/r1/taskInstances/load/links", {}, 200),
    ("get", f"{TI}/links", "/api/v2/dags/daily/dagRuns/r1/taskInstances/nope/links", {}, 404),
    ("delete", TI, "/api/v2/dags/daily/dagRuns/r1/taskInstances/nope", None, 404),
    (
        "patch",
        f"{TI}/dry_run",
        "/api/v2/dags/daily/dagRuns/r1/taskInstances/load/dry_run",
        {"new_state": "failed"},
        200,
    ),
    ("patch", TI, "/api/v2/dags/daily/dagRuns/r1/taskInstances/load", {"new_state": "failed"}, 200),
    ("patch", TI, "/api/v2/dags/daily/dagRuns/r1/taskInstances/load", {"new_state": "failed"}, 409),
    (
        "patch",
        f"{TI}/{{map_index}}",
        "/api/v2/dags/daily/dagRuns/r1/taskInstances/load/3",
        {"note": "n"},
        404,
    ),
    ("get", "/api/v2/jobs", "/api/v2/jobs", {}, 200),
    ("get", "/api/v2/plugins", "/api/v2/plugins", {}, 200),
    ("get", "/api/v2/plugins/importErrors", "/api/v2/plugins/importErrors", {}, 200),
    ("get", "/api/v2/providers", "/api/v2/providers", {}, 200),
    ("get", "/api/v2/config", "/api/v2/config", {}, 403),
    (
        "get",
        "/api/v2/config/section/{section}/option/{option}",
        "/api/v2/config/section/core/option/dags_folder",
        {},
        403,
    ),
    ("post", "/api/v2/connections/defaults", "/api/v2/connections/defaults", None, 403),
    (
        "post",
        "/api/v2/connections/test",
        "/api/v2/connections/test",
        {"connection_id": "c", "conn_type": "http"},
        403,
    ),
    ("get", "/api/v2/dags", "/api/v2/dags", {}, 200),
    ("get", "/api/v2/dags/{dag_id}/details", "/api/v2/dags/daily/details", {}, 200),
    (
        "post",
        "/api/v2/backfills",
        "/api/v2/backfills",
        {"dag_id": "daily", "from_date": "2026-01-01T00:00:00Z", "to_date": "2026-01-02T00:00:00Z"},
        200,
    ),
    ("get", "/api/v2/backfills", "/api/v2/backfills", {"dag_id": "daily"}, 200),
    (
        "patch",
        "/api/v2/variables",
        "/api/v2/variables",
        {
            "actions": [
                {"action": "create", "entities": [{"key": "v", "value": {"n": 1}}]},
                {"action": "create", "entities": [{"key": "v", "value": 2}]},
                {"action": "delete", "entities": ["nope"]},
            ]
        },
        200,
    ),
    (
        "patch",
        "/api/v2/connections",
        "/api/v2/connections",
        {
            "actions": [
                {"action": "create", "entities": [{"connection_id": "c", "conn_type": "http"}]},
                {
                    "action": "update",
                    "entities": [{"connection_id": "c", "conn_type": "http", "host": "h"}],
                },
            ]
        },
        200,
    ),
    (
        "patch",
        "/api/v2/pools",
        "/api/v2/pools",
        {"actions": [{"action": "update", "entities": [{"name": "nope", "slots": 1}]}]},
        200,
    ),
    ("patch", "/api/v2/pools", "/api/v2/pools", {"actions": [{"action": "create"}]}, 422),
    (
        "get",
        "/api/v2/auth/login",
        "/api/v2/auth/login",
        {"next": "https://elsewhere.example/"},
        400,
    ),
]


def test_issue_49_answers_validate_against_airflows_document():
    get_user_model().objects.create_user("ops", password="pw", is_staff=True, is_superuser=True)
    _, key = create_api_token(username="ops", name="test")
    api = Client(headers={"Authorization": f"Bearer {key}"})
    world()
    Dag.objects.filter(dag_id="daily").update(fileloc="dags/daily.py")
    with transaction.atomic():
        sources.record_sources([sources.cut("dags/daily.py", "from airflow import DAG\n")])
    TaskInstanceFactory(
        dag_run=DagRun.objects.get(dag_id="daily", run_id="r1"),
        task_id="load",
        succeeded=True,
        try_number=1,
    )
    answers = []
    for method, template, url, params, status in CALLS:
        if method == "get":
            response = api.get(url, params)
        else:
            response = getattr(api, method)(url, params, content_type="application/json")
        assert response.status_code == status, (url, response.content)
        answers.append((method, template, status, response.json()))
    assert airflow_response_problems(answers) == []


def test_login_answers_validate_against_airflows_auth_manager_document():
    get_user_model().objects.create_user("ops", password="pw-ops-1")
    ok, wrong = {"username": "ops", "password": "pw-ops-1"}, {"username": "ops", "password": "n"}
    calls = [
        ("post", "/auth/token", ok, "application/json", 201),
        ("post", "/auth/token", "username=ops&password=pw-ops-1", FORM, 201),
        ("post", "/auth/token", {"username": "ops", "password": ""}, "application/json", 400),
        ("post", "/auth/token", wrong, "application/json", 401),
        ("post", "/auth/token", "x", "text/plain", 415),
        ("post", "/auth/token", {"username": "ops"}, "application/json", 422),
        ("get", "/auth/token", None, None, 403),
        ("get", "/auth/token/login", None, None, 403),
        ("post", "/auth/token/cli", ok, "application/json", 201),
        ("post", "/auth/token/cli", {"username": "", "password": "x"}, "application/json", 400),
        ("post", "/auth/token/cli", wrong, "application/json", 401),
        ("post", "/auth/token/cli", {**ok, "role": "ADMIN"}, "application/json", 422),
        ("post", "/auth/token/cli", "{", "application/json", 422),
    ]
    answers = []
    for method, path, body, content_type, status in calls:
        client = Client()
        if method == "get":
            response = client.get(path)
        else:
            data = json.dumps(body) if isinstance(body, dict) else body
            response = client.post(path, data, content_type=content_type)
        assert response.status_code == status, (path, body, response.content)
        answers.append((method, path, status, response.json()))
    assert airflow_response_problems(answers, document=AUTH_DOCUMENT) == []
    # Every status Airflow documents for the login routes was answered (but 307: all-admins).
    documented = {
        (method, path, int(status))
        for path, methods in airflow_openapi(AUTH_DOCUMENT)["paths"].items()
        for method, operation in methods.items()
        for status in operation["responses"]
        if status != "307"
    }
    assert documented - {(m, p, s) for m, p, _, _, s in calls} == {
        ("get", "/auth/token", 201),  # only with simple_auth_manager_all_admins
    }


def test_the_validation_finds_a_wrong_type_and_a_missing_field():
    """The check can fail: a tag that is a number, a stats entry without its Dag id."""
    problems = airflow_response_problems(
        [
            ("get", "/api/v2/dagTags", 200, {"tags": [1], "total_entries": 1}),
            ("get", "/api/v2/dagStats", 200, {"dags": [{"stats": []}], "total_entries": 1}),
        ]
    )
    assert len(problems) == 3, problems
    assert any("tags/0: 1 is not of type 'string'" in p for p in problems)
    assert any("'dag_id' is a required property" in p for p in problems)
