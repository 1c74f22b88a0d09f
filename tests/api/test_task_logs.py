"""Issue 27: task logs shipped by workers (PUT /execution/task-instances/{id}/logs/{try}) and
served by Airflow's logs endpoint (GET /api/v2/.../taskInstances/{task_id}/logs/{try})."""

import json
import subprocess

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client

from assets_app.api.public_auth import create_api_token
from assets_app.models import TaskLogChunk
from tests.factories import TaskInstanceFactory

pytestmark = pytest.mark.django_db

LINES = [
    '{"timestamp": "2026-12-02T14:00:00.000001Z", "level": "info", "event": "starting"}\n',
    "not json at all\n",
    '{"timestamp": "2026-12-02T14:00:01Z", "level": "error", "event": "Task failed", '
    '"error_detail": [{"exc_type": "RuntimeError"}]}\n',
]


def _put(ti, try_number, offset, content, key=None):
    return Client().put(
        f"/execution/task-instances/{ti.id}/logs/{try_number}",
        data=json.dumps({"offset": offset, "content": content}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {key or settings.WORKER_API_KEY}"},
    )


@pytest.fixture
def api():
    get_user_model().objects.create_user("ops", password="pw", is_staff=True, is_superuser=True)
    _, key = create_api_token(username="ops", name="test")
    return Client(headers={"Authorization": f"Bearer {key}"})


def _logs_url(ti, try_number):
    return (
        f"/api/v2/dags/{ti.dag_id}/dagRuns/{ti.run_id}/taskInstances/{ti.task_id}/logs/{try_number}"
    )


def test_chunks_append_idempotently_by_offset_and_refuse_gaps():
    ti = TaskInstanceFactory()
    first = _put(ti, 1, 0, LINES[0])
    assert first.status_code == 200, first.content
    assert first.json() == {"stored_bytes": len(LINES[0].encode()), "duplicate": False}
    again = _put(ti, 1, 0, LINES[0])  # a retry after a lost answer
    assert again.json()["duplicate"] is True
    assert TaskLogChunk.objects.count() == 1
    gap = _put(ti, 1, 5000, LINES[1])
    assert gap.status_code == 409
    assert gap.json()["detail"]["reason"] == "log_offset_gap"
    assert gap.json()["detail"]["stored_bytes"] == len(LINES[0].encode())
    assert _put(ti, 1, len(LINES[0].encode()), LINES[1]).status_code == 200
    assert TaskLogChunk.objects.count() == 2


def test_bad_chunks_are_refused_naming_the_problem(settings):
    ti = TaskInstanceFactory()
    assert _put(ti, 1, 0, "x", key="not-the-key").status_code in (401, 403)
    assert _put(ti, 2, 0, "x").json()["detail"]["reason"] == "invalid_try"
    settings.TASK_LOG_CHUNK_MAX_BYTES = 10
    big = _put(ti, 1, 0, "y" * 11)
    assert big.status_code == 413 and big.json()["detail"]["reason"] == "log_chunk_too_large"
    settings.TASK_LOG_CHUNK_MAX_BYTES = 100
    settings.TASK_LOG_MAX_BYTES = 15
    assert _put(ti, 1, 0, "z" * 10).status_code == 200
    total = _put(ti, 1, 10, "z" * 10)
    assert total.status_code == 413 and total.json()["detail"]["reason"] == "log_too_large"
    assert TaskLogChunk.objects.count() == 1  # nothing half-written


def test_an_empty_chunk_is_refused_and_cannot_freeze_a_log():
    """Issue 38: an empty chunk at offset 0 was stored, and every later chunk at offset 0 was
    then taken for its duplicate: the log stayed empty for good."""
    ti = TaskInstanceFactory()
    empty = _put(ti, 1, 0, "")
    assert empty.status_code == 422 and empty.json()["detail"]["reason"] == "empty_log_chunk"
    assert not TaskLogChunk.objects.exists()
    assert _put(ti, 1, 0, LINES[0]).json() == {
        "stored_bytes": len(LINES[0].encode()),
        "duplicate": False,
    }


def test_the_public_logs_endpoint_answers_airflows_shape_with_continuation(api):
    ti = TaskInstanceFactory(state="failed")
    offset = 0
    for line in LINES[:2]:
        assert _put(ti, 1, offset, line).status_code == 200
        offset += len(line.encode())
    answer = api.get(_logs_url(ti, 1))
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert [m["event"] for m in body["content"]] == ["starting", "not json at all"]
    assert body["content"][0]["level"] == "info"
    token = body["continuation_token"]
    assert _put(ti, 1, offset, LINES[2]).status_code == 200
    rest = api.get(_logs_url(ti, 1), {"token": token}).json()
    assert [m["event"] for m in rest["content"]] == ["Task failed"]
    full = api.get(_logs_url(ti, 1), {"token": token, "full_content": "true"}).json()
    assert len(full["content"]) == 3
    assert api.get(_logs_url(ti, 2)).status_code == 404
    assert api.get(_logs_url(ti, 1), {"token": "forged"}).status_code == 400
    assert _valid_for_airflow([body, rest, full]) == []


def test_the_logs_endpoint_streams_ndjson_when_asked_as_airflows(api):
    """Issue 44: `Accept: application/x-ndjson` (listed by Airflow's OpenAPI, asked by its UI)
    answers one structured message a line; the continuation token, while the try may still
    log, in `Airflow-Continuation-Token` (Airflow's `get_log`)."""
    ti = TaskInstanceFactory(state="running")
    assert _put(ti, 1, 0, LINES[0]).status_code == 200
    answer = api.get(_logs_url(ti, 1), headers={"Accept": "application/x-ndjson"})
    assert answer.status_code == 200, answer.content
    assert answer["Content-Type"] == "application/x-ndjson"
    lines = answer.content.decode().splitlines()
    assert [json.loads(line)["event"] for line in lines] == ["starting"]
    token = answer["Airflow-Continuation-Token"]
    assert _put(ti, 1, len(LINES[0].encode()), LINES[1]).status_code == 200
    rest = api.get(_logs_url(ti, 1), {"token": token}, headers={"Accept": "application/x-ndjson"})
    assert [json.loads(line)["event"] for line in rest.content.decode().splitlines()] == [
        "not json at all"
    ]
    ti.state = "success"
    ti.save(update_fields=["state"])
    done = api.get(_logs_url(ti, 1), headers={"Accept": "application/x-ndjson"})
    assert "Airflow-Continuation-Token" not in done
    assert api.get(_logs_url(ti, 1), headers={"Accept": "image/png"}).status_code == 422


def test_a_ti_that_never_ran_has_an_empty_log_at_try_0(api):
    """Airflow 3.3.2's log route reads the TI whose try_number is the one asked: a TI skipped
    before it was queued is at try 0, with nothing logged; it has no try 1."""
    ti = TaskInstanceFactory(state="skipped", try_number=0)
    answer = api.get(_logs_url(ti, 0))
    assert answer.status_code == 200, answer.content
    assert answer.json()["content"] == []
    assert api.get(_logs_url(ti, 1)).status_code == 404
    ran = TaskInstanceFactory(state="failed", try_number=2)
    assert api.get(_logs_url(ran, 0)).status_code == 404
    assert _valid_for_airflow([answer.json()]) == []


def _valid_for_airflow(bodies):
    """Failures of airflow-core 3.3.2's own TaskInstancesLogResponse on each body."""
    from tests.compat.airflow_worker_env import sdk_python

    code = (
        "import json, sys\n"
        "from airflow.api_fastapi.core_api.datamodels.log import TaskInstancesLogResponse\n"
        "failures = []\n"
        "for body in json.load(sys.stdin):\n"
        "    try:\n"
        "        TaskInstancesLogResponse.model_validate(body)\n"
        "    except Exception as exc:\n"
        "        failures.append(str(exc))\n"
        "print(json.dumps(failures))\n"
    )
    done = subprocess.run(
        [str(sdk_python()), "-c", code],
        input=json.dumps(bodies),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_admin_ti_page_shows_the_log(admin_client):
    ti = TaskInstanceFactory(state="running")
    assert _put(ti, 1, 0, LINES[0]).status_code == 200
    page = admin_client.get(f"/admin/assets_app/taskinstance/{ti.id}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "starting" in text and ", live" in text and "location.reload" in text
