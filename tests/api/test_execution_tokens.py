"""Invariant 12: a worker token is valid for one try of one TI.

A token carries the try it was issued for (`try` claim). After a retry, the token of try 1 must
not start, heartbeat, succeed, fail, retry or reschedule try 2 (409 `stale_try`, nothing
written); a token forged with another key is refused (403); the replay rule still holds within
one try.
"""

import time

import jwt
import pytest
from django.conf import settings

from assets_app.api import auth
from assets_app.models import AssetEvent, AssetEventQueue, TaskInstance, TIState
from tests.factories import TaskInstanceFactory

from .snapshots import db_snapshot

pytestmark = pytest.mark.django_db

END = "2026-06-30T10:05:00+00:00"
RUN = {
    "state": "running",
    "hostname": "host-2",
    "unixname": "airflow",
    "pid": 2,
    "start_date": "2026-06-30T10:00:00+00:00",
}
OUTLETS = [{"name": "orders", "uri": "s3://b/orders", "type": "Asset"}]
SUCCESS = {"state": "success", "end_date": END, "task_outlets": OUTLETS, "outlet_events": []}


def call(worker_api, method, ti, suffix, body, token):
    return worker_api.request(method, f"/task-instances/{ti.id}/{suffix}", body, token=token)


def retried_ti():
    """A TI whose try 1 (token `first`) asked for a retry: it is queued at try 2."""
    ti = TaskInstanceFactory(running=True, max_tries=2)
    first = auth.issue_token(ti.id, try_number=1)
    return ti, first


def retry(worker_api, ti, token):
    body = {"state": "up_for_retry", "end_date": END, "retry_delay_seconds": 600}
    return call(worker_api, "PATCH", ti, "state", body, token)


def assert_stale(response, *, token_try=1, current_try=2):
    assert response.status_code == 409, response.content
    detail = response.json()["detail"]
    assert detail["reason"] == "stale_try"
    assert (detail["token_try_number"], detail["current_try_number"]) == (token_try, current_try)
    assert "stale" in detail["message"]


def test_a_token_forged_with_another_key_is_403_and_changes_nothing(worker_api):
    ti = TaskInstanceFactory()
    claims = {"sub": str(ti.id), "try": 1, "scope": "execution", "exp": int(time.time()) + 60}
    forged = jwt.encode(claims, "a-published-default-key-of-the-repository", algorithm="HS256")
    before = db_snapshot()
    response = call(worker_api, "PATCH", ti, "run", RUN, forged)
    assert response.status_code == 403
    assert response.json()["detail"]["reason"] == "invalid_token"
    assert db_snapshot() == before


def test_a_token_without_a_try_is_refused(worker_api):
    ti = TaskInstanceFactory()
    claims = {"sub": str(ti.id), "scope": "execution", "exp": int(time.time()) + 60}
    old_style = jwt.encode(claims, settings.SECRET_KEY, algorithm="HS256")
    before = db_snapshot()
    response = call(worker_api, "PATCH", ti, "run", RUN, old_style)
    assert response.status_code == 403
    assert response.json()["detail"]["reason"] == "invalid_token"
    assert db_snapshot() == before


def test_the_token_of_try_1_cannot_start_try_2(worker_api):
    ti, first = retried_ti()
    assert retry(worker_api, ti, first).status_code == 204
    before = db_snapshot()

    # It would skip the retry delay and the claim.
    assert_stale(call(worker_api, "PATCH", ti, "run", RUN, first))

    assert db_snapshot() == before
    assert TaskInstance.objects.get(id=ti.id).state == TIState.QUEUED


@pytest.mark.parametrize("mode", ["queue", "inline"])
def test_the_token_of_try_1_changes_nothing_of_a_running_try_2(worker_api, settings, mode):
    settings.ASSET_REGISTRATION_MODE = mode
    ti, first = retried_ti()
    assert retry(worker_api, ti, first).status_code == 204
    second = auth.issue_token(ti.id, try_number=2)
    started = call(worker_api, "PATCH", ti, "run", RUN, second)
    assert started.status_code == 200, started.content
    before = db_snapshot()

    heartbeat = {"hostname": "host-2", "pid": 2}
    assert_stale(call(worker_api, "PUT", ti, "heartbeat", heartbeat, first))
    assert_stale(call(worker_api, "PATCH", ti, "state", SUCCESS, first))
    assert_stale(
        call(worker_api, "PATCH", ti, "state", {"state": "failed", "end_date": END}, first)
    )
    assert_stale(retry(worker_api, ti, first))
    reschedule = {"state": "up_for_reschedule", "reschedule_date": END, "end_date": END}
    assert_stale(call(worker_api, "PATCH", ti, "state", reschedule, first))
    skip = {"tasks": ["other"]}
    assert_stale(call(worker_api, "PATCH", ti, "skip-downstream", skip, first))
    assert_stale(worker_api.request("GET", "/assets/by-name", token=first, name="orders"))

    assert db_snapshot() == before
    # try 2's own calls go through: its success is registered (not answered as a replay).
    assert call(worker_api, "PUT", ti, "heartbeat", heartbeat, second).status_code == 204
    assert call(worker_api, "PATCH", ti, "state", SUCCESS, second).status_code == 204
    if mode == "queue":
        assert AssetEventQueue.objects.get().try_number == 2
    else:
        assert AssetEvent.objects.get().source_try_number == 2


@pytest.mark.parametrize("mode", ["queue", "inline"])
def test_a_replay_is_idempotent_within_a_try_and_stale_across_tries(worker_api, settings, mode):
    settings.ASSET_REGISTRATION_MODE = mode
    ti, first = retried_ti()
    assert retry(worker_api, ti, first).status_code == 204
    second = auth.issue_token(ti.id, try_number=2)
    assert call(worker_api, "PATCH", ti, "run", RUN, second).status_code == 200
    assert call(worker_api, "PATCH", ti, "state", SUCCESS, second).status_code == 204
    before = db_snapshot()

    replay = call(worker_api, "PATCH", ti, "state", SUCCESS, second)
    assert replay.status_code == 200
    # try 1's success arriving after try 2 succeeded is not a "replay" of try 2.
    assert_stale(call(worker_api, "PATCH", ti, "state", SUCCESS, first))

    assert db_snapshot() == before


def test_tokens_handed_out_carry_the_try(worker_api):
    ti = TaskInstanceFactory(try_number=3)
    claimed = worker_api.request(
        "POST",
        "/workloads/claim",
        {"hostname": "h", "limit": 1},
        token=settings.WORKER_API_KEY,
    )
    (workload,) = claimed.json()["workloads"]
    assert auth.try_of(auth.decode_token(workload["token"])) == 3

    started = call(worker_api, "PATCH", ti, "run", RUN, workload["token"])
    assert started.status_code == 200
    refreshed = started["Refreshed-API-Token"]
    assert auth.try_of(auth.decode_token(refreshed)) == 3
    beat = call(worker_api, "PUT", ti, "heartbeat", {"hostname": "host-2", "pid": 2}, refreshed)
    assert auth.try_of(auth.decode_token(beat["Refreshed-API-Token"])) == 3
