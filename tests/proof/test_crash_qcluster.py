"""Crash: SIGKILL the django-q2 cluster in the middle of draining, again and again.

A real `python manage.py qcluster` (its whole process group: sentinel, pusher, monitor, workers)
drains the outbox, nudged on commit by 4 worker threads that keep finishing task instances with
10 outlets each. A killer waits a random moment after each (re)start, then watches for a drain
holding outbox row locks (a transaction mid-batch) and SIGKILLs the cluster; it restarts it at
once. After at least 12 kills (10 of them, at least, while a batch was open), the workers stop, the
last cluster drains everything (woken by one more success's nudge, the same path production
uses), and then: every successful TI's outlets became exactly its events, once; nothing is left in
the outbox or parked; every event was consumed exactly once by the downstream Dag.
"""

import random
import threading
import time

import pytest

from assets_app.models import AssetDagRunQueue, AssetEvent, AssetEventQueue, TaskInstance

from .conftest import (
    consumption_report,
    figure,
    holds_row_locks,
    make_running_tis,
    make_scheduled_dag,
    run_in_threads,
)
from .workers import succeed_ti

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ASSETS = [f"crash-q-{i}" for i in range(12)]
OUTLETS_PER_TI = 10
# Running TIs are made in batches of this size whenever the workers have used them all: how many
# the kill phase takes depends on the machine's load (1,460 to over 3,000 seen), so a fixed pool
# could run dry before the killer is done.
TI_BATCH = 500
MIN_KILLS = 12
MIN_MID_BATCH_KILLS = 10
MAX_KILLS = 30
# Workers pause while this many outbox rows wait: enough for every kill to find a batch open, and
# a backlog the last cluster drains in seconds, however slowly a loaded machine starts clusters.
MAX_BACKLOG = 150
# How long the killer waits for a (re)started cluster to open a batch: a cluster's start (Django
# import, django-q2 spawn) took over 5 s on a loaded 2-core machine.
OPEN_BATCH_WAIT = 30
CLUSTER_ENV = {
    "Q_CLUSTER_WORKERS": "2",
    # A killed drain task's broker row is redelivered after `retry`: keep it short.
    "Q_CLUSTER_TIMEOUT": "10",
    "Q_CLUSTER_RETRY": "15",
    # Small batches: a drain is many short transactions, like a busy production queue.
    "ASSET_QUEUE_BATCH_SIZE": "10",
    "ASSET_DRAIN_TIME_BUDGET_SECONDS": "5",
    # The workers keep successes coming: a drain yielding to them would seldom have a batch
    # open for the killer to hit.
    "ASSET_DRAIN_YIELD_MAX_SECONDS": "0",
}


def test_sigkill_qcluster_mid_drain_loses_and_duplicates_nothing(servers):
    make_scheduled_dag("crash_q_downstream", {"any": ASSETS[:6]})
    rng = random.Random(11)
    outlets: dict = {}
    pending: list = []
    pending_lock = threading.Lock()

    def refill() -> None:
        """More running TIs, each with its outlets (caller holds `pending_lock`)."""
        tis = make_running_tis("crash_q_producer", TI_BATCH)
        outlets.update({ti.id: rng.sample(ASSETS, OUTLETS_PER_TI) for ti in tis})
        pending.extend(tis)

    refill()
    last = pending.pop()  # kept for the final success whose nudge wakes the last cluster
    succeeded: list = []
    stop_workers = threading.Event()

    def worker(n: int) -> None:
        local = random.Random(n)
        while not stop_workers.is_set():
            for _ in range(local.randint(1, 4)):
                with pending_lock:
                    if not pending:
                        refill()
                    ti = pending.pop()
                succeed_ti(ti, [{"name": a, "uri": a} for a in outlets[ti.id]])
                with pending_lock:
                    succeeded.append(ti)
            time.sleep(local.uniform(0.1, 0.4))
            while AssetEventQueue.objects.count() > MAX_BACKLOG and not stop_workers.is_set():
                time.sleep(0.1)

    cluster = servers("qcluster", env=CLUSTER_ENV)
    kills = 0
    mid_batch_kills = 0
    halt = threading.Event()  # the test has failed: start no cluster the teardown cannot see

    def killer() -> None:
        nonlocal kills, mid_batch_kills
        local = random.Random(99)
        try:
            while (
                not halt.is_set()
                and kills < MAX_KILLS
                and (kills < MIN_KILLS or mid_batch_kills < MIN_MID_BATCH_KILLS)
            ):
                time.sleep(local.uniform(0.2, 1.5))
                deadline = time.monotonic() + OPEN_BATCH_WAIT
                open_batch = holds_row_locks("assets_app_asseteventqueue")
                while not open_batch and time.monotonic() < deadline:
                    time.sleep(0.002)
                    open_batch = holds_row_locks("assets_app_asseteventqueue")
                cluster.kill()
                kills += 1
                mid_batch_kills += open_batch
                if halt.is_set():
                    return
                cluster.start()
        finally:
            stop_workers.set()

    started = time.monotonic()
    try:
        run_in_threads([killer] + [lambda n=n: worker(n) for n in range(4)], timeout=240)
    except BaseException:
        halt.set()
        stop_workers.set()
        raise
    kill_phase = time.monotonic() - started

    # One more success: its on-commit nudge wakes the last cluster, which drains everything due
    # (the rows of every batch a kill rolled back included).
    succeed_ti(last, [{"name": a, "uri": a} for a in outlets[last.id]])
    succeeded.append(last)

    def settled() -> bool:
        return not AssetEventQueue.objects.exists() and not AssetDagRunQueue.objects.exists()

    deadline = time.monotonic() + 90
    while not settled() and time.monotonic() < deadline:
        time.sleep(0.1)
    recovery = time.monotonic() - started - kill_phase
    cluster.kill()

    report = consumption_report()
    figure(
        f"crash qcluster: {kills} SIGKILLs ({mid_batch_kills} with a batch open), "
        f"{len(succeeded)} successes, {report['events']} events, {report['runs']} runs, "
        f"kill phase {kill_phase:.1f} s, recovery {recovery:.1f} s"
    )
    assert settled(), cluster.log_tail()
    assert kills >= MIN_KILLS
    assert mid_batch_kills >= MIN_MID_BATCH_KILLS
    assert AssetEventQueue.objects.filter(parked_at__isnull=False).count() == 0
    assert TaskInstance.objects.filter(state="success").count() == len(succeeded)
    got: dict = {}
    for ti_id, name in AssetEvent.objects.values_list("source_ti_id", "asset__name"):
        got.setdefault(ti_id, []).append(name)
    assert {k: sorted(v) for k, v in got.items()} == {
        ti.id: sorted(outlets[ti.id]) for ti in succeeded
    }
    assert report["events"] == len(succeeded) * OUTLETS_PER_TI
    assert (report["missed"], report["foreign"], report["doubled"], report["empty_runs"]) == (
        0,
        0,
        0,
        0,
    )
