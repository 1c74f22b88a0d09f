"""Bad input changes nothing (invariant 10): hand-written cases for both APIs.

Each case sends one malformed request in-process through the whole Django stack and checks the
exact status, the `{"detail": {"reason": ...}}` body, and that the row counts of every table are
unchanged (request metrics excepted: counting rejected requests is their job). Cases that show a
bug are strict xfails naming the bug, so they flip to a failure the day it is fixed.
"""

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from assets_app.api import public_auth
from assets_app.api.auth import issue_token
from assets_app.models import AssetEventQueue, TaskInstance

from .conftest import app_table_counts, make_running_tis, make_scheduled_dag

pytestmark = pytest.mark.django_db(transaction=True)

UNKNOWN_TI = "00000000-0000-4000-8000-000000000000"
NOW = "2026-11-30T08:00:00+00:00"


@pytest.fixture
def world():
    make_scheduled_dag("bad_dag", {"any": ["bad-a"]})
    queued, running = make_running_tis("bad_producer", 2)
    TaskInstance.objects.filter(id=queued.id).update(state="queued")
    user = get_user_model().objects.create_user("bad", password="x", is_staff=True)
    _, key = public_auth.create_api_token(username=user.username, name="bad")
    return {"queued": queued.id, "running": running.id, "api_key": key}


def _send(method, path, *, body=None, raw=None, content_type="application/json", headers=None):
    client = Client(raise_request_exception=False)
    data = raw if raw is not None else (json.dumps(body) if body is not None else None)
    kwargs = {"content_type": content_type} if data is not None else {}
    return getattr(client, method)(path, data=data, headers=headers or {}, **kwargs)


def _assert_rejected(response, status: int, before: dict, reason: str | None = None) -> str:
    assert response.status_code == status, response.content[:500]
    detail = json.loads(response.content)["detail"]
    assert isinstance(detail["reason"], str) and isinstance(detail["message"], str)
    if reason is not None:
        assert detail["reason"] == reason, detail
    assert app_table_counts() == before
    return detail["reason"]


def _ti(world, which):
    ti_id = world[which]
    return f"/execution/task-instances/{ti_id}", {"Authorization": f"Bearer {issue_token(ti_id)}"}


def _success(**overrides):
    return {
        "state": "success",
        "end_date": NOW,
        "task_outlets": [{"name": "bad-a", "uri": "bad-a", "type": "Asset"}],
        "outlet_events": [],
        **overrides,
    }


def _run(**overrides):
    return {
        "state": "running",
        "hostname": "h",
        "unixname": "u",
        "pid": 1,
        "start_date": NOW,
        **overrides,
    }


# (name, which TI, method, suffix, kwargs for _send, status, reason or None)
WORKER_CASES = [
    ("invalid JSON", "running", "patch", "/state", {"raw": '{"state": "success",'}, 400, None),
    ("JSON array body", "running", "patch", "/state", {"raw": "[1, 2]"}, 422, None),
    (
        "wrong content type",
        "running",
        "patch",
        "/state",
        {"raw": "state=success", "content_type": "application/x-www-form-urlencoded"},
        415,
        "unsupported_media_type",
    ),
    (
        "text/plain JSON",
        "running",
        "patch",
        "/state",
        {"raw": json.dumps(_success()), "content_type": "text/plain"},
        415,
        "unsupported_media_type",
    ),
    ("unknown field", "running", "patch", "/state", {"body": _success(bogus=1)}, 422, None),
    (
        "unknown field in an outlet",
        "running",
        "patch",
        "/state",
        {
            "body": _success(
                task_outlets=[{"name": "bad-a", "uri": "bad-a", "type": "Asset", "x": 1}]
            )
        },
        422,
        None,
    ),
    ("unknown state", "running", "patch", "/state", {"body": _success(state="done")}, 422, None),
    (
        "naive end_date",
        "running",
        "patch",
        "/state",
        {"body": _success(end_date="2026-11-30T08:00:00")},
        422,
        None,
    ),
    (
        "end_date not a date",
        "running",
        "patch",
        "/state",
        {"body": _success(end_date="yesterday")},
        422,
        None,
    ),
    ("negative pid", "queued", "patch", "/run", {"body": _run(pid=-1)}, 422, None),
    ("zero pid", "queued", "patch", "/run", {"body": _run(pid=0)}, 422, None),
    (
        "naive start_date",
        "queued",
        "patch",
        "/run",
        {"body": _run(start_date="2026-11-30")},
        422,
        None,
    ),
    (
        "body over 10 MB",
        "running",
        "patch",
        "/state",
        {"raw": json.dumps(_success(rendered_map_index="x" * 11_000_000))},
        413,
        "request_too_large",
    ),
    (
        "heartbeat negative pid",
        "running",
        "put",
        "/heartbeat",
        {"body": {"hostname": "h", "pid": -3}},
        422,
        None,
    ),
    (
        "success for a queued TI",
        "queued",
        "patch",
        "/state",
        {"body": _success()},
        409,
        "invalid_state",
    ),
]


@pytest.mark.parametrize(
    ("which", "method", "suffix", "kwargs", "status", "reason"),
    [case[1:] for case in WORKER_CASES],
    ids=[case[0] for case in WORKER_CASES],
)
def test_worker_api_rejects_bad_input_and_writes_nothing(
    world, which, method, suffix, kwargs, status, reason
):
    path, headers = _ti(world, which)
    before = app_table_counts()
    response = _send(method, path + suffix, headers=headers, **kwargs)
    _assert_rejected(response, status, before, reason)
    assert TaskInstance.objects.get(id=world[which]).state == which


def test_unknown_ti_is_404_and_non_uuid_is_422(world):
    before = app_table_counts()
    headers = {"Authorization": f"Bearer {issue_token(UNKNOWN_TI)}"}
    response = _send(
        "patch", f"/execution/task-instances/{UNKNOWN_TI}/state", body=_success(), headers=headers
    )
    _assert_rejected(response, 404, before)
    response = _send(
        "patch", f"/execution/task-instances/{UNKNOWN_TI}/run", body=_run(), headers=headers
    )
    _assert_rejected(response, 404, before)
    for bad in ("not-a-uuid", "1234", "00000000-0000-4000-8000-00000000000Z"):
        response = _send(
            "patch", f"/execution/task-instances/{bad}/state", body=_success(), headers=headers
        )
        _assert_rejected(response, 422, before)


def test_non_utc_datetimes_are_accepted_and_stored_as_the_same_instant(world):
    """+05:30 and -08:00 offsets are valid ISO 8601 with a time zone: accepted, same instant."""
    path, headers = _ti(world, "queued")
    start = datetime(2026, 11, 30, 13, 30, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    response = _send(
        "patch", path + "/run", body=_run(start_date=start.isoformat()), headers=headers
    )
    assert response.status_code == 200, response.content[:300]
    end = datetime(2026, 11, 30, 0, 15, tzinfo=timezone(timedelta(hours=-8)))
    response = _send(
        "patch", path + "/state", body=_success(end_date=end.isoformat()), headers=headers
    )
    assert response.status_code == 204, response.content[:300]
    ti = TaskInstance.objects.get(id=world["queued"])
    assert ti.start_date == datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
    assert ti.end_date == datetime(2026, 11, 30, 8, 15, tzinfo=UTC)


def _deep(levels: int) -> str:
    return '{"a": ' * levels + "1" + "}" * levels


def test_public_api_rejects_bad_input_and_writes_nothing(world):
    auth = {"Authorization": f"Bearer {world['api_key']}"}
    before = app_table_counts()
    cases = [
        ({"raw": '{"name": "bad-a"'}, 400),
        ({"body": {"name": "bad-a", "extra": {}, "bogus": True}}, 422),
        ({"body": {"name": "bad-a", "extra": "not an object"}}, 422),
        ({"body": {"name": "n" * 1501}}, 422),
        ({"body": {"name": "no-such-asset"}}, 404),
        ({"body": {"asset_id": 2**70}}, 404),
    ]
    for kwargs, status in cases:
        response = _send("post", "/api/v2/assets/events", headers=auth, **kwargs)
        _assert_rejected(response, status, before)
    response = _send(
        "post", "/api/v2/dags/bad_dag/dagRuns", headers=auth, body={"logical_date": "2026-01-01"}
    )
    _assert_rejected(response, 422, before)
    response = _send("post", "/api/v2/dags/no_such_dag/dagRuns", headers=auth, body={})
    _assert_rejected(response, 404, before)


def test_deep_json_nesting_in_extra_is_a_4xx_not_a_crash(world):
    """10,000 levels of nesting in `extra` (the public event API and a worker's outlet event)."""
    auth = {"Authorization": f"Bearer {world['api_key']}"}
    before = app_table_counts()
    raw = '{"name": "bad-a", "extra": ' + _deep(10_000) + "}"
    response = _send("post", "/api/v2/assets/events", headers=auth, raw=raw)
    reason = _assert_rejected(response, response.status_code, before)
    assert 400 <= response.status_code < 500, reason
    path, headers = _ti(world, "running")
    raw = (
        json.dumps(_success())[:-1]
        + ', "rendered_map_index": null, "outlet_events": ['
        + (
            '{"dest_asset_key": {"name": "bad-a", "uri": "bad-a"}, "extra": '
            + _deep(10_000)
            + "}]}"
        )
    )
    raw = raw.replace('"outlet_events": [], ', "", 1)
    response = _send("patch", path + "/state", headers=headers, raw=raw)
    assert 400 <= response.status_code < 500, response.content[:300]
    _assert_rejected(response, response.status_code, before)
    assert not AssetEventQueue.objects.exists()


def _strict_bug(reason: str):
    return pytest.mark.xfail(strict=True, reason=f"BUG: {reason}")


NUL_BUG = (
    "PostgreSQL refuses NUL in text and \\u0000 in jsonb; the APIs pass such strings through "
    "and the DataError becomes a 500. Fix in one place: ApiRequestGuardMiddleware "
    "(assets_app/api/middleware.py) answers 422 reason 'invalid_characters' when the path, "
    "query string or a JSON string/key contains NUL"
)


DATETIME_BUG = (
    "AwareDatetime accepts offsets up to +-23:59 and instants outside years 1..9999 in UTC. "
    "PostgreSQL refuses offsets beyond 15:59 (DataError -> 500), and stores 0001-01-01T00:00+14:00 "
    "as a year-1-BC instant that Python cannot read back: the run is created (200) and every "
    "later read of it fails. Fix: one shared pydantic type in api/schemas.py and "
    "api/public_schemas.py that converts to UTC and turns OverflowError / offsets >= 16 h into "
    "a validation error (422)"
)


def _success_on_running_ti(world, body):
    path, headers = _ti(world, "running")
    return _send("patch", path + "/state", headers=headers, body=body)


BUG_CASES = [
    pytest.param(
        lambda w: _send(
            "patch", _ti(w, "queued")[0] + "/run", headers=_ti(w, "queued")[1], body=_run(pid=2**31)
        ),
        id="pid beyond int32",
        marks=_strict_bug(
            "TIEnterRunningPayload/TIHeartbeatInfo.pid has no upper bound "
            "(assets_app/api/schemas.py): 2**31 is 'integer out of range', a 500; "
            "add le=2**31 - 1"
        ),
    ),
    pytest.param(
        lambda w: _send(
            "patch",
            _ti(w, "queued")[0] + "/run",
            headers=_ti(w, "queued")[1],
            body=_run(hostname="h" * 1001),
        ),
        id="hostname over 1000 chars",
        marks=_strict_bug(
            "TIEnterRunningPayload.hostname/unixname (and TIHeartbeatInfo.hostname) "
            "have no max_length while the columns are varchar(1000): a 500; add "
            "max_length=1000"
        ),
    ),
    pytest.param(
        lambda w: _success_on_running_ti(
            w, _success(task_outlets=[{"name": "n" * 1501, "uri": "n" * 1501, "type": "Asset"}])
        ),
        id="outlet name over 1500 chars",
        marks=_strict_bug(
            "AssetProfile.name/uri have no max_length: the success is accepted "
            "(204) and its outbox row can never register (varchar(1500)), so it "
            "is parked after ASSET_QUEUE_MAX_ATTEMPTS; add max_length=1500 "
            "(ASSET_KEY_MAX_LENGTH) so the worker gets a 422"
        ),
    ),
    pytest.param(
        lambda w: _send(
            "patch",
            _ti(w, "queued")[0] + "/run",
            headers=_ti(w, "queued")[1],
            body=_run(hostname="a\u0000b"),
        ),
        id="NUL in hostname",
        marks=_strict_bug(NUL_BUG),
    ),
    pytest.param(
        lambda w: _send(
            "post",
            "/api/v2/assets/events",
            headers={"Authorization": f"Bearer {w['api_key']}"},
            body={"name": "bad-a", "extra": {"k": "\u0000"}},
        ),
        id="NUL in event extra",
        marks=_strict_bug(NUL_BUG),
    ),
    pytest.param(
        lambda w: _success_on_running_ti(
            w,
            _success(
                outlet_events=[
                    {"dest_asset_key": {"name": "bad-a", "uri": "bad-a"}, "extra": {"k": "\x00"}}
                ]
            ),
        ),
        id="NUL in a success's outlet event extra",
        marks=_strict_bug(NUL_BUG),
    ),
    pytest.param(
        lambda w: _send(
            "get",
            "/api/v2/assets/events?source_dag_id=%00",
            headers={"Authorization": f"Bearer {w['api_key']}"},
        ),
        id="NUL in query string",
        marks=_strict_bug(NUL_BUG),
    ),
    pytest.param(
        lambda w: _success_on_running_ti(w, _success(end_date="2026-11-30T08:00:00+21:58")),
        id="end_date offset beyond PostgreSQL's 15:59",
        marks=_strict_bug(DATETIME_BUG),
    ),
    pytest.param(
        lambda w: _send(
            "post",
            "/api/v2/dags/bad_dag/dagRuns",
            headers={"Authorization": f"Bearer {w['api_key']}"},
            body={"logical_date": "0001-01-01T00:00:00+14:00"},
        ),
        id="logical_date before year 1 in UTC",
        marks=_strict_bug(DATETIME_BUG),
    ),
    pytest.param(
        lambda w: _send(
            "get",
            "/api/v2/assets/events?offset=99999999999999999999",
            headers={"Authorization": f"Bearer {w['api_key']}"},
        ),
        id="offset beyond bigint",
        marks=_strict_bug(
            "AssetEventFilters.offset (assets_app/api/public_schemas.py) has no "
            "upper bound: OFFSET beyond bigint is a DataError, a 500; add "
            "le=2**31 - 1"
        ),
    ),
]


@pytest.mark.parametrize("send", BUG_CASES)
def test_known_bad_input_bugs_are_4xx_and_write_nothing(world, send):
    before = app_table_counts()
    response = send(world)
    assert 400 <= response.status_code < 500, response.status_code
    _assert_rejected(response, response.status_code, before)
