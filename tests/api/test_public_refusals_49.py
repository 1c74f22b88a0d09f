"""Routes of Airflow 3.3.2's public API for features this service does not run, answered as
Airflow answers without them: `/connections/enqueue-test` (POST: the 403 of `test_connection`
disabled, after the body's validation; GET: the 404 of an unknown token) and
`PUT /parseDagFile/{file_token}` (404 "File not found": no token is ever signed here),
`.../externalLogUrl/{try_number}` (400: no external log handler)."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from assets_app.api.public_auth import create_api_token
from assets_app.models import Connection

pytestmark = pytest.mark.django_db


@pytest.fixture
def api() -> Client:
    get_user_model().objects.create_user("ops", password="pw", is_superuser=True)
    _, key = create_api_token(username="ops", name="test")
    return Client(headers={"Authorization": f"Bearer {key}"})


def test_enqueue_test_is_airflows_refusal_and_no_connection_id(api):
    body = {"connection_id": "c", "conn_type": "http", "commit_on_success": True}
    response = api.post("/api/v2/connections/enqueue-test", body, content_type="application/json")
    assert response.status_code == 403, response.content
    assert response.json()["detail"]["message"].startswith("Testing connections is disabled")
    assert not Connection.objects.exists()
    invalid = api.post("/api/v2/connections/enqueue-test", {}, content_type="application/json")
    assert invalid.status_code == 422


def test_polling_a_connection_test_is_airflows_404(api):
    response = api.get(
        "/api/v2/connections/enqueue-test", headers={"Airflow-Connection-Test-Token": "t1"}
    )
    assert response.status_code == 404, response.content
    assert response.json()["detail"]["message"] == "No connection test found for token: `t1`"
    assert api.get("/api/v2/connections/enqueue-test").status_code == 422  # header required


def test_reparse_a_dag_file_says_the_worker_parses_files(api):
    response = api.put("/api/v2/parseDagFile/anything")
    assert response.status_code == 404, response.content
    message = response.json()["detail"]["message"]
    assert message.startswith("File not found") and "bin/airflow-worker" in message


def test_external_log_urls_are_airflows_400_without_an_external_handler(api):
    url = "/api/v2/dags/d/dagRuns/r/taskInstances/t/externalLogUrl/1"
    response = api.get(url)
    assert response.status_code == 400, response.content
    message = response.json()["detail"]["message"]
    assert message == "Task log handler does not support external logs."
    assert api.get(url[:-1] + "0").status_code == 422  # Airflow's PositiveInt
