"""Invariants 3 and 4 on every write path a client retries (issue 50): each write, performed
once and then replayed exactly (same token, same body, same key), answers the replay as
documented and writes nothing: the row count of every table of the app is unchanged (and, for
the TI state paths, which promise "writes nothing", every row of every table).

Documented replay answers (README "Worker API" and "Public API", the modules' docstrings):
- a TI state that is already the state asked for (same try): 200 (`task_state`: success,
  failed, skipped, deferred, awaiting_input; a start from the same host and pid);
- up_for_retry: the TI is queued at the next try, so a replay of the earlier try's token is
  409 `stale_try`; up_for_reschedule: the TI is queued again, so the replay is 409
  `invalid_state` (`retries` module);
- an XCom push, rendered fields, a state-store value, a Variable, skip-downstream: the same
  value again (one row, as before: 201/204);
- a log chunk: `duplicate: true` (idempotent by TI, try and offset);
- the worker's HITL request: 201, the request kept;
- a public asset event with the same `Idempotency-Key`: 200 and the first event;
- a run triggered again with the same run id (public API or from a task): 409; a backfill
  created again while the first is unfinished: 409.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.test import Client

from assets_app.api import auth
from assets_app.api.public_auth import create_api_token
from assets_app.definitions import sync as definitions
from assets_app.models import Dag
from tests.factories import AssetFactory, DagFactory, TaskInstanceFactory

from .snapshots import every_row, row_counts

pytestmark = pytest.mark.django_db

END = "2026-06-30T10:05:00+00:00"
LATER = "2036-06-30T10:05:00+00:00"
OUTLETS = [{"name": "orders", "uri": "s3://b/orders", "type": "Asset"}]
MOMENT = {
    "__classname__": "pendulum.datetime.DateTime",
    "__version__": 2,
    "__data__": {"timestamp": 1780000000.0, "tz": "UTC"},
}


@dataclass
class World:
    ti: Any
    token: str
    worker: Any
    api: Client


@dataclass(frozen=True)
class Write:
    call: Callable[[World], Any]
    status: int
    reason: str | None = None  # the replay's `detail.reason`, when it is refused
    strict: bool = False  # every row unchanged, not only the counts
    audited: bool = False  # each call is one more audit entry (the only rows it adds)
    mode: str = "queue"


def state(body: dict[str, Any]) -> Callable[[World], Any]:
    def call(w: World):
        path = f"/task-instances/{w.ti.id}/state"
        return w.worker.request("PATCH", path, body, token=w.token)

    return call


def worker(method: str, path: str, body: Any = None) -> Callable[[World], Any]:
    def call(w: World):
        filled = path.format(ti=w.ti.id, dag=w.ti.dag_id, run=w.ti.run_id)
        return w.worker.request(method, filled, body, token=w.token)

    return call


def log_chunk(w: World):
    return w.worker.request(
        "PUT",
        f"/task-instances/{w.ti.id}/logs/1",
        {"offset": 0, "content": "line 1\n"},
        token=django_settings.WORKER_API_KEY,
    )


def hitl_request(w: World):
    body = {
        "ti_id": str(w.ti.id),
        "options": ["Approve", "Reject"],
        "subject": "Ship it?",
        "params": {},
        "assigned_users": [],
    }
    return w.worker.request("POST", f"/hitlDetails/{w.ti.id}", body, token=w.token)


def public(path: str, body: dict[str, Any], **headers: str) -> Callable[[World], Any]:
    def call(w: World):
        return w.api.post(
            path, data=json.dumps(body), content_type="application/json", headers=headers
        )

    return call


def backfill(w: World):
    document = {
        "dag_id": "daily",
        "timetable": {"kind": "cron_trigger", "cron": "@daily"},
        "start_date": "2026-01-01T00:00:00Z",
        "tasks": [{"task_id": "t"}],
    }
    if not Dag.objects.filter(dag_id="daily").exists():
        definitions.sync_documents(documents=[("daily.json", document)])
    body = {
        "dag_id": "daily",
        "from_date": "2026-01-01T00:00:00Z",
        "to_date": "2026-01-03T00:00:00Z",
    }
    return public("/api/v2/backfills", body)(w)


WRITES = {
    "start": Write(
        worker(
            "PATCH",
            "/task-instances/{ti}/run",
            {"state": "running", "hostname": "h", "unixname": "u", "pid": 1, "start_date": END},
        ),
        200,
        strict=True,
    ),
    "success-queue": Write(
        state({"state": "success", "end_date": END, "task_outlets": OUTLETS, "outlet_events": []}),
        200,
        strict=True,
    ),
    "success-inline-outlets": Write(
        state({"state": "success", "end_date": END, "task_outlets": OUTLETS, "outlet_events": []}),
        200,
        strict=True,
        mode="inline",
    ),
    "failed": Write(state({"state": "failed", "end_date": END}), 200, strict=True),
    "skipped": Write(state({"state": "skipped", "end_date": END}), 200, strict=True),
    "up_for_retry": Write(
        state({"state": "up_for_retry", "end_date": END, "retry_delay_seconds": 60}),
        409,
        "stale_try",
        strict=True,
    ),
    "up_for_reschedule": Write(
        state({"state": "up_for_reschedule", "reschedule_date": LATER, "end_date": END}),
        409,
        "invalid_state",
        strict=True,
    ),
    "deferred": Write(
        state(
            {
                "state": "deferred",
                "classpath": "airflow.providers.standard.triggers.temporal.DateTimeTrigger",
                "trigger_kwargs": {"moment": MOMENT, "end_from_trigger": False},
                "trigger_timeout": "PT1H",
                "next_method": "execute_complete",
                "next_kwargs": {},
            }
        ),
        200,
        strict=True,
    ),
    "awaiting_input": Write(
        state(
            {"state": "awaiting_input", "timeout": "PT1H", "next_method": "m", "next_kwargs": {}}
        ),
        200,
        strict=True,
    ),
    "xcom-push": Write(worker("POST", "/xcoms/{dag}/{run}/produce/k", {"x": 1}), 201),
    "rtif": Write(worker("PUT", "/task-instances/{ti}/rtif", {"cmd": "echo 1"}), 201),
    "state-store": Write(worker("PUT", "/store/ti/{ti}/k", {"value": 1}), 204),
    # A Variable PUT is a set (last writer wins), not a write with a replay key: the value is
    # the same row again, and its audit trail records each call (who set it, when).
    "variable": Write(worker("PUT", "/variables/v", {"val": "x"}), 201, audited=True),
    "skip-downstream": Write(
        worker("PATCH", "/task-instances/{ti}/skip-downstream", {"tasks": ["downstream"]}), 204
    ),
    "log-chunk": Write(log_chunk, 200),
    "hitl-request": Write(hitl_request, 201),
    "trigger-from-task": Write(
        worker("POST", "/dag-runs/target/manual__replayed", {"conf": {}}), 409
    ),
    "public-asset-event": Write(
        public(
            "/api/v2/assets/events",
            {"name": "orders", "extra": {"n": 1}},
            **{"Idempotency-Key": "k1"},
        ),
        200,
    ),
    "public-trigger": Write(
        public("/api/v2/dags/target/dagRuns", {"dag_run_id": "manual__1", "logical_date": None}),
        409,
    ),
    "public-backfill": Write(backfill, 409),
}


@pytest.fixture
def world(worker_api):
    ti = TaskInstanceFactory(running=True, max_tries=2, task_id="produce", hostname="h", pid=1)
    ti.unixname = "u"
    ti.save()
    TaskInstanceFactory(dag_run=ti.dag_run, task_id="downstream")
    DagFactory(dag_id="target", is_paused=False)
    AssetFactory(name="orders", uri="s3://b/orders")
    get_user_model().objects.create_user("ops", password="pw", is_staff=True, is_superuser=True)
    _, key = create_api_token(username="ops", name="test")
    api = Client(headers={"Authorization": f"Bearer {key}"})
    return World(ti=ti, token=auth.issue_token(ti.id, try_number=1), worker=worker_api, api=api)


@pytest.mark.parametrize("name", list(WRITES))
def test_every_replay_of_every_write_answers_without_writing(world, settings, name):
    write = WRITES[name]
    settings.ASSET_REGISTRATION_MODE = write.mode
    first = write.call(world)
    assert first.status_code < 300, first.content
    counts, rows = row_counts(), every_row()

    replay = write.call(world)

    assert replay.status_code == write.status, replay.content
    if write.reason is not None:
        assert replay.json()["detail"]["reason"] == write.reason, replay.content
    elif replay.status_code < 300 and first.content:
        assert replay.content == first.content or name == "log-chunk", replay.content
    if write.audited:
        for table in ("assets_app.AuditEntry", "assets_app.AuditTarget"):
            counts[table] += 1
    assert row_counts() == counts
    if write.strict:
        assert every_row() == rows
    if name == "log-chunk":
        assert replay.json()["duplicate"] is True
