"""Bad input changes nothing (invariant 10): hand-written cases for both APIs.

Each case sends one malformed request in-process through the whole Django stack and checks the
exact status, the `{"detail": {"reason": ...}}` body, and that the row counts of every table are
unchanged (request metrics excepted: counting rejected requests is their job). The values that
PostgreSQL cannot store (integers beyond the columns, over-long strings, NUL, lone surrogates,
NaN/Infinity, datetimes outside what timestamptz and Python share) were 500s or parked outbox rows
when first pinned here; they now have exact cases in STORAGE_LIMIT_CASES, and the values right at
the limits are checked to still go through.
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
    user = get_user_model().objects.create_user(
        "bad", password="x", is_staff=True, is_superuser=True
    )
    _, key = public_auth.create_api_token(username=user.username, name="bad")
    return {"queued": queued.id, "running": running.id, "api_key": key}


def _send(method, path, *, body=None, raw=None, content_type="application/json", headers=None):
    client = Client(raise_request_exception=False)
    data = raw if raw is not None else (json.dumps(body) if body is not None else None)
    kwargs = {"content_type": content_type} if data is not None else {}
    return getattr(client, method)(path, data=data, headers=headers or {}, **kwargs)


def _reason(response) -> tuple[str, str]:
    """(reason, message) of an error body: `{"detail": {"reason", "message"}}`, or for a 422 of
    the public API Airflow's HTTPValidationError `{"detail": [{"type", "loc", "msg", "ctx"}]}`:
    a domain error's reason is in `ctx.reason`, a schema error is "validation_error"."""
    detail = json.loads(response.content)["detail"]
    if isinstance(detail, list):
        assert detail and all(isinstance(item["loc"], list) for item in detail), detail
        first = detail[0]
        return first.get("ctx", {}).get("reason", "validation_error"), first["msg"]
    return detail["reason"], detail["message"]


def _assert_rejected(response, status: int, before: dict, reason: str | None = None) -> str:
    assert response.status_code == status, response.content[:500]
    found, message = _reason(response)
    assert isinstance(found, str) and isinstance(message, str)
    if reason is not None:
        assert found == reason, json.loads(response.content)
    assert app_table_counts() == before
    return found


def _ti(world, which):
    ti_id = world[which]
    return f"/execution/task-instances/{ti_id}", {
        "Authorization": f"Bearer {issue_token(ti_id, try_number=1)}"
    }


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
    headers = {"Authorization": f"Bearer {issue_token(UNKNOWN_TI, try_number=1)}"}
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


def _success_on_running_ti(world, body=None, raw=None):
    path, headers = _ti(world, "running")
    return _send("patch", path + "/state", headers=headers, body=body, raw=raw)


def _run_on_queued_ti(world, body):
    path, headers = _ti(world, "queued")
    return _send("patch", path + "/run", headers=headers, body=body)


def _heartbeat(world, body):
    path, headers = _ti(world, "running")
    return _send("put", path + "/heartbeat", headers=headers, body=body)


def _public(world, method, path, **kwargs):
    headers = {"Authorization": f"Bearer {world['api_key']}", **kwargs.pop("headers", {})}
    return _send(method, path, headers=headers, **kwargs)


def _event_with_raw_extra(extra: str) -> str:
    return '{"name": "bad-a", "extra": {"k": ' + extra + "}}"


# Inputs PostgreSQL cannot store (they were 500s, or accepted successes whose outbox rows could
# only be parked): each is a 4xx with its reason, and writes nothing.
# (name, send, status, reason)
STORAGE_LIMIT_CASES = [
    # integers beyond the int32 / bigint columns and OFFSET
    ("pid beyond int32", lambda w: _run_on_queued_ti(w, _run(pid=2**31)), 422, "validation_error"),
    (
        "heartbeat pid beyond int32",
        lambda w: _heartbeat(w, {"hostname": "h", "pid": 2**31}),
        422,
        "validation_error",
    ),
    (
        "offset beyond bigint",
        lambda w: _public(w, "get", "/api/v2/assets/events?offset=99999999999999999999"),
        422,
        "validation_error",
    ),
    (
        "retry delay beyond the datetime range",
        lambda w: _success_on_running_ti(
            w, {"state": "up_for_retry", "end_date": NOW, "retry_delay_seconds": 1e20}
        ),
        422,
        "validation_error",
    ),
    # strings longer than their varchar columns
    (
        "hostname over 1000 chars",
        lambda w: _run_on_queued_ti(w, _run(hostname="h" * 1001)),
        422,
        "validation_error",
    ),
    (
        "unixname over 1000 chars",
        lambda w: _run_on_queued_ti(w, _run(unixname="u" * 1001)),
        422,
        "validation_error",
    ),
    (
        "heartbeat hostname over 1000 chars",
        lambda w: _heartbeat(w, {"hostname": "h" * 1001, "pid": 1}),
        422,
        "validation_error",
    ),
    (
        "outlet name over 1500 chars",
        lambda w: _success_on_running_ti(
            w, _success(task_outlets=[{"name": "n" * 1501, "uri": "n" * 1501, "type": "Asset"}])
        ),
        422,
        "validation_error",
    ),
    (
        "outlet alias name over 1500 chars",
        lambda w: _success_on_running_ti(
            w, _success(task_outlets=[{"name": "a" * 1501, "type": "AssetAlias"}])
        ),
        422,
        "validation_error",
    ),
    (
        "outlet event asset name over 1500 chars",
        lambda w: _success_on_running_ti(
            w,
            _success(
                outlet_events=[
                    {"source_alias_name": "x", "dest_asset_key": {"name": "n" * 1501, "uri": "u"}}
                ]
            ),
        ),
        422,
        "validation_error",
    ),
    (
        "event uri over 1500 chars",
        lambda w: _public(w, "post", "/api/v2/assets/events", body={"uri": "u" * 1501}),
        422,
        "validation_error",
    ),
    (
        "dag_run_id over 250 chars",
        lambda w: _public(
            w, "post", "/api/v2/dags/bad_dag/dagRuns", body={"dag_run_id": "r" * 251}
        ),
        422,
        "validation_error",
    ),
    # NUL characters, anywhere (middleware)
    (
        "NUL in hostname",
        lambda w: _run_on_queued_ti(w, _run(hostname="a\u0000b")),
        422,
        "invalid_characters",
    ),
    (
        "NUL in event extra",
        lambda w: _public(
            w, "post", "/api/v2/assets/events", body={"name": "bad-a", "extra": {"k": "\u0000"}}
        ),
        422,
        "invalid_characters",
    ),
    (
        "NUL in a JSON key",
        lambda w: _public(
            w, "post", "/api/v2/assets/events", body={"name": "bad-a", "extra": {"\u0000": 1}}
        ),
        422,
        "invalid_characters",
    ),
    (
        "NUL after an escaped backslash",
        lambda w: _public(
            w, "post", "/api/v2/assets/events", raw=_event_with_raw_extra(r'"\\\u0000"')
        ),
        422,
        "invalid_characters",
    ),
    (
        "NUL in a success's outlet event extra",
        lambda w: _success_on_running_ti(
            w,
            _success(
                outlet_events=[
                    {"dest_asset_key": {"name": "bad-a", "uri": "bad-a"}, "extra": {"k": "\x00"}}
                ]
            ),
        ),
        422,
        "invalid_characters",
    ),
    (
        "NUL in query string",
        lambda w: _public(w, "get", "/api/v2/assets/events?source_dag_id=%00"),
        422,
        "invalid_characters",
    ),
    (
        "NUL in path",
        lambda w: _public(w, "get", "/api/v2/dags/a%00b/assets/queuedEvents"),
        422,
        "invalid_characters",
    ),
    (
        "NUL in Idempotency-Key",
        lambda w: _public(
            w,
            "post",
            "/api/v2/assets/events",
            body={"name": "bad-a"},
            headers={"Idempotency-Key": "a\x00b"},
        ),
        422,
        "invalid_characters",
    ),
    (
        "UTF-16 JSON body",
        lambda w: _public(
            w, "post", "/api/v2/assets/events", raw='{"name": "bad-a"}'.encode("utf-16")
        ),
        422,
        "invalid_characters",
    ),
    # JSON that jsonb cannot hold (parser)
    (
        "lone surrogate in event extra",
        lambda w: _public(
            w, "post", "/api/v2/assets/events", raw=_event_with_raw_extra(r'"\ud800"')
        ),
        422,
        "invalid_characters",
    ),
    (
        "lone surrogate in an outlet event",
        lambda w: _success_on_running_ti(
            w,
            raw=json.dumps(_success(outlet_events=[{"extra": {"k": "LONE"}}])).replace(
                "LONE", r"\udfff"
            ),
        ),
        422,
        "invalid_characters",
    ),
    (
        "NaN in event extra",
        lambda w: _public(w, "post", "/api/v2/assets/events", raw=_event_with_raw_extra("NaN")),
        400,
        "invalid_json",
    ),
    (
        "Infinity in conf",
        lambda w: _public(
            w, "post", "/api/v2/dags/bad_dag/dagRuns", raw='{"conf": {"a": Infinity}}'
        ),
        400,
        "invalid_json",
    ),
    (
        "1e400 in event extra",
        lambda w: _public(w, "post", "/api/v2/assets/events", raw=_event_with_raw_extra("1e400")),
        400,
        "invalid_json",
    ),
    (
        "raw surrogate bytes (not UTF-8)",
        lambda w: _public(
            w,
            "post",
            "/api/v2/assets/events",
            raw=_event_with_raw_extra('"\xed\xa0\x80"').encode("latin-1"),
        ),
        400,
        "invalid_json",
    ),
    # datetimes PostgreSQL cannot store (UtcDatetime)
    (
        "end_date offset beyond PostgreSQL's 15:59",
        lambda w: _success_on_running_ti(w, _success(end_date="2026-11-30T08:00:00+21:58")),
        422,
        "validation_error",
    ),
    (
        "start_date offset of -16:00",
        lambda w: _run_on_queued_ti(w, _run(start_date="2026-11-30T08:00:00-16:00")),
        422,
        "validation_error",
    ),
    (
        "logical_date before year 1 in UTC",
        lambda w: _public(
            w,
            "post",
            "/api/v2/dags/bad_dag/dagRuns",
            body={"logical_date": "0001-01-01T00:00:00+14:00"},
        ),
        422,
        "validation_error",
    ),
    (
        "run_after after year 9999 in UTC",
        lambda w: _public(
            w,
            "post",
            "/api/v2/dags/bad_dag/dagRuns",
            body={"run_after": "9999-12-31T23:00:00-05:00"},
        ),
        422,
        "validation_error",
    ),
    (
        "asset events window offset beyond 15:59",
        lambda w: _send(
            "get",
            "/execution/asset-events/by-asset?name=bad-a&after=2026-01-01T00:00:00%2B21:00",
            headers=_ti(w, "running")[1],
        ),
        422,
        "validation_error",
    ),
]


@pytest.mark.parametrize(
    ("send", "status", "reason"),
    [case[1:] for case in STORAGE_LIMIT_CASES],
    ids=[case[0] for case in STORAGE_LIMIT_CASES],
)
def test_values_postgresql_cannot_store_are_4xx_and_write_nothing(world, send, status, reason):
    before = app_table_counts()
    response = send(world)
    _assert_rejected(response, status, before, reason)
    assert TaskInstance.objects.get(id=world["queued"]).state == "queued"
    assert TaskInstance.objects.get(id=world["running"]).state == "running"


def test_values_at_the_limits_are_accepted_and_stored(world):
    """The bounds are the columns' own: the longest hostname, the largest pid, a 15:59 offset,
    the longest asset name, an escaped backslash before `u0000` (not a NUL) and a surrogate pair
    all go through."""
    start = "2026-11-30T23:59:00+15:59"
    response = _run_on_queued_ti(
        world, _run(hostname="h" * 1000, unixname="u" * 1000, pid=2**31 - 1, start_date=start)
    )
    assert response.status_code == 200, response.content[:300]
    ti = TaskInstance.objects.get(id=world["queued"])
    assert (len(ti.hostname), len(ti.unixname), ti.pid) == (1000, 1000, 2**31 - 1)
    assert ti.start_date == datetime(2026, 11, 30, 8, 0, tzinfo=UTC)

    long_name = "n" * 1500
    outlet = {"name": long_name, "uri": long_name, "type": "Asset"}
    response = _success_on_running_ti(world, _success(task_outlets=[outlet]))
    assert response.status_code == 204, response.content[:300]
    assert AssetEventQueue.objects.get().payload["outlets"] == [outlet]

    extra = {"backslash": "\\u0000", "emoji": "\U0001f600"}
    response = _public(
        world, "post", "/api/v2/assets/events", body={"name": "bad-a", "extra": extra}
    )
    assert response.status_code == 200, response.content[:300]
    assert json.loads(response.content)["extra"] == {**extra, "from_rest_api": True}
