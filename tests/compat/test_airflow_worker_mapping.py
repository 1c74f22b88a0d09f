"""Issue 25 end to end: the stock Task SDK worker (`bin/airflow-worker`, task-sdk 1.3.2, Airflow's
own supervisor) runs a DAG file that expands a task over an upstream's returned list: the
service expands it when the upstream succeeds (the length the SDK pushed), every map index
runs, the downstream sums their XComs through the lazy sequence, and each map index's outlet
event reaches the consumer Dag exactly once. The access log shows no refused route.
MAPPING_E2E_WIDTH (default 50) sets the width and MAPPING_E2E_CONCURRENCY (default 4) the
worker's concurrency: the issue's size is `MAPPING_E2E_WIDTH=1000 MAPPING_E2E_CONCURRENCY=16`."""

import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import requests
from django.contrib.auth import get_user_model

from assets_app.api.public_auth import create_api_token
from assets_app.models import (
    AssetDagRunQueue,
    AssetEvent,
    DagRun,
    DagRunAssetEvent,
    DagRunState,
    TaskInstance,
    XCom,
)
from tests.compat.airflow_worker_env import run_worker
from tests.proof.conftest import figure

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
WIDTH = int(os.environ.get("MAPPING_E2E_WIDTH", "50"))
GROUP_WIDTH = 8
CONCURRENCY = int(os.environ.get("MAPPING_E2E_CONCURRENCY", "4"))
# The worker's bound on its own run: a stock supervisor takes about 2 s of CPU per TI here.
MAX_SECONDS = max(1000, 6 * WIDTH)

DAG_FILE = """
from airflow.sdk import Asset, dag, task, task_group

PARTS = Asset(name="mapped_parts", uri="file:///tmp/mapped_parts")


@dag(dag_id="mapped_fan_out", schedule=None, is_paused_upon_creation=False)
def mapped_fan_out():
    @task
    def numbers():
        return list(range(WIDTH))

    @task(outlets=[PARTS])
    def square(n):
        return n * n

    @task
    def total(values):
        return sum(values)

    total(square.expand(n=numbers()))

    # expand_kwargs over an upstream's list of dicts, and a cross product of two literals: the
    # service counts the map indexes, the Task SDK resolves each one's arguments.
    @task
    def pairs():
        return [{"a": i, "b": i + 1} for i in range(3)]

    @task
    def add(a, b):
        return a + b

    @task
    def mul(x, y):
        return x * y

    @task
    def collect(sums, products, scaled):
        return {"sums": sorted(sums), "products": sorted(products), "scaled": sorted(scaled)}

    # ... and .map over it: one map index per pair, the function applied by the Task SDK.
    listed = pairs()
    collect(
        add.expand_kwargs(listed),
        mul.expand(x=[1, 2], y=[10, 20, 30]),
        add.override(task_id="add_scaled").expand_kwargs(
            listed.map(lambda p: {"a": p["a"] * 100, "b": p["b"]})
        ),
    )

    # A mapped task group over an upstream's list (issue 25): map index i of `plus_one` runs
    # after map index i of `times_ten` only, pulling its XCom with ?map_index=i.
    @task
    def seeds():
        return list(range(GROUP_WIDTH))

    @task_group
    def per_seed(n):
        @task
        def times_ten(n):
            return n * 10

        @task
        def plus_one(m):
            return m + 1

        return plus_one(times_ten(n))

    @task
    def group_total(values):
        return sorted(values)

    group_total(per_seed.expand(n=seeds()))


@dag(dag_id="mapped_parts_consumer", schedule=[PARTS], is_paused_upon_creation=False)
def mapped_parts_consumer():
    @task
    def count(**context):
        return len(context["triggering_asset_events"][PARTS])

    count()


mapped_fan_out()
mapped_parts_consumer()
"""


def _worker(service, tmp_path, dags: Path, *args: str) -> subprocess.CompletedProcess:
    return run_worker(service, tmp_path, dags, *args, timeout=MAX_SECONDS + 200)


def _settled() -> bool:
    """Nothing is queued for the consumer Dag and no run of either Dag is left to do."""
    return (
        not AssetDagRunQueue.objects.exists()
        and not DagRun.objects.filter(state__in=[DagRunState.QUEUED, DagRunState.RUNNING]).exists()
    )


@pytest.mark.timeout(2 * MAX_SECONDS + 800)
def test_stock_worker_runs_a_task_expanded_over_an_upstreams_list(service, tmp_path):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "fan_out.py").write_text(
        DAG_FILE.replace("GROUP_WIDTH", str(GROUP_WIDTH)).replace("WIDTH", str(WIDTH))
    )
    get_user_model().objects.create_superuser("operator", password="x")
    _, key = create_api_token(username="operator", name="mapping")
    synced = _worker(service, tmp_path, dags, "--sync-only")
    assert synced.returncode == 0, synced.stderr[-3000:]
    answer = requests.post(
        f"{service['url']}/api/v2/dags/mapped_fan_out/dagRuns",
        json={"logical_date": None, "conf": {}},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert answer.status_code == 200, answer.text

    started = time.monotonic()
    ran = _worker(
        service,
        tmp_path,
        dags,
        "--no-sync",
        "--concurrency",
        str(CONCURRENCY),
        "--idle-exit",
        "20",
        "--max-seconds",
        str(MAX_SECONDS),
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    # The consumer Dag's last runs may come after the worker's idle exit: under CI load a
    # scheduler pass can lag the events it consumes by more than 20 s (the 1-minute sweep
    # bounds it). Then the worker runs again, idling out past one sweep, until nothing is queued
    # for the consumer and no run is left to do; the assertions below still need every event.
    for _ in range(2):
        if _settled():
            break
        again = _worker(
            service,
            tmp_path,
            dags,
            "--no-sync",
            "--concurrency",
            str(CONCURRENCY),
            "--idle-exit",
            "70",
            "--max-seconds",
            str(MAX_SECONDS),
        )
        assert again.returncode == 0, again.stderr[-3000:]
    elapsed = time.monotonic() - started

    fan_out = TaskInstance.objects.filter(dag_id="mapped_fan_out")
    assert sorted(fan_out.filter(task_id="square").values_list("map_index", "state")) == [
        (i, "success") for i in range(WIDTH)
    ], ran.stderr[-4000:]
    others = fan_out.exclude(task_id="square").values_list("task_id", "map_index", "state")
    assert set(others) == {
        ("numbers", -1, "success"),
        ("total", -1, "success"),
        ("pairs", -1, "success"),
        *(("add", i, "success") for i in range(3)),
        *(("add_scaled", i, "success") for i in range(3)),
        *(("mul", i, "success") for i in range(6)),
        ("collect", -1, "success"),
        ("seeds", -1, "success"),
        *(("per_seed.times_ten", i, "success") for i in range(GROUP_WIDTH)),
        *(("per_seed.plus_one", i, "success") for i in range(GROUP_WIDTH)),
        ("group_total", -1, "success"),
    }, ran.stderr[-4000:]
    assert XCom.objects.get(task_id="group_total").value == [10 * i + 1 for i in range(GROUP_WIDTH)]
    # Each plus_one ran after its own times_ten (the group's per-index dependency).
    group = {
        (ti.task_id, ti.map_index): ti for ti in fan_out.filter(task_id__startswith="per_seed.")
    }
    for i in range(GROUP_WIDTH):
        assert group["per_seed.plus_one", i].start_date >= group["per_seed.times_ten", i].end_date
    assert XCom.objects.get(task_id="collect").value == {
        "sums": [1, 3, 5],
        "products": [10, 20, 20, 30, 40, 60],
        "scaled": [1, 102, 203],
    }
    assert XCom.objects.get(task_id="numbers").mapped_length == WIDTH
    assert XCom.objects.get(task_id="total").value == sum(i * i for i in range(WIDTH))
    # Each map index's outlet event, registered once with its map index, consumed once.
    events = AssetEvent.objects.filter(asset__name="mapped_parts")
    assert sorted(events.values_list("source_map_index", flat=True)) == list(range(WIDTH))
    consumed = DagRunAssetEvent.objects.filter(dag_id="mapped_parts_consumer")
    assert sorted(consumed.values_list("asset_event_id", flat=True)) == sorted(
        events.values_list("id", flat=True)
    )
    counts = XCom.objects.filter(dag_id="mapped_parts_consumer", task_id="count")
    assert sum(counts.values_list("value", flat=True)) == WIDTH
    figure(
        f"airflow worker: {WIDTH}-wide mapped task end to end in {elapsed:.0f}s, "
        f"concurrency {CONCURRENCY}"
    )

    lines = service["log"].read_text().splitlines()
    seen = [line for line in lines if re.search(r'"[A-Z]+ /(execution|api/v2)/', line)]
    # The lazy sequence of `values` ends where its next item is a 404 (the Task SDK's
    # LazyXComIterator stops on XCOM_NOT_FOUND, as against Airflow): that one is expected.
    ends = (
        f"/square/return_value/item/{WIDTH} ",
        "/add/return_value/item/3 ",
        "/add_scaled/return_value/item/3 ",
        "/mul/return_value/item/6 ",
        f"/per_seed.plus_one/return_value/item/{GROUP_WIDTH} ",
    )
    bad = [
        line
        for line in seen
        if re.search(r'" (404|405|5\d\d) ', line) and not any(end in line for end in ends)
    ]
    assert not bad, "\n".join(bad[:20])
