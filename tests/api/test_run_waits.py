"""GET /api/v2/dags/{id}/dagRuns/{run_id}/wait is bounded (issue 26,
`assets_app/catalog/run_waits.py`): a stream ends after RUN_WAIT_MAX_SECONDS with Airflow's NDJSON
lines, at most RUN_WAIT_MAX_CONCURRENT stream at once per server, and while ten are asked for, a
worker's claim through a real gunicorn (as bin/serve runs it) is answered at once."""

import json
import threading
import time

import pytest
import requests
from django.contrib.auth.models import Permission, User

from assets_app.api import public_auth
from assets_app.models import DagRunState
from tests import servers
from tests.factories import DagRunFactory, TaskFactory, TaskInstanceFactory
from tests.proof.conftest import figure, service_env  # noqa: F401 - fixture

pytestmark = pytest.mark.django_db


def _viewer_key() -> str:
    """An API token of a user who may only view runs (the issue's view-only token)."""
    user = User.objects.create_user("viewer")
    user.user_permissions.add(Permission.objects.get(codename="view_dagrun"))
    _, key = public_auth.create_api_token(username="viewer", name="viewer")
    return key


@pytest.fixture
def waits(settings, tmp_path):
    settings.RUN_WAIT_SLOT_DIR = tmp_path / "slots"
    settings.RUN_WAIT_MAX_CONCURRENT = 1
    settings.RUN_WAIT_MAX_SECONDS = 0.4
    return settings


def _wait(client, key, run, interval=0.1):
    return client.get(
        f"/api/v2/dags/{run.dag_id}/dagRuns/{run.run_id}/wait?interval={interval}",
        headers={"Authorization": f"Bearer {key}"},
    )


def _lines(response, *, within: float = 5.0) -> list[dict]:
    """The stream's lines; fails if it is still open after `within` s (main streamed forever)."""
    deadline = time.monotonic() + within
    chunks = []
    for chunk in response.streaming_content:  # the test client closes it at the end
        chunks.append(chunk)
        if time.monotonic() > deadline:
            pytest.fail(f"the wait still streams after {within} s")
    body = b"".join(chunks).decode()
    assert body.endswith("\n")
    return [json.loads(line) for line in body.splitlines()]


def test_a_wait_on_an_unfinished_run_ends_at_the_cap_with_airflows_lines(client, waits):
    run = DagRunFactory(state=DagRunState.RUNNING)
    key = _viewer_key()
    started = time.monotonic()
    response = _wait(client, key, run)
    assert response.status_code == 200
    assert response["Content-Type"] == "application/x-ndjson"
    lines = _lines(response)
    elapsed = time.monotonic() - started
    assert 0.4 <= elapsed < 2.0, elapsed
    # Airflow's format: one `{"state": ...}` object a line, the first one at once; the cap ends
    # the stream on the run's current (unfinished) state, and the client asks again.
    assert len(lines) >= 2
    assert all(line == {"state": "running"} for line in lines)


def test_a_wait_on_a_finished_run_answers_one_line(client, waits):
    run = DagRunFactory(state=DagRunState.SUCCESS)
    assert _lines(_wait(client, _viewer_key(), run)) == [{"state": "success"}]


def test_waits_beyond_the_servers_slots_get_503_with_retry_after_until_one_ends(client, waits):
    waits.RUN_WAIT_MAX_SECONDS = 1
    run = DagRunFactory(state=DagRunState.RUNNING)
    key = _viewer_key()
    first = _wait(client, key, run)
    assert first.status_code == 200
    refused = _wait(client, key, run)
    assert refused.status_code == 503
    assert refused["Retry-After"] == "1"
    detail = refused.json()["detail"]
    assert detail["reason"] == "too_many_waits"
    assert "RUN_WAIT_MAX_CONCURRENT" in detail["message"]
    assert _lines(first)[-1] == {"state": "running"}  # ended by the cap, then closed
    again = _wait(client, key, run)
    assert again.status_code == 200
    _lines(again)


def test_an_unknown_run_is_404_and_takes_no_slot(client, waits):
    key = _viewer_key()
    response = client.get(
        "/api/v2/dags/nope/dagRuns/nope/wait?interval=1", headers={"Authorization": f"Bearer {key}"}
    )
    assert response.status_code == 404
    run = DagRunFactory(state=DagRunState.SUCCESS)
    assert _wait(client, key, run).status_code == 200


WAITS = 10
CAP_SECONDS = 4.0


@pytest.mark.django_db(transaction=True)
def test_a_claim_is_answered_promptly_while_ten_waits_are_open(service_env, tmp_path):  # noqa: F811
    """On main each wait held a sync worker until gunicorn killed it at 30 s, so a claim behind
    two of them waited ~29 s. Two workers and gunicorn's own timeout, as bin/serve runs it."""
    waited = DagRunFactory(state=DagRunState.RUNNING)
    task = TaskFactory(task_id="work")
    TaskInstanceFactory(dag_run=DagRunFactory(dag=task.dag), task_id="work")
    key = _viewer_key()
    env = {
        **service_env,
        "RUN_WAIT_MAX_SECONDS": str(CAP_SECONDS),
        "RUN_WAIT_SLOT_DIR": str(tmp_path / "slots"),
    }
    web = servers.gunicorn(env, tmp_path / "gunicorn.log", workers=2)
    try:
        url = f"{web.url}/api/v2/dags/{waited.dag_id}/dagRuns/{waited.run_id}/wait?interval=0.2"
        answers: list[tuple[int, float, str | None]] = []

        def wait() -> None:
            started = time.monotonic()
            try:
                with requests.get(
                    url, headers={"Authorization": f"Bearer {key}"}, stream=True, timeout=40
                ) as response:
                    for _ in response.iter_lines():
                        pass
                    retry_after = response.headers.get("Retry-After")
                    answers.append((response.status_code, time.monotonic() - started, retry_after))
            except requests.RequestException as exc:  # gunicorn killed the worker (main)
                answers.append((0, time.monotonic() - started, repr(exc)))

        threads = [threading.Thread(target=wait, daemon=True) for _ in range(WAITS)]
        for thread in threads:
            thread.start()
        # Every wait is sent; those beyond the slot are refused (on main none is answered, so
        # this gives up after 10 s and the claim queues behind them).
        deadline = time.monotonic() + 10
        while len(answers) < WAITS - 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        started = time.monotonic()
        try:
            claim = requests.post(
                f"{web.url}/execution/workloads/claim",
                json={"hostname": "w1", "limit": 1},
                headers={"Authorization": f"Bearer {service_env['WORKER_API_KEY']}"},
                timeout=10,
            )
        except requests.Timeout:
            pytest.fail(f"no claim answer within 10 s while {WAITS} waits are open")
        latency = time.monotonic() - started
        for thread in threads:
            thread.join(40)
    finally:
        web.stop(timeout=5)
    refused = sorted(took for status, took, _ in answers if status == 503)
    figure(
        f"claim latency while {WAITS} run waits are open: {latency * 1000:.0f} ms "
        f"({len(refused)} waits refused 503, the slowest refusal after "
        f"{(refused[-1] if refused else 0) * 1000:.0f} ms)"
    )
    assert claim.status_code == 200
    assert len(claim.json()["workloads"]) == 1
    assert latency < 1.0, latency
    statuses = sorted(status for status, _, _ in answers)
    assert len(answers) == WAITS
    assert set(statuses) <= {200, 503}, answers
    assert 200 in statuses
    assert all(took < CAP_SECONDS + 3 for status, took, _ in answers if status == 200), answers
    assert all(retry == "4" for status, _, retry in answers if status == 503), answers
