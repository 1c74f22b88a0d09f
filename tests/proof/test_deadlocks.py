"""Deadlocks are bugs (invariant 7): 8 drains register events for one hot asset at once.

One asset, 8 downstream Dags. 20 rounds; each round queues 48 outbox rows (3 events each) whose
due times are shuffled against their ids, so the drains claim them in an order unrelated to
insertion order, and each drain takes a different random batch size per call, so every batch holds
a different mix of rows. 8 drain threads start together on a barrier; 2 schedulers consume the
ADRQ rows (deleting them) while the drains still insert. Deadlocks are counted three ways: a
`DeadlockDetected` raised out of a drain or scheduler call, an outbox row that failed an attempt
(the drain turns a per-row error into `attempts + 1`, counted by the `outbox_failed_attempts`
metric), and PostgreSQL's own `pg_stat_database.deadlocks` for the test database. All must be 0.
"""

import random
import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import OperationalError
from django.utils import timezone

from assets_app import metrics, outbox, scheduling
from assets_app.models import AssetDagRunQueue, AssetEventQueue

from .conftest import consumption_report, figure, make_scheduled_dag, pg_deadlocks, run_in_threads

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROUNDS = 20
ROWS_PER_ROUND = 48
EVENTS_PER_ROW = 3
DRAINS = 8
SCHEDULERS = 2
HOT = "hot-asset"


def _is_deadlock(exc: BaseException) -> bool:
    while exc is not None:
        if type(exc).__name__ == "DeadlockDetected" or "deadlock detected" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _queue_round(round_no: int, rng: random.Random) -> None:
    """48 outbox rows (their TIs need not exist: rows carry their source), due in shuffled order."""
    now = timezone.now()
    offsets = list(range(ROWS_PER_ROUND))
    rng.shuffle(offsets)
    rows = []
    for i, offset in enumerate(offsets):
        ti_id = uuid.uuid4()
        source = {
            "ti_id": str(ti_id),
            "dag_id": "producer",
            "run_id": f"manual__round_{round_no}",
            "task_id": f"task_{i}",
            "map_index": -1,
            "try_number": 1,
        }
        rows.append(
            AssetEventQueue(
                ti_id=ti_id,
                try_number=1,
                source_dag_id=source["dag_id"],
                source_run_id=source["run_id"],
                source_task_id=source["task_id"],
                next_attempt_at=now - timedelta(milliseconds=offset),
                payload={
                    "outlets": [{"name": HOT, "uri": HOT, "type": "Asset"}],
                    "outlet_events": [
                        {"dest_asset_key": {"name": HOT, "uri": HOT}, "extra": {"k": k}}
                        for k in range(EVENTS_PER_ROW)
                    ],
                    "source": source,
                    "end_date": now.isoformat(),
                },
            )
        )
    AssetEventQueue.objects.bulk_create(rows)


class Counts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.deadlocks_raised = 0

    def guarded(self, call) -> None:
        """Run one drain / scheduler call, counting a deadlock instead of failing the thread."""
        try:
            call()
        except OperationalError as exc:
            if not _is_deadlock(exc):
                raise
            with self.lock:
                self.deadlocks_raised += 1


def _run_round(round_no: int, counts: Counts) -> None:
    barrier = threading.Barrier(DRAINS + SCHEDULERS)
    drains_done = threading.Event()
    finished = [0]

    def drainer(n: int) -> None:
        local = random.Random(round_no * 100 + n)
        barrier.wait(30)
        while AssetEventQueue.objects.filter(parked_at__isnull=True).exists():
            counts.guarded(lambda: outbox.drain(batch_size=local.randint(1, 12), time_budget=0.2))
        with counts.lock:
            finished[0] += 1
            if finished[0] == DRAINS:
                drains_done.set()

    def scheduler(n: int) -> None:
        barrier.wait(30)
        while True:
            done = drains_done.is_set()
            counts.guarded(scheduling.schedule_dags)
            if done and not AssetDagRunQueue.objects.exists():
                return
            time.sleep(0.002 * n)

    run_in_threads(
        [lambda n=n: drainer(n) for n in range(DRAINS)]
        + [lambda n=n: scheduler(n) for n in range(SCHEDULERS)],
        timeout=60,
    )


def test_eight_drains_on_one_hot_asset_never_deadlock():
    conditions = [HOT, {"all": [HOT]}, {"any": [HOT]}, {"all": [{"any": [HOT]}]}]
    for j in range(8):
        make_scheduled_dag(f"hot_dag_{j}", conditions[j % len(conditions)])
    rng = random.Random(7)
    deadlocks_before = pg_deadlocks()
    failed_before = metrics.value(metrics.FAILED_ATTEMPTS)
    counts = Counts()
    started = time.monotonic()
    for round_no in range(ROUNDS):
        _queue_round(round_no, rng)
        _run_round(round_no, counts)
    elapsed = time.monotonic() - started

    deadlocks_pg = pg_deadlocks() - deadlocks_before
    failed_attempts = metrics.value(metrics.FAILED_ATTEMPTS) - failed_before
    report = consumption_report()
    figure(
        f"deadlocks: {ROUNDS} rounds, {report['events']} events, {report['runs']} runs, "
        f"deadlocks raised={counts.deadlocks_raised} pg_stat={deadlocks_pg} "
        f"failed row attempts={failed_attempts}, {elapsed:.1f} s"
    )
    assert counts.deadlocks_raised == 0
    assert deadlocks_pg == 0
    assert failed_attempts == 0
    assert AssetEventQueue.objects.count() == 0
    assert AssetDagRunQueue.objects.count() == 0
    assert report["events"] == ROUNDS * ROWS_PER_ROUND * EVENTS_PER_ROW
    assert report["consumptions"] == 8 * report["events"]
    assert (report["missed"], report["foreign"], report["doubled"], report["empty_runs"]) == (
        0,
        0,
        0,
        0,
    )
