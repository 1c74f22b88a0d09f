"""Invariant 13: the same nesting limits at every door, and a Dag the scheduler cannot evaluate
is isolated.

- schedule conditions nest at most `limits.MAX_CONDITION_DEPTH` (32) levels: definitions and
  `sync_dags` refuse a deeper one with the file and the JSON path, at 33 levels as at 5,000;
- JSON values (event `extra`, alias events' `dest_asset_extra`, a run's `conf`) nest at most
  `limits.MAX_JSON_DEPTH` (64) levels: the worker API and the public API answer 422 naming the
  field, and a body too deep to parse is a 422 too, never a 500;
- pages and reads of data stored before the limits existed render (no 500);
- a poison Dag next to a healthy one: the healthy one gets its run in the same pass, the poison
  one's error is recorded, shown in the admin and in /healthz, and cleared once it evaluates.
"""

import json
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from assets_app.api import auth
from assets_app.api.public_auth import create_api_token
from assets_app.definitions import sync as definitions
from assets_app.guards import limits
from assets_app.models import Asset, AssetEvent, ComponentHeartbeat, Dag, DagRun
from assets_app.outbox import drain
from assets_app.outbox import rows as outbox
from assets_app.registration import outlets as registration
from assets_app.scheduling import asset_runs as scheduling
from tests.api.snapshots import db_snapshot
from tests.asset_flow import scheduled_dag
from tests.factories import AssetFactory, TaskInstanceFactory

pytestmark = pytest.mark.django_db

END = "2026-06-30T10:05:00+00:00"


def nested_condition(levels: int, leaf: str = "a") -> str:
    """A schedule condition `levels` conditions deep, as JSON text (json.dumps would recurse)."""
    return '{"all": [' * (levels - 1) + json.dumps(leaf) + "]}" * (levels - 1)


def nested_json(levels: int) -> str:
    """A JSON object `levels` levels deep, as text."""
    return '{"k": ' * (levels - 1) + '{"leaf": 1}' + "}" * (levels - 1)


def store_raw_json(model, pk_field: str, pk, column: str, text: str) -> None:
    """Write JSON the way data stored before the limits got there (PostgreSQL parses it)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f'UPDATE "{model._meta.db_table}" SET "{column}" = %s::jsonb WHERE "{pk_field}" = %s',
            [text, pk],
        )


# --- conditions at the definition door --------------------------------------------------------


def test_a_schedule_at_the_condition_limit_is_accepted_and_one_deeper_is_refused_by_path():
    at_limit = f'{{"dag_id": "ok", "schedule": {nested_condition(limits.MAX_CONDITION_DEPTH)}}}'
    (dag,) = definitions.parse_text(at_limit, file="ok.json")
    assert dag.schedule is not None

    deeper = nested_condition(limits.MAX_CONDITION_DEPTH + 1)
    with pytest.raises(definitions.DefinitionError) as refused:
        definitions.parse_text(f'{{"dag_id": "deep", "schedule": {deeper}}}', file="deep.json")
    error = refused.value
    assert error.file == "deep.json"
    assert error.path == "schedule" + ".all[0]" * limits.MAX_CONDITION_DEPTH
    assert "deeper than the 32 levels allowed" in error.message


@pytest.mark.parametrize("levels", [450, 5_000])
def test_sync_dags_refuses_a_deep_schedule_naming_file_and_path_without_a_traceback(
    tmp_path: Path, levels: int
):
    path = tmp_path / "deep.json"
    path.write_text(f'[{{"dag_id": "deep", "schedule": {nested_condition(levels)}}}]')
    before = db_snapshot()

    with pytest.raises(CommandError) as refused:
        call_command("sync_dags", str(path), stdout=StringIO())

    message = str(refused.value)
    assert message.startswith(f"{path}: [0].schedule.all[0].all[0]")
    assert "deeper than" in message and "nothing was written" in message
    assert "Traceback" not in message and "RecursionError" not in message
    assert len(message) < 1_000
    assert db_snapshot() == before
    assert not Dag.objects.exists()


# --- JSON at the worker API door --------------------------------------------------------------


def succeed(ti, extra_text: str):
    body = (
        f'{{"state": "success", "end_date": "{END}", "task_outlets": '
        '[{"name": "o", "uri": "o", "type": "Asset"}], "outlet_events": '
        f'[{{"dest_asset_key": {{"name": "o", "uri": "o"}}, "extra": {extra_text}}}]}}'
    )
    return Client().patch(
        f"/execution/task-instances/{ti.id}/state",
        data=body,
        content_type="application/json",
        headers={"Authorization": f"Bearer {auth.issue_token(ti.id, try_number=ti.try_number)}"},
    )


def test_worker_api_refuses_an_outlet_extra_deeper_than_the_json_limit_naming_it():
    deep = TaskInstanceFactory(running=True)
    before = db_snapshot()
    response = succeed(deep, nested_json(limits.MAX_JSON_DEPTH + 1))
    assert response.status_code == 422, response.content
    detail = response.json()["detail"]
    assert detail["reason"] == "validation_error"
    assert "outlet_events.0" in detail["message"]
    assert "extra.k.k" in detail["message"] and "64 levels" in detail["message"]
    assert db_snapshot() == before

    at_limit = TaskInstanceFactory(running=True)
    assert succeed(at_limit, nested_json(limits.MAX_JSON_DEPTH)).status_code == 204


def test_worker_api_body_too_deep_to_parse_is_a_422_not_a_500():
    ti = TaskInstanceFactory(running=True)
    before = db_snapshot()
    response = succeed(ti, nested_json(5_000))
    assert response.status_code == 422, response.content[:300]
    detail = response.json()["detail"]
    assert detail["reason"] == "too_deep"
    assert "outlet_events[0].extra.k.k" in detail["message"]
    assert db_snapshot() == before


# --- JSON at the public API door --------------------------------------------------------------


@pytest.fixture
def api():
    get_user_model().objects.create_superuser("ops", password="pw")
    _, key = create_api_token(username="ops", name="t")
    return Client(headers={"Authorization": f"Bearer {key}"})


def post_event(api, asset, extra_text: str):
    return api.post(
        "/api/v2/assets/events",
        data=f'{{"asset_id": {asset.pk}, "extra": {extra_text}}}',
        content_type="application/json",
    )


def test_public_api_refuses_an_event_extra_deeper_than_the_json_limit_naming_it(api):
    asset = AssetFactory()
    before = db_snapshot()
    response = post_event(api, asset, nested_json(limits.MAX_JSON_DEPTH + 1))
    assert response.status_code == 422, response.content
    (item,) = response.json()["detail"]
    assert item["type"] == "too_deep" and item["loc"] == ["body", "extra"]
    assert item["msg"].startswith("extra.k.k") and "64 levels" in item["msg"]
    assert item["ctx"]["max_depth"] == 64
    assert db_snapshot() == before
    assert post_event(api, asset, nested_json(limits.MAX_JSON_DEPTH)).status_code == 200

    response = post_event(api, asset, nested_json(5_000))
    assert response.status_code == 422
    (item,) = response.json()["detail"]
    assert item["type"] == "too_deep" and ".extra.k.k" in item["msg"]


def test_public_api_refuses_a_trigger_conf_deeper_than_the_json_limit(api):
    scheduled_dag("d", "a")
    response = api.post(
        "/api/v2/dags/d/dagRuns",
        data=f'{{"conf": {nested_json(limits.MAX_JSON_DEPTH + 1)}}}',
        content_type="application/json",
    )
    assert response.status_code == 422, response.content
    (item,) = response.json()["detail"]
    assert item["type"] == "too_deep" and item["loc"] == ["body", "conf"]
    assert not DagRun.objects.exists()


# --- data stored before the limits ------------------------------------------------------------


def test_pages_and_reads_of_deep_data_stored_before_the_limits_do_not_fail(api):
    staff = Client()
    staff.force_login(get_user_model().objects.get(username="ops"))
    event, _ = registration.register_external_event(asset=AssetFactory(name="x"), extra={})
    store_raw_json(AssetEvent, "id", event.pk, "extra", nested_json(900))
    shallower, _ = registration.register_external_event(asset=event.asset, extra={})
    store_raw_json(AssetEvent, "id", shallower.pk, "extra", nested_json(200))
    dag = scheduled_dag("old", "x")
    # 150 levels: the admin's Dag pages answered 500 from there.
    store_raw_json(Dag, "dag_id", "old", "schedule", nested_condition(150, leaf="x"))

    pages = [
        reverse("admin:assets_app_assetevent_change", args=[event.pk]),
        reverse("admin:assets_app_assetevent_change", args=[shallower.pk]),
        reverse("admin:assets_app_asset_change", args=[event.asset_id]),
        reverse("admin:assets_app_assetevent_changelist"),
        reverse("admin:assets_app_dag_change", args=[dag.pk]),
        reverse("admin:assets_app_dag_changelist"),
        reverse("admin:assets_app_dag_queued_events", args=[dag.pk]),
    ]
    for url in pages:
        response = staff.get(url)
        assert response.status_code == 200, url
    assert limits.UNREADABLE_MESSAGE.replace("'", "&#x27;") in staff.get(pages[0]).content.decode()
    page = staff.get(pages[1]).content.decode()
    assert "not shown: nests deeper than the 128 levels a page shows" in page
    dag_page = staff.get(pages[4]).content.decode()
    assert "cannot be evaluated" in dag_page and "32 levels" in dag_page
    for url in ("/api/v2/dags/old/details", "/api/v2/dags/old", "/api/v2/assets/events"):
        assert api.get(url).status_code == 200, url


# --- a poison Dag next to a healthy one -------------------------------------------------------


def healthy_components() -> None:
    now = timezone.now()
    for component in ("drain", "scheduler", "repair"):
        ComponentHeartbeat.objects.update_or_create(
            component=component, defaults={"last_run_at": now, "last_ok_at": now}
        )


@pytest.mark.parametrize("poison", ["too deep", "evaluation crashes"])
def test_a_poison_dag_is_isolated_recorded_shown_and_cleared(monkeypatch, poison):
    scheduled_dag("healthy", "h")
    scheduled_dag("poison", "p")
    if poison == "too deep":
        store_raw_json(Dag, "dag_id", "poison", "schedule", nested_condition(450, leaf="p"))
    else:
        real = scheduling.conditions.evaluate

        def evaluate(condition, **kwargs):
            if condition == scheduling.conditions.AssetRef(name="p", uri="p"):
                raise ValueError("an evaluation bug")
            return real(condition, **kwargs)

        monkeypatch.setattr(scheduling.conditions, "evaluate", evaluate)
    for name in ("h", "p"):
        registration.register_external_event(asset=Asset.objects.get(name=name), extra={})

    result = scheduling.schedule_dags()

    assert [dag_id for dag_id, _ in result.run_ids] == ["healthy"]
    assert result.dags_failed == ("poison",)
    assert DagRun.objects.filter(dag_id="healthy").count() == 1
    assert not DagRun.objects.filter(dag_id="poison").exists()
    stored = Dag.objects.get(dag_id="poison")
    expected = "32 levels" if poison == "too deep" else "ValueError: an evaluation bug"
    assert expected in stored.schedule_error and stored.schedule_error_at is not None
    assert stored.queued_events.count() == 1  # its events wait

    healthy_components()
    body = Client().get("/healthz")
    assert body.status_code == 200
    health = body.json()
    assert health["status"] == "degraded"
    assert health["failing_dags"]["count"] == 1
    (failing,) = health["failing_dags"]["dags"]
    assert failing["dag_id"] == "poison" and expected in failing["error"]

    staff = Client()
    staff.force_login(get_user_model().objects.create_superuser("root", password="pw"))
    listing = staff.get(reverse("admin:assets_app_dag_changelist") + "?evaluable=no")
    assert ">poison<" in listing.content.decode() and ">healthy<" not in listing.content.decode()
    page = staff.get(reverse("admin:assets_app_dag_change", args=["poison"])).content.decode()
    assert "cannot be evaluated" in page and expected in page

    # A second pass does not rewrite the recorded error; once the Dag evaluates it is cleared.
    first_seen = stored.schedule_error_at
    scheduling.schedule_dags()
    assert Dag.objects.get(dag_id="poison").schedule_error_at == first_seen
    monkeypatch.undo()
    Dag.objects.filter(dag_id="poison").update(schedule={"asset": {"name": "p", "uri": "p"}})
    result = scheduling.schedule_dags()
    assert [dag_id for dag_id, _ in result.run_ids] == ["poison"]
    assert Dag.objects.get(dag_id="poison").schedule_error == ""
    assert Client().get("/healthz").json()["status"] == "ok"


@pytest.mark.parametrize("dags", [1, 3])
def test_a_database_error_still_fails_the_pass(monkeypatch, dags):
    """Alone or in a batch (which then retries Dag by Dag): the database error fails the pass
    and is recorded on no Dag."""
    for i in range(dags):
        scheduled_dag(f"d{i}", "a")
    registration.register_external_event(asset=Asset.objects.get(name="a"), extra={})
    from django.db import OperationalError

    def broken(*args, **kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(scheduling.runs, "create_asset_triggered_runs", broken)
    with pytest.raises(OperationalError):
        scheduling.schedule_dags()
    assert set(Dag.objects.values_list("schedule_error", flat=True)) == {""}
    assert not DagRun.objects.exists()


def test_the_drain_then_scheduler_path_skips_a_poison_dag_too():
    scheduled_dag("healthy", "h")
    scheduled_dag("poison", "h")
    store_raw_json(Dag, "dag_id", "poison", "schedule", nested_condition(450, leaf="h"))
    ti = TaskInstanceFactory(running=True)
    outbox.enqueue(
        ti=ti,
        outlets=[{"name": "h", "uri": "h", "type": "Asset"}],
        outlet_events=[],
        end_date=timezone.now() - timedelta(seconds=1),
    )
    drain.drain()
    scheduling.schedule_dags()
    assert DagRun.objects.filter(dag_id="healthy").count() == 1
    assert Dag.objects.get(dag_id="poison").schedule_error
