"""Race: no missed and no double-consumed events (invariant 8) under full concurrency.

16 producer threads finish task instances (through `task_state`, the code the worker API calls)
and post external events (through `registration.register_external_event`, the code of
`POST /api/v2/assets/events`) for the same 8 assets, 4,000 events in all, while 2 drains and
2 schedulers loop in their own threads with random batch sizes and random short sleeps between
their calls. Each asset is scheduled on by 4 Dags with mixed `all` / `any` conditions.

When the producers are done, one closing event per asset makes every condition true once more,
so every queued row must end up consumed. Then: every event is consumed exactly once by each Dag
scheduled on its asset and by no other Dag, no run consumed zero events, every TI's outlets
became exactly its events, the outbox and the ADRQ are empty and nothing is parked.
"""

import random
import threading
import time
from collections import Counter

import pytest

from assets_app.models import Asset, AssetDagRunQueue, AssetEvent, AssetEventQueue
from assets_app.outbox import drain
from assets_app.registration import outlets as registration
from assets_app.scheduling import asset_runs as scheduling

from .conftest import (
    consumption_report,
    figure,
    make_running_tis,
    make_scheduled_dag,
    pg_deadlocks,
    run_in_threads,
)
from .workers import succeed_ti

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ASSETS = [f"race-{i}" for i in range(8)]
PRODUCERS = 16
TIS_PER_PRODUCER = 32
OUTLETS_PER_TI = 4
EXTERNAL_PER_PRODUCER = 122  # 32 * 4 + 122 = 250 events per producer, 4,000 in all
TOTAL_EVENTS = PRODUCERS * (TIS_PER_PRODUCER * OUTLETS_PER_TI + EXTERNAL_PER_PRODUCER)


def _schedule(j: int) -> dict:
    """Dag j is scheduled on assets j..j+3 (mod 8): each asset has exactly 4 Dags."""
    a, b, c, d = (ASSETS[(j + k) % len(ASSETS)] for k in range(4))
    return [
        {"any": [a, b, c, d]},
        {"all": [a, {"any": [b, c, d]}]},
        {"all": [a, b, c, d]},
        {"any": [{"all": [a, b]}, {"all": [c, d]}]},
    ][j % 4]


@pytest.mark.parametrize("mode", ["queue", "inline"])
def test_concurrent_producers_drains_and_schedulers_miss_and_double_nothing(settings, mode):
    """Both registration modes (DESIGN 5): `inline` registers a success's events in its own
    transaction, so the drains only see the (empty) outbox and the schedulers do all the work."""
    settings.ASSET_REGISTRATION_MODE = mode
    assert TOTAL_EVENTS == 4000
    dags = [make_scheduled_dag(f"race_dag_{j}", _schedule(j)) for j in range(len(ASSETS))]
    assets = {a.name: a for a in Asset.objects.filter(name__in=ASSETS)}
    tis = make_running_tis("race_producer", PRODUCERS * TIS_PER_PRODUCER)
    rng = random.Random(20261130)
    expected_outlets = {ti.id: rng.sample(ASSETS, OUTLETS_PER_TI) for ti in tis}
    deadlocks_before = pg_deadlocks()

    producers_done = threading.Event()
    stop = threading.Event()
    stats = Counter()
    stats_lock = threading.Lock()
    phases = {}
    started = time.monotonic()

    def count(**amounts: int) -> None:
        with stats_lock:
            stats.update(amounts)

    def producer(n: int) -> None:
        local = random.Random(n)
        mine = tis[n * TIS_PER_PRODUCER : (n + 1) * TIS_PER_PRODUCER]
        work = [("ti", ti) for ti in mine] + [("ext", None)] * EXTERNAL_PER_PRODUCER
        local.shuffle(work)
        for kind, ti in work:
            if kind == "ti":
                succeed_ti(ti, [{"name": a, "uri": a} for a in expected_outlets[ti.id]])
            else:
                registration.register_external_event(
                    asset=assets[local.choice(ASSETS)], extra={"producer": n}
                )
            if local.random() < 0.1:
                time.sleep(local.uniform(0, 0.003))

    loops_may_run = threading.Event()
    loops_may_run.set()
    loops_idle = threading.Semaphore(0)

    def drainer(n: int) -> None:
        local = random.Random(100 + n)
        while not stop.is_set():
            if not loops_may_run.is_set():
                loops_idle.release()
                loops_may_run.wait()
                continue
            result = drain.drain(batch_size=local.randint(1, 40), time_budget=0.0)
            count(drain_calls=1, runs=result.runs_triggered)
            time.sleep(local.uniform(0, 0.01))

    def scheduler(n: int) -> None:
        local = random.Random(200 + n)
        while not stop.is_set():
            if not loops_may_run.is_set():
                loops_idle.release()
                loops_may_run.wait()
                continue
            result = scheduling.schedule_dags()
            count(schedule_calls=1, runs=len(result.run_ids))
            time.sleep(local.uniform(0, 0.01))

    def producers() -> None:
        try:
            run_in_threads([lambda n=n: producer(n) for n in range(PRODUCERS)], timeout=240)
        finally:
            phases["producers"] = time.monotonic() - started
            producers_done.set()

    def closer() -> None:
        """After the producers: one event per asset, then wait for everything to settle."""
        producers_done.wait(300)
        try:
            # Only once every producer's outbox row is registered: a closing event consumed
            # before a late registration would leave that registration's rows waiting.
            deadline = time.monotonic() + 120
            while AssetEventQueue.objects.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            phases["outbox_empty"] = time.monotonic() - started
            # The closing events land while the schedulers (and the drains, which schedule the
            # Dags of each batch they commit) wait, so every Dag's next pass sees all of them at
            # once and its condition is true over all its queued rows.
            loops_may_run.clear()
            for _ in range(4):
                assert loops_idle.acquire(timeout=30)
            for name in ASSETS:
                registration.register_external_event(asset=assets[name], extra={"closing": True})
            loops_may_run.set()
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if not AssetEventQueue.objects.exists() and not AssetDagRunQueue.objects.exists():
                    break
                time.sleep(0.05)
        finally:
            stop.set()
            loops_may_run.set()

    run_in_threads(
        [producers, closer]
        + [lambda n=n: drainer(n) for n in range(2)]
        + [lambda n=n: scheduler(n) for n in range(2)],
        timeout=360,
    )
    elapsed = time.monotonic() - started

    report = consumption_report()
    figure(
        f"race ({mode} mode): {report['events']} events, {report['runs']} runs, "
        f"{report['consumptions']} consumptions, {stats['drain_calls']} drain calls, "
        f"{stats['schedule_calls']} scheduler calls, {elapsed:.1f} s"
    )
    assert AssetEventQueue.objects.count() == 0
    assert AssetEventQueue.objects.filter(parked_at__isnull=False).count() == 0
    assert AssetDagRunQueue.objects.count() == 0
    assert report["events"] == TOTAL_EVENTS + len(ASSETS)
    assert report["runs"] == stats["runs"] > 0
    assert report["missed"] == 0
    assert report["foreign"] == 0
    assert report["doubled"] == 0
    assert report["empty_runs"] == 0
    # Each asset has 4 Dags: every event is consumed exactly 4 times in all.
    assert report["consumptions"] == 4 * report["events"]
    # Every TI's outlets became exactly its events, once.
    got = {}
    for ti_id, name in AssetEvent.objects.filter(source_ti_id__isnull=False).values_list(
        "source_ti_id", "asset__name"
    ):
        got.setdefault(ti_id, []).append(name)
    assert {k: sorted(v) for k, v in got.items()} == {
        k: sorted(v) for k, v in expected_outlets.items()
    }
    assert AssetEvent.objects.filter(source_ti_id__isnull=True).count() == (
        PRODUCERS * EXTERNAL_PER_PRODUCER + len(ASSETS)
    )
    assert pg_deadlocks() == deadlocks_before
    assert len(dags) == 8
