"""`GET /api/v2/eventLogs[/{event_log_id}]` (Airflow 3.3.2's event log) from the audit trail:
fields, Airflow's filters and order, Airflow's 404, and a plain load that does not count a big
trail (invariant 20)."""

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from assets_app.api.public_auth import create_api_token
from assets_app.catalog import event_logs
from assets_app.models import AuditEntry
from assets_app.operations import audit

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 1, tzinfo=UTC)


@pytest.fixture
def api() -> Client:
    get_user_model().objects.create_user("ops", password="pw", is_staff=True, is_superuser=True)
    _, key = create_api_token(username="ops", name="test")
    return Client(headers={"Authorization": f"Bearer {key}"})


def _trail() -> list[AuditEntry]:
    AuditEntry.objects.all().delete()  # the token's own creation
    alice = audit.Actor(name="alice", via="api", user_id=None)
    entries = [
        audit.record(
            actor=alice,
            action="trigger_run",
            summary="triggered r1",
            dag_id="daily",
            detail={"run_id": "r1"},
        ),
        audit.record(
            actor=audit.Actor.of_task("0191e2a0-0000-7000-8000-000000000001", try_number=2),
            action="set_state",
            summary="state store",
            dag_id="daily",
            detail={"task_id": "extract", "map_index": 3, "run_id": "r1"},
        ),
        audit.record(actor=audit.Actor.os_user(), action="sync_dags", summary="synced"),
    ]
    for i, entry in enumerate(entries):
        AuditEntry.objects.filter(pk=entry.pk).update(at=T0 + timedelta(hours=i))
    return entries


def test_an_entry_reads_as_airflows_log_row(api):
    trigger, task, _ = _trail()
    body = api.get(f"/api/v2/eventLogs/{trigger.pk}").json()
    assert body == {
        "event_log_id": trigger.pk,
        "when": "2026-03-01T00:00:00Z",
        "dag_id": "daily",
        "task_id": None,
        "run_id": "r1",
        "map_index": None,
        "try_number": None,
        "event": "trigger_run",
        "logical_date": None,
        "owner": "alice",
        "extra": json.dumps(
            {"detail": {"run_id": "r1"}, "summary": "triggered r1", "via": "api"}, sort_keys=True
        ),
        "dag_display_name": "daily",
        "task_display_name": None,
    }
    body = api.get(f"/api/v2/eventLogs/{task.pk}").json()
    assert (body["task_id"], body["map_index"], body["try_number"]) == ("extract", 3, 2)
    assert body["owner"].startswith("task instance ")


def test_a_missing_entry_is_airflows_404(api):
    response = api.get("/api/v2/eventLogs/999999")
    assert response.status_code == 404
    assert response.json()["detail"]["message"] == "The Event Log with id: `999999` not found"


def test_filters_and_order_as_airflow(api):
    trigger, task, sync = _trail()

    def ids(**params):
        response = api.get("/api/v2/eventLogs", params)
        assert response.status_code == 200, response.content
        return [e["event_log_id"] for e in response.json()["event_logs"]]

    assert ids() == [trigger.pk, task.pk, sync.pk]  # Airflow's default: the id
    assert ids(order_by="-when") == [sync.pk, task.pk, trigger.pk]
    assert ids(dag_id="daily", order_by="-id") == [task.pk, trigger.pk]
    assert ids(task_id="extract") == [task.pk]
    assert ids(run_id="r1", map_index=3, try_number=2) == [task.pk]
    assert ids(owner="alice") == [trigger.pk]
    assert ids(event="sync_dags") == [sync.pk]
    assert ids(included_events=["sync_dags", "set_state"]) == [task.pk, sync.pk]
    assert ids(excluded_events=["sync_dags"]) == [trigger.pk, task.pk]
    assert ids(after="2026-03-01T00:00:00Z", before="2026-03-01T02:00:00Z") == [task.pk]
    assert ids(owner_pattern="LIC") == [trigger.pk]
    assert ids(event_prefix_pattern="sync|trig") == [trigger.pk, sync.pk]
    assert ids(task_id_pattern="xtr") == [task.pk]
    assert ids(limit=1, offset=1) == [task.pk]
    response = api.get("/api/v2/eventLogs", {"order_by": "nope"})
    assert response.status_code == 400
    assert response.json()["detail"]["reason"] == "invalid_order_by"
    assert api.get("/api/v2/eventLogs", {"dag_id": "daily"}).json()["total_entries"] == 2


def test_a_plain_load_of_a_big_trail_takes_the_planners_estimate(monkeypatch):
    """Invariant 20: no COUNT(*) over the whole trail on a plain load; a filtered page counts."""
    _trail()
    monkeypatch.setattr(event_logs.estimates, "estimated_rows", lambda model: 5_000_000)
    with CaptureQueriesContext(connection) as plain:
        page = event_logs.list_event_logs(limit=2)
    assert page.total_entries == 5_000_000 and len(page.rows) == 2
    assert not any("COUNT(" in q["sql"].upper() for q in plain.captured_queries)
    with CaptureQueriesContext(connection) as filtered:
        page = event_logs.list_event_logs(dag_id="daily")
    assert page.total_entries == 2
    assert any("COUNT(" in q["sql"].upper() for q in filtered.captured_queries)
    monkeypatch.setattr(event_logs.estimates, "estimated_rows", lambda model: 10)
    assert event_logs.list_event_logs().total_entries == 3
