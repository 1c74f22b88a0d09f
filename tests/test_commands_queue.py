import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone
from django_q.models import Schedule

from assets_app.models import AssetEvent, AssetEventQueue, AuditEntry, Dag, DagRun
from assets_app.outbox import rows as outbox
from tests.asset_flow import asset_outlet, outbox_row, payload, scheduled_dag
from tests.factories import AssetEventQueueFactory, AssetFactory

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def parked_rows(*dag_ids: str) -> list[AssetEventQueue]:
    asset = AssetFactory(name="a")
    rows = [outbox_row(payload(outlets=[asset_outlet(asset)], dag_id=d)) for d in dag_ids]
    outbox.park(row_ids=[row.id for row in rows])
    return rows


def test_drain_asset_queue_once_registers_and_triggers():
    asset = AssetFactory(name="a")
    scheduled_dag("down", "a")
    outbox_row(payload(outlets=[asset_outlet(asset)]))
    out = run("drain_asset_queue", "--once")
    assert out.startswith("drain: 1 registered, 0 failed (0 parked), 1 events, 1 runs in 1 batches")
    assert AssetEventQueue.objects.count() == 0
    assert DagRun.objects.filter(dag_id="down").count() == 1


def test_run_scheduler_once_lists_the_runs_it_created():
    asset = AssetFactory(name="a")
    scheduled_dag("down", "a", is_paused=True)
    outbox_row(payload(outlets=[asset_outlet(asset)]))
    run("drain_asset_queue", "--once")
    assert DagRun.objects.count() == 0
    # The time schedules' pass (issue 24) reports first, then the asset scheduler's.
    lines = run("run_scheduler", "--once").splitlines()
    assert lines[0].startswith("time scheduler: 0 dags due, 0 runs created")
    assert lines[1].startswith("scheduler: 0 dags checked, 0 runs created")
    Dag.objects.filter(dag_id="down").update(is_paused=False)
    out = run("run_scheduler", "--once")
    (created,) = DagRun.objects.all()
    assert "1 runs created, 1 events consumed" in out
    assert f"  down {created.run_id}" in out


def test_requeue_parked_by_id_dag_all_and_dry_run():
    r1 = parked_rows("d1", "d2", "d2")[0]
    out = run("requeue_parked", "--dry-run", "--all")
    assert "dry run: would requeue 3 parked rows" in out
    assert AssetEventQueue.objects.filter(parked_at__isnull=False).count() == 3

    assert "requeued 1 parked rows" in run("requeue_parked", "--id", str(r1.id))
    assert "requeued 2 parked rows" in run("requeue_parked", "--dag", "d2")
    assert AssetEventQueue.objects.filter(parked_at__isnull=False).count() == 0
    assert "requeued 0 parked rows" in run("requeue_parked", "--all")
    assert set(AssetEventQueue.objects.values_list("attempts", flat=True)) == {0}
    run("drain_asset_queue", "--once")
    assert AssetEvent.objects.count() == 3


def test_requeue_parked_requires_a_selection():
    with pytest.raises(CommandError, match="--all"):
        run("requeue_parked")


def test_asset_queue_status_text_and_json():
    asset = AssetFactory(name="a")
    outbox_row(payload(outlets=[asset_outlet(asset)], dag_id="src"))
    parked_rows("src")
    text = run("asset_queue_status")
    assert text.splitlines()[0].startswith(
        "outbox: 1 pending (1 due now), 1 parked, oldest pending"
    )
    assert "src" in text
    data = json.loads(run("asset_queue_status", "--json"))
    assert (data["pending"], data["due"], data["parked"], data["queued_events"]) == (1, 1, 1, 0)
    assert data["by_dag"] == [{"dag_id": "src", "pending": 1, "parked": 1, "queued_events": 0}]


def test_setup_schedules_is_idempotent_with_a_timeout_below_retry(settings):
    assert "created schedule asset-drain-sweep" in run("setup_schedules")
    assert "updated schedule asset-drain-sweep" in run("setup_schedules")
    schedules = {s.name: s for s in Schedule.objects.all()}
    # Only the drain and the asset scheduler run in the cluster (issue 41: the rest are timers).
    assert sorted(schedules) == ["asset-drain-sweep", "asset-scheduler-sweep"]
    assert schedules["asset-scheduler-sweep"].func == "assets_app.tasks.schedule"
    drain = schedules["asset-drain-sweep"]
    assert (drain.func, drain.schedule_type, drain.minutes, drain.repeats) == (
        "assets_app.tasks.drain",
        Schedule.MINUTES,
        1,
        -1,
    )
    assert drain.kwargs == repr({"q_options": {"timeout": settings.Q_CLUSTER["timeout"]}})
    assert settings.Q_CLUSTER["timeout"] < settings.Q_CLUSTER["retry"]
    assert settings.Q_CLUSTER["catch_up"] is False


def test_setup_schedules_refuses_a_timeout_not_below_retry(settings):
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "timeout": 90, "retry": 90}
    with pytest.raises(ValueError, match="below retry"):
        run("setup_schedules")
    assert Schedule.objects.count() == 0


def test_setup_schedules_refuses_a_drain_budget_not_below_the_task_timeout(settings):
    settings.ASSET_DRAIN_TIME_BUDGET_SECONDS = settings.Q_CLUSTER["timeout"]
    with pytest.raises(ValueError, match="ASSET_DRAIN_TIME_BUDGET_SECONDS"):
        run("setup_schedules")


def test_sweep_schedules_enqueue_the_drain_and_scheduler_tasks_with_their_timeout(
    settings, monkeypatch
):
    from django_q import scheduler as q_scheduler
    from django_q.brokers import get_broker
    from django_q.models import OrmQ

    # It would close the test transaction's connection.
    monkeypatch.setattr(q_scheduler, "close_old_django_connections", lambda: None)

    run("setup_schedules")
    Schedule.objects.update(next_run=timezone.now() - timedelta(minutes=5))
    q_scheduler.scheduler(broker=get_broker())
    queued = sorted(
        (row.func(), row.task.get("timeout"), row.kwargs()) for row in OrmQ.objects.all()
    )
    timeout = settings.Q_CLUSTER["timeout"]
    assert queued == [
        ("assets_app.tasks.drain", timeout, {}),
        ("assets_app.tasks.schedule", timeout, {}),
    ]
    # catch_up is off: one task per schedule however many minutes were missed, next run ahead.
    assert all(s.next_run > timezone.now() for s in Schedule.objects.all())


def test_requeue_parked_takes_several_ids_after_one_flag_or_repeated_flags():
    rows = parked_rows("d1", "d1", "d1")
    out = run("requeue_parked", "--id", str(rows[0].id), str(rows[1].id))
    assert "requeued 2 parked rows" in out
    assert "requeued 1 parked rows" in run("requeue_parked", "--id", str(rows[2].id))
    assert AssetEventQueue.objects.filter(parked_at__isnull=False).count() == 0


def test_requeue_parked_names_the_ids_it_could_not_requeue_and_fails():
    parked, pending = parked_rows("d1")[0], AssetEventQueueFactory()
    with pytest.raises(CommandError) as failed:
        run("requeue_parked", "--id", str(parked.id), str(pending.id), "0")
    assert str(failed.value) == (f"could not requeue rows not parked or not found: 0, {pending.id}")
    parked.refresh_from_db()
    assert parked.parked_at is None  # the ones it could requeue are requeued
    entry = AuditEntry.objects.get(action="outbox.requeue")
    assert (entry.via, entry.actor_name[:3]) == ("command", "os:")
    assert list(entry.targets.values_list("object_id", flat=True)) == [str(parked.id)]


def test_trigger_dag_records_the_os_user(monkeypatch):
    monkeypatch.setenv("SUDO_USER", "alice")
    Dag.objects.create(dag_id="ingest")
    out = run("trigger_dag", "ingest", "--conf", '{"day": 3}')
    assert "created run manual__" in out
    run_row = DagRun.objects.get()
    entry = AuditEntry.objects.get()
    assert entry.actor_name.startswith("os:alice (as ") and entry.via == "command"
    assert run_row.triggering_user_name == entry.actor_name
    assert entry.detail["conf"] == {"day": 3}
