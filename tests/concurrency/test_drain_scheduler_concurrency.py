"""Two drains and two schedulers at once over 2,000 queued rows (invariants 3, 5, 7, 8)."""

import threading
import time
from collections import Counter

import psycopg
import pytest
from django.db import connection, connections

from assets_app.models import (
    Asset,
    AssetDagRunQueue,
    AssetEvent,
    AssetEventQueue,
    DagRun,
    DagRunAssetEvent,
    DagScheduleAssetReference,
)
from assets_app.outbox import drain
from assets_app.scheduling import asset_runs as scheduling
from tests.asset_flow import alias_event, alias_outlet, asset_outlet, payload, scheduled_dag
from tests.factories import AssetFactory

ROWS = 2_000
# Outlets of row i: SHAPES[i % 6] ("x": an emission through alias "al" to one of 7 assets that do
# not exist yet, so both drains race to create them). The last row (i = 1999, shape "abc")
# declares all three assets, so every condition is met once everything is registered.
SHAPES = ["a", "b", "ac", "x", "c", "abc"]


def deadlocks_in_database() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]


def is_deadlock(exc: BaseException) -> bool:
    while exc is not None:
        if isinstance(exc, psycopg.errors.DeadlockDetected):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_drains_and_two_schedulers_register_once_and_consume_once_per_dag():
    assets = {name: AssetFactory(name=name, uri=name) for name in "abc"}
    # Queued runs never finish here, so max_active_runs must not be what limits the test.
    big = {"max_active_runs": 100_000}
    scheduled_dag("on_a", "a", **big)
    scheduled_dag("a_or_b", {"any": ["a", "b"]}, **big)
    scheduled_dag("a_and_c", {"all": ["a", "c"]}, **big)
    scheduled_dag("on_alias", {"any": [{"alias": "al"}, "b"]}, **big)
    rows = []
    for i in range(ROWS):
        shape = SHAPES[i % len(SHAPES)]
        if shape == "x":
            target = f"new{i % 7}"
            body = payload(
                outlets=[alias_outlet("al")],
                outlet_events=[alias_event("al", target, target)],
                task_id=f"t{i}",
            )
        else:
            body = payload(outlets=[asset_outlet(assets[name]) for name in shape], task_id=f"t{i}")
        source = body["source"]
        rows.append(
            AssetEventQueue(
                ti_id=source["ti_id"],
                try_number=1,
                source_dag_id=source["dag_id"],
                source_run_id=source["run_id"],
                source_task_id=source["task_id"],
                payload=body,
            )
        )
    AssetEventQueue.objects.bulk_create(rows)
    deadlocks_before = deadlocks_in_database()

    errors: list[BaseException] = []
    drains_done = threading.Event()
    claimed = Counter()

    def guarded(fn):
        def run(name):
            try:
                fn(name)
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)
            finally:
                connections.close_all()

        return run

    @guarded
    def drainer(name):
        while AssetEventQueue.objects.filter(parked_at__isnull=True).exists():
            result = drain.drain(batch_size=100, time_budget=5)
            claimed[name] += result.claimed

    @guarded
    def scheduler(name):
        while not drains_done.is_set():
            scheduling.schedule_dags()
            time.sleep(0.01)

    threads = [threading.Thread(target=drainer, args=(f"drain{i}",)) for i in (1, 2)]
    schedulers = [threading.Thread(target=scheduler, args=(f"sched{i}",)) for i in (1, 2)]
    started = time.monotonic()
    for thread in threads + schedulers:
        thread.start()
    for thread in threads:
        thread.join(timeout=240)
    drains_done.set()
    for thread in schedulers:
        thread.join(timeout=60)
    elapsed = time.monotonic() - started

    assert [e for e in errors if is_deadlock(e)] == []
    assert errors == []
    assert deadlocks_in_database() == deadlocks_before
    # Both drains did part of the work, and every row was registered exactly once.
    assert sum(claimed.values()) == ROWS
    assert AssetEventQueue.objects.count() == 0
    expected_events = sum(len(SHAPES[i % len(SHAPES)]) for i in range(ROWS))
    assert AssetEvent.objects.count() == expected_events
    assert AssetEvent.objects.values("source_ti_id").distinct().count() == ROWS

    # Rows the threads' last passes skipped (a Dag locked by the other scheduler) are consumed
    # by one more sweep; after it nothing may be left behind.
    scheduling.schedule_dags()
    assert AssetDagRunQueue.objects.count() == 0

    consumed = Counter(DagRunAssetEvent.objects.values_list("dag_id", "asset_event_id"))
    assert max(consumed.values()) == 1
    owed_by = {
        dag_id: set(
            AssetEvent.objects.filter(
                asset_id__in=DagScheduleAssetReference.objects.filter(dag_id=dag_id).values(
                    "asset_id"
                )
            ).values_list("id", flat=True)
        )
        for dag_id in ("on_a", "a_or_b", "a_and_c", "on_alias")
    }
    owed_by["on_alias"] |= set(
        AssetEvent.objects.filter(source_aliases__name="al").values_list("id", flat=True)
    )
    assert Asset.objects.filter(name__startswith="new").count() == 7
    for dag_id, owed in owed_by.items():
        got = {event for (d, event) in consumed if d == dag_id}
        assert got == owed, dag_id
    runs = DagRun.objects.count()
    print(f"\n{ROWS} rows, {expected_events} events, {runs} runs, {elapsed:.1f}s, {dict(claimed)}")
