"""Burst: 500 concurrent success calls, 300 outlets each, against the production setup.

The server runs the way the README runs production: `gunicorn project.wsgi -w 4` on PostgreSQL,
DEBUG off, with a `python manage.py qcluster` draining the outbox. 500 client threads wait on one
barrier and then each send one `PATCH /execution/task-instances/{id}/state` success with 300
outlets (a ~25 kB body). Every call must be answered, none with a 5xx, every one 204; then the
cluster registers all 150,000 events (each TI's outlets exactly once) and the downstream Dag
consumes its share. Peak server RSS (gunicorn master + workers, sampled every 20 ms) and the
latency percentiles are printed.
"""

import contextlib
import json
import statistics
import threading
import time

import psutil
import pytest
import requests
from django.conf import settings
from django.db.models import Count
from django.test import Client

from assets_app.models import AssetDagRunQueue, AssetEvent, AssetEventQueue, TaskInstance
from assets_app.outbox import drain

from .conftest import (
    consumption_report,
    figure,
    make_running_tis,
    make_scheduled_dag,
    run_in_threads,
)
from .workers import auth_headers, success_body

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CALLS = 500
OUTLETS = 300
ASSETS = [f"burst-{i}" for i in range(OUTLETS)]


class RssSampler:
    """Samples the summed RSS of a process tree until stopped; keeps the peak."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.peak_total = 0
        self.peak_single = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
                sizes = []
                for proc in procs:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        sizes.append(proc.memory_info().rss)
                self.peak_total = max(self.peak_total, sum(sizes))
                self.peak_single = max(self.peak_single, max(sizes, default=0))
            except psutil.NoSuchProcess:
                return
            time.sleep(0.02)

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def test_500_concurrent_successes_with_300_outlets_each(servers):
    make_scheduled_dag("burst_downstream", {"any": ASSETS[:3]})
    tis = make_running_tis("burst_producer", CALLS)
    web = servers("gunicorn", workers=4)
    cluster = servers("qcluster")
    # Encoded up front so the 500 client threads spend their time waiting on the server.
    bodies = {ti.id: json.dumps(success_body(ASSETS)).encode() for ti in tis}
    headers = {ti.id: {**auth_headers(ti.id), "Content-Type": "application/json"} for ti in tis}
    barrier = threading.Barrier(CALLS)
    latencies: list[float] = []
    statuses: list[int] = []
    lock = threading.Lock()

    def call(ti_id) -> None:
        barrier.wait(60)
        started = time.monotonic()
        response = requests.patch(
            f"{web.url}/execution/task-instances/{ti_id}/state",
            data=bodies[ti_id],
            headers=headers[ti_id],
            timeout=120,
        )
        elapsed = time.monotonic() - started
        with lock:
            latencies.append(elapsed)
            statuses.append(response.status_code)

    with RssSampler(web.pid) as rss:
        started = time.monotonic()
        run_in_threads([lambda t=ti.id: call(t) for ti in tis], timeout=180)
        burst_seconds = time.monotonic() - started

        def registered() -> bool:
            return not AssetEventQueue.objects.exists() and not AssetDagRunQueue.objects.exists()

        deadline = time.monotonic() + 180
        while not registered() and time.monotonic() < deadline:
            time.sleep(0.2)
        drain_seconds = time.monotonic() - started - burst_seconds

    latencies.sort()
    p50 = statistics.median(latencies)
    p99 = latencies[int(len(latencies) * 0.99) - 1]
    report = consumption_report()
    figure(
        f"burst: {len(statuses)} calls x {OUTLETS} outlets against gunicorn -w 4: "
        f"statuses {sorted(set(statuses))}, answered in {burst_seconds:.1f} s, "
        f"latency p50 {p50 * 1000:.0f} ms p99 {p99 * 1000:.0f} ms "
        f"max {latencies[-1] * 1000:.0f} ms; "
        f"peak server RSS {rss.peak_total / 2**20:.0f} MiB total "
        f"(largest process {rss.peak_single / 2**20:.0f} MiB); "
        f"{report['events']} events registered {drain_seconds:.1f} s after the burst, "
        f"{report['runs']} downstream runs"
    )
    assert len(statuses) == CALLS
    assert [s for s in statuses if s >= 500] == []
    assert set(statuses) == {204}
    assert registered(), cluster.log_tail()
    assert TaskInstance.objects.filter(state="success").count() == CALLS
    assert report["events"] == CALLS * OUTLETS
    per_ti = (
        AssetEvent.objects.values("source_ti_id")
        .annotate(n=Count("id"), assets=Count("asset", distinct=True))
        .values_list("n", "assets")
    )
    assert sorted(set(per_ti)) == [(OUTLETS, OUTLETS)]
    assert len(per_ti) == CALLS
    assert (report["missed"], report["foreign"], report["doubled"], report["empty_runs"]) == (
        0,
        0,
        0,
        0,
    )


def test_a_100000_outlet_success_is_registered_completely_in_bounded_transactions():
    """A success with 100,000 outlets (a ~7 MB body, under the 10 MB limit) is accepted at the
    worker API door and registered completely by the drain, no transaction registering more
    than ASSET_QUEUE_BATCH_OUTLETS events: every outlet becomes exactly one event, and the
    Dag scheduled on three of them consumes each once."""
    outlets = 100_000
    names = [f"huge-{i}" for i in range(outlets)]
    make_scheduled_dag("huge_downstream", {"any": names[:3]})
    (ti,) = make_running_tis("huge_producer", 1)
    body = json.dumps(success_body(names)).encode()
    response = Client().patch(
        f"/execution/task-instances/{ti.id}/state",
        data=body,
        content_type="application/json",
        headers=auth_headers(ti.id),
    )
    assert response.status_code == 204, response.content[:500]
    (row,) = AssetEventQueue.objects.all()
    assert row.outlet_count == outlets

    budget = settings.ASSET_QUEUE_BATCH_OUTLETS
    started = time.monotonic()
    written = []
    while AssetEventQueue.objects.exists():
        assert time.monotonic() - started < 600, "the drain did not finish the row"
        batch = drain.drain_batch()
        assert batch.failed == 0
        written.append(batch.events_written)
    figure(
        f"huge success: {outlets:,} outlets ({len(body) / 2**20:.1f} MiB) registered in "
        f"{len(written)} transactions of at most {max(written):,} events, "
        f"{time.monotonic() - started:.1f} s"
    )
    assert max(written) <= budget
    assert sum(written) == outlets
    assert AssetEvent.objects.filter(source_ti_id=ti.id).count() == outlets
    assert AssetEvent.objects.values("asset_id").distinct().count() == outlets
    report = consumption_report()  # the 3 events the downstream Dag waits on: consumed once
    assert (report["missed"], report["foreign"], report["doubled"]) == (0, 0, 0)
    assert report["runs"] >= 1
