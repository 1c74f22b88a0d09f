"""The timers (issue 41): each timer does its work when it is due or woken by a NOTIFY, never
polls, and never waits behind another; real threads and real PostgreSQL NOTIFY, the service's
own timers (`timers.service`) run by the process's loop (`timers.loop.run`).

Timing bounds are loose (a shared CI machine); the latency figures are `bench/as_shipped.py`'s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from django.db import connections
from django.utils import timezone

from assets_app.definitions import sync as definitions
from assets_app.events_out import freshness, webhooks
from assets_app.models import (
    Asset,
    Dag,
    DagRun,
    FreshnessPolicy,
    FreshnessState,
    WebhookDelivery,
)
from assets_app.registration import outlets as registration
from assets_app.sql import wakeups
from assets_app.timers import loop, service
from tests.factories import AssetFactory
from tests.webhook_receiver import Receiver, always

pytestmark = pytest.mark.django_db(transaction=True)

# How late past its due time a piece of work may start here (the bench measures the real lag).
SLACK = 2.5


class Running:
    """The timers running in threads of this process; `rounds` as they happen."""

    def __init__(self, timers: list[loop.Timer]) -> None:
        self.timers = timers
        self.stop = threading.Event()
        self.rounds: list[loop.Round] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            loop.run(self.timers, stop=self.stop, on_round=self.rounds.append)
        finally:
            connections.close_all()

    def rounds_of(self, name: str) -> list[loop.Round]:
        return [r for r in self.rounds if r.timer == name]

    def wait_for(self, predicate, timeout: float) -> float:
        """Seconds until `predicate()` held (polled every 20 ms); fails after `timeout`."""
        started = time.monotonic()
        while not predicate():
            assert time.monotonic() - started < timeout, "not within the timeout"
            time.sleep(0.02)
        return time.monotonic() - started


@pytest.fixture
def timers(settings) -> Iterator[Running]:
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1/32"]
    settings.WEBHOOK_BACKOFF_BASE_SECONDS = 1.0
    settings.WEBHOOK_BACKOFF_CAP_SECONDS = 2.0
    settings.WEBHOOK_TIMEOUT_SECONDS = 2.0
    running = Running(service.timers())
    running.thread.start()
    running.wait_for(lambda: len({r.timer for r in running.rounds}) == len(running.timers), 30)
    yield running
    running.stop.set()
    running.thread.join(timeout=30)
    assert not running.thread.is_alive()


def _time_dag(*, due_in: float, dag_id: str = "ticking") -> tuple[Dag, datetime]:
    """A Dag with one run due `due_in` seconds from now (an events timetable), synced: the sync
    wakes the time scheduler (TIME, at its commit), which then sleeps until that run is due."""
    due = (timezone.now() + timedelta(seconds=due_in)).replace(microsecond=0)
    due += timedelta(seconds=1)  # whole seconds, in the future
    definitions.sync_definitions(
        dags=definitions.parse_document(
            {
                "dag_id": dag_id,
                "is_paused": False,  # a sync pauses a new Dag unless it says so (issue 39)
                "timetable": {"kind": "events", "event_dates": [due.isoformat()]},
                "start_date": "2026-01-01",
                "catchup": True,
                "tasks": [{"task_id": "t"}],
            },
            file="t.json",
        )
    )
    return Dag.objects.get(dag_id=dag_id), due


def test_the_time_scheduler_is_woken_by_a_sync_and_wakes_at_the_next_run_not_before(timers):
    """A synced Dag's next run, about 1.5 s ahead: the sync's TIME wakes the timer, which reads
    the new next run and sleeps until it (no poll): the run is created then, and not before."""
    before = len(timers.rounds_of("time-scheduler"))
    dag, due = _time_dag(due_in=0.5)
    assert dag.next_dagrun_create_after == due
    timers.wait_for(lambda: DagRun.objects.filter(dag=dag).exists(), 10)
    created = timezone.now()
    assert due <= created < due + timedelta(seconds=SLACK), created - due
    assert DagRun.objects.get(dag=dag).run_type == "scheduled"
    # The first round after the sync is the sync's wake-up (the next, at the due time, unless
    # a slow machine made the first one late enough to create the run itself).
    assert timers.rounds_of("time-scheduler")[before].woken == {wakeups.TIME}


def test_a_webhook_message_is_sent_when_written_and_a_retry_when_due(timers):
    """The message an event writes wakes the delivery timer at commit; the receiver's 500 makes
    it due again after the backoff (0.5-1 s here), when the timer sends it again."""
    with Receiver(plan=lambda request, n: (500, {}) if n == 0 else (200, {})) as receiver:
        webhooks.create_endpoint(
            url=receiver.url,
            subscriptions=[webhooks.SubscriptionSpec("asset.event.registered", "*")],
        )
        asset = AssetFactory(name="hooked")
        written = time.time()
        registration.register_external_event(asset=asset, extra={})
        timers.wait_for(lambda: len(receiver.received) >= 1, 10)
        assert receiver.received[0].at - written < SLACK
        timers.wait_for(lambda: len(receiver.received) >= 2, 15)
        first, second = receiver.received[:2]
        assert first.message_id == second.message_id
        assert 0.45 <= second.at - first.at < 1.0 + SLACK  # the backoff: 0.5-1 s
    timers.wait_for(lambda: WebhookDelivery.objects.filter(state="delivered").exists(), 10)


def test_a_policy_becomes_late_at_its_due_time_and_fresh_at_the_next_event(timers):
    asset = AssetFactory(name="watched")
    freshness.set_policy(asset=asset, kind="max_interval", interval_seconds=2)
    policy = FreshnessPolicy.objects.get(asset=asset)
    timers.wait_for(
        lambda: FreshnessPolicy.objects.filter(pk=policy.pk, due_at__isnull=False).exists(), 10
    )
    due = FreshnessPolicy.objects.get(pk=policy.pk).due_at
    timers.wait_for(
        lambda: FreshnessPolicy.objects.filter(pk=policy.pk, state=FreshnessState.LATE).exists(),
        10,
    )
    late = FreshnessPolicy.objects.get(pk=policy.pk)
    assert due <= late.state_since < due + timedelta(seconds=SLACK)
    registered = timezone.now()
    registration.register_external_event(asset=Asset.objects.get(pk=asset.pk), extra={})
    seconds = timers.wait_for(
        lambda: FreshnessPolicy.objects.filter(pk=policy.pk, state=FreshnessState.FRESH).exists(),
        10,
    )
    assert seconds < SLACK
    fresh = FreshnessPolicy.objects.get(pk=policy.pk)
    assert fresh.state_since >= registered
    rounds = timers.rounds_of("freshness")
    assert any(wakeups.FRESHNESS in r.woken for r in rounds)


def test_an_idle_service_makes_no_rounds(timers):
    """Nothing due, nothing written: no timer looks (the first rounds, at the start, aside)."""
    _time_dag(due_in=3600)  # a next run an hour away
    time.sleep(0.5)
    before = len(timers.rounds)
    time.sleep(4)
    assert timers.rounds[before:] == []


def test_a_long_round_of_one_timer_delays_no_other(timers):
    """A webhook receiver that takes 3 s to answer holds the delivery timer's round; the time
    scheduler's tick during it is on time (the timers run in threads of their own)."""
    with Receiver(plan=always(200), delay=3.0) as receiver:
        webhooks.create_endpoint(
            url=receiver.url,
            subscriptions=[webhooks.SubscriptionSpec("asset.event.registered", "*")],
        )
        registration.register_external_event(asset=AssetFactory(name="slow"), extra={})
        timers.wait_for(lambda: len(receiver.received) >= 1, 10)  # the slow answer begins
        dag, due = _time_dag(due_in=0.2)
        timers.wait_for(lambda: DagRun.objects.filter(dag=dag).exists(), 10)
        assert (timezone.now() - due).total_seconds() < 1.5
        assert not WebhookDelivery.objects.filter(state="delivered").exists()  # still sending


def test_an_error_in_one_round_is_retried_and_stops_nothing(timers, monkeypatch):
    calls = {"n": 0}

    def broken(woken):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("one bad round")

    timer = loop.Timer("flaky", work=broken, next_due=lambda: None)
    running = Running([timer])
    running.thread.start()
    try:
        running.wait_for(lambda: calls["n"] >= 2, 10)  # retried after the 1 s backoff
        assert [r.ok for r in running.rounds][:2] == [False, True]
    finally:
        running.stop.set()
        running.thread.join(timeout=10)
