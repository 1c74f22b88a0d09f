"""assets_app.cluster.nudges: the names it enqueues, and robust on-commit scheduler nudges."""

import logging

import pytest
from django.db import OperationalError
from django.utils.module_loading import import_string

from assets_app import tasks
from assets_app.cluster import nudges, sweeps
from assets_app.models import Asset, AssetDagRunQueue, DagRun
from assets_app.registration import outlets as registration
from assets_app.scheduling import asset_runs as scheduling
from tests.asset_flow import scheduled_dag


def test_the_enqueued_names_are_the_django_q2_entry_points():
    """Broker rows and Schedule rows already stored carry these dotted names: they must keep
    resolving to the entry points."""
    assert import_string(nudges.DRAIN_FUNC) is tasks.drain
    assert import_string(nudges.SCHEDULE_FUNC) is tasks.schedule
    assert {import_string(func) for func in sweeps.SWEEPS.values()} == {
        tasks.drain,
        tasks.schedule,
    }


@pytest.mark.django_db
def test_setting_up_the_sweeps_deletes_the_ones_that_became_timers():
    """Issue 41: only the drain and the asset scheduler run in the cluster; the sweeps an
    earlier version stored for repair, retention, delivery and freshness are deleted."""
    from django_q.models import Schedule

    for name in sweeps.RETIRED:
        Schedule.objects.create(name=name, func=f"assets_app.tasks.{name}", minutes=1)
    sweeps.ensure_schedules()
    assert set(Schedule.objects.values_list("name", flat=True)) == set(sweeps.SWEEPS)


@pytest.mark.django_db(transaction=True)
def test_a_scheduler_nudge_that_raises_after_commit_keeps_the_event_and_its_queue_rows(
    monkeypatch, caplog
):
    def broker_away(**kwargs) -> None:
        raise OperationalError("the broker table is away")

    monkeypatch.setattr(nudges, "nudge_scheduler", broker_away)
    consumer = scheduled_dag("consumer", "orders")
    asset = Asset.objects.get(name="orders")

    with caplog.at_level(logging.WARNING, logger="assets_app.cluster.nudges"):
        event, created = registration.register_external_event(asset=asset, extra={})

    assert created
    (warning,) = [r for r in caplog.records if r.name == "assets_app.cluster.nudges"]
    assert "broker_away" in warning.getMessage()
    assert AssetDagRunQueue.objects.filter(target_dag=consumer, asset_event=event).count() == 1

    result = scheduling.schedule_dags()  # what the one-minute sweep runs

    assert [dag_id for dag_id, _ in result.run_ids] == ["consumer"]
    assert DagRun.objects.filter(dag=consumer).count() == 1


@pytest.mark.django_db
def test_scheduler_nudges_coalesce_while_one_covering_their_dags_waits():
    """Issue 41: a nudge per posted event (50 a second) queued 50 scheduler tasks a second, and
    a drain task behind them waited for all of them. A waiting task for the same Dags (or for
    all) covers a new nudge; one for other Dags does not; once picked up, a nudge is sent."""
    from datetime import timedelta

    from django.utils import timezone
    from django_q.models import OrmQ

    nudges._last_scheduler_nudge.clear()

    def waiting() -> list:
        return sorted(
            tuple(row.kwargs().get("dag_ids") or ["*"])
            for row in OrmQ.objects.all()
            if row.func() == nudges.SCHEDULE_FUNC
        )

    for _ in range(5):
        nudges.nudge_scheduler(dag_ids=["a"])
    assert waiting() == [("a",)]
    nudges.nudge_scheduler(dag_ids=["a", "b"])  # not covered by the one for "a"
    assert waiting() == [("a",), ("a", "b")]
    nudges._last_scheduler_nudge.clear()  # another process: it looks at the waiting rows
    nudges.nudge_scheduler(dag_ids=["b"])
    nudges.nudge_scheduler(dag_ids=["a"])
    assert waiting() == [("a",), ("a", "b")]
    OrmQ.objects.update(lock=timezone.now() + timedelta(seconds=90))  # all picked up
    nudges.nudge_scheduler(dag_ids=["b"])
    nudges.nudge_scheduler()
    nudges.nudge_scheduler(dag_ids=["c"])  # the one for all Dags waits: covered
    assert len(waiting()) == 4 and ("*",) in waiting()
