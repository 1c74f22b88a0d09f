"""Asset-and-time ticks under concurrency (issue 24): two time schedulers and an asset
scheduler pass at once over Dags whose events keep arriving; every event is consumed exactly
once (the database's `event_consumed_once_per_dag` would refuse a second), no tick gets two
runs, no deadlock, no pass waits on another."""

import datetime as dt
import threading

import pytest
from django.db import connections

from assets_app.definitions import sync as definitions
from assets_app.models import Asset, AssetDagRunQueue, AssetEvent, DagRun, DagRunAssetEvent
from assets_app.scheduling import asset_runs as scheduling
from assets_app.scheduling import time_runs as time_scheduling

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

UTC = dt.UTC
DAGS = 12
START = dt.datetime(2099, 1, 1, tzinfo=UTC)


def test_two_time_schedulers_and_the_asset_scheduler_consume_each_event_once(settings):
    settings.TIME_SCHEDULER_BATCH_SIZE = 5
    definitions.sync_definitions(
        dags=[
            d
            for i in range(DAGS)
            for d in definitions.parse_document(
                {
                    "dag_id": f"d{i:02}",
                    "is_paused": False,  # a sync pauses a new Dag unless it says so (issue 39)
                    "schedule": {"any": ["a", "b"]},
                    "timetable": "*/10 * * * *",
                    "schedule_mode": "asset_and_time",
                    "start_date": "2099-01-01",
                    "catchup": True,
                    "max_active_runs": 1000,
                    "tasks": [{"task_id": "t"}],
                },
                file="x",
            )
        ]
    )
    assets = {a.name: a for a in Asset.objects.filter(name__in=["a", "b"])}
    # Events every 7 minutes over 3 hours, queued for every Dag.
    for minute in range(0, 180, 7):
        for asset in assets.values():
            event = AssetEvent.objects.create(
                asset=asset, timestamp=START + dt.timedelta(minutes=minute), extra={}
            )
            AssetDagRunQueue.objects.bulk_create(
                [
                    AssetDagRunQueue(target_dag_id=f"d{i:02}", asset=asset, asset_event=event)
                    for i in range(DAGS)
                ]
            )
    errors: list[BaseException] = []
    barrier = threading.Barrier(3)

    def run(step):
        try:
            barrier.wait(10)
            for hour in range(1, 4):
                step(START + dt.timedelta(hours=hour, seconds=30))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    def timed(now):
        time_scheduling.create_due_runs(now=now)

    def assets_pass(now):
        scheduling.schedule_dags()

    threads = [threading.Thread(target=run, args=(s,)) for s in (timed, timed, assets_pass)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert errors == []
    time_scheduling.create_due_runs(now=START + dt.timedelta(hours=3, seconds=30))
    # Ticks 00:00, 00:10, ... 03:00 each see an event (one every 7 minutes, the first at 00:00).
    runs = DagRun.objects.filter(dag_id="d00").order_by("logical_date")
    assert runs.count() == 19 and all(r.run_type == "scheduled" for r in runs)
    links = DagRunAssetEvent.objects.values_list("dag_id", "asset_event_id")
    assert len(links) == len(set(links))  # each event once per Dag
    # Every event up to 03:00 consumed by every Dag, the later ones wait.
    events_until = AssetEvent.objects.filter(timestamp__lte=START + dt.timedelta(hours=3))
    assert len(links) == DAGS * events_until.count()
    assert AssetDagRunQueue.objects.count() == DAGS * (
        AssetEvent.objects.count() - events_until.count()
    )
