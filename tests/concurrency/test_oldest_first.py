"""Oldest first (invariant 16, issue 41): a bounded Dag consumes its events in event-id order even
when the transactions that wrote them commit out of order, and `run_after` never goes back.

Real threads against PostgreSQL: one registration allocates the older event id and holds its
transaction open while a younger event commits; the scheduler must not run ahead of it.
"""

import threading
from datetime import timedelta

import pytest
from django.db import connections, transaction
from django.utils import timezone

from assets_app.models import AssetEvent, DagRun
from assets_app.registration import outlets as registration
from assets_app.scheduling import asset_runs as scheduling
from tests.asset_flow import scheduled_dag
from tests.factories import AssetFactory, TaskFactory

pytestmark = pytest.mark.django_db(transaction=True)


def runs_of(dag_id: str) -> list[list[int]]:
    return [
        sorted(run.consumed_events.values_list("id", flat=True))
        for run in DagRun.objects.filter(dag_id=dag_id).order_by("id")
    ]


class HeldRegistration(threading.Thread):
    """Registers one event of `asset` (a queue watcher's path, in a transaction of its own) and
    keeps its transaction open until `release` is set: its event id is allocated, not
    committed."""

    def __init__(self, asset_id: int) -> None:
        super().__init__(daemon=True)
        self.asset_id = asset_id
        self.allocated = threading.Event()
        self.release = threading.Event()
        self.event_id: int | None = None

    def run(self) -> None:
        try:
            with transaction.atomic():
                written = registration.register_external_events(
                    asset_ids=[self.asset_id], extra={"held": True}, now=timezone.now()
                )
                (self.event_id,) = written.event_ids
                self.allocated.set()
                assert self.release.wait(30)
        finally:
            connections.close_all()


@pytest.mark.parametrize("max_events", [1, 5])
def test_a_younger_event_committed_first_waits_for_the_older_one_in_flight(max_events):
    asset = AssetFactory(name="a", uri="a")
    dag = scheduled_dag("bounded", "a", max_events_per_run=max_events, max_active_runs=1)
    TaskFactory(dag=dag, task_id="t")
    held = HeldRegistration(asset.pk)
    held.start()
    assert held.allocated.wait(10)
    (younger,) = registration.register_external_events(
        asset_ids=[asset.pk], extra={}, now=timezone.now()
    ).event_ids
    assert held.event_id is not None and held.event_id < younger
    # The older event commits while the pass waits for its fence.
    threading.Timer(0.5, held.release.set).start()
    result = scheduling.schedule_dags(dag_ids=["bounded"])
    held.join(10)
    expected = [[held.event_id]] if max_events == 1 else [[held.event_id, younger]]
    assert runs_of("bounded") == expected, result


def test_a_fence_held_past_the_wait_leaves_the_dag_to_the_registration(monkeypatch):
    """The pass goes on without the Dag (nothing consumed out of order); the registration's
    own nudge schedules it after its commit."""
    monkeypatch.setattr(scheduling, "FENCE_WAIT_SECONDS", 0.2)
    asset = AssetFactory(name="a", uri="a")
    dag = scheduled_dag("bounded", "a", max_events_per_run=1, max_active_runs=1)
    TaskFactory(dag=dag, task_id="t")
    scheduled_dag("batch", "a", max_active_runs=1)
    held = HeldRegistration(asset.pk)
    held.start()
    assert held.allocated.wait(10)
    younger = registration.register_external_events(
        asset_ids=[asset.pk], extra={}, now=timezone.now()
    ).event_ids[0]
    try:
        result = scheduling.schedule_dags()
    finally:
        held.release.set()
        held.join(10)
    assert result.dags_fenced == ("bounded",)
    assert runs_of("bounded") == []
    # A batch Dag is not fenced: it consumes what has committed.
    assert runs_of("batch") == [[younger]]
    scheduling.schedule_dags(dag_ids=["bounded"])
    assert runs_of("bounded") == [[held.event_id]]


def test_run_after_never_goes_back_when_an_older_event_commits_late():
    """The late event's timestamp is older than the run ahead of it: its run's `run_after` is
    that run's, not before it (bounded and batch Dags alike)."""
    asset = AssetFactory(name="a", uri="a")
    for dag_id, limit in (("bounded", 1), ("batch", None)):
        dag = scheduled_dag(dag_id, "a", max_events_per_run=limit, max_active_runs=10)
        TaskFactory(dag=dag, task_id="t")
    now = timezone.now()
    registration.register_external_events(asset_ids=[asset.pk], extra={}, now=now)
    scheduling.schedule_dags()
    late = registration.register_external_events(asset_ids=[asset.pk], extra={}, now=now)
    AssetEvent.objects.filter(id__in=late.event_ids).update(timestamp=now - timedelta(seconds=5))
    scheduling.schedule_dags()
    for dag_id in ("bounded", "batch"):
        first, second = DagRun.objects.filter(dag_id=dag_id).order_by("id")
        assert second.run_after >= first.run_after, dag_id
