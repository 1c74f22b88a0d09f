"""Issue 42's watermark acceptance: a Dag file using Airflow 3.3's task and asset state store
(AIP-103), run three times through the stock Task SDK worker (`bin/airflow-worker`), reads back
what it wrote. Before the service served `/store/...`, every read was a 404 the SDK takes for
"no value": the watermark started from nothing on every run, silently.

Run 1's first try writes its task state and fails; the retry reads it (task state is shared by
the tries of a TI). Each successful run advances a watermark on the asset; runs 2 and 3 read
the one the run before wrote (asset state outlives runs), and their own task state starts empty
(it is per run)."""

import json
import textwrap
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command

from assets_app.models import AssetStateStore, Dag, DagRun, TaskInstance, TaskStateStore, XCom
from tests.compat.airflow_worker_env import start, stop, synced_dag_folder, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]

DAG = textwrap.dedent(
    """
    from datetime import timedelta

    from airflow.sdk import Asset, dag, task
    from airflow.sdk.execution_time.context import NEVER_EXPIRE

    ORDERS = Asset(name="wm_orders", uri="s3://warehouse/wm_orders")

    @dag(dag_id="watermark", schedule=None, is_paused_upon_creation=False)
    def watermark():
        @task(inlets=[ORDERS], outlets=[ORDERS], retries=1, retry_delay=timedelta(seconds=0))
        def load(asset_state_store=None, task_state_store=None, ti=None):
            state = asset_state_store[ORDERS]
            runs = state.get("runs", default=0)
            previous = state.get("watermark", default="start")
            seen = task_state_store.get("attempt")
            if runs == 0 and seen is None:
                task_state_store.set("attempt", ti.try_number, retention=NEVER_EXPIRE)
                raise RuntimeError("the first try fails after writing its task state")
            state.set("runs", runs + 1)
            state.set("watermark", f"after-run-{runs + 1}")
            task_state_store.set("done", {"watermark": previous})
            return {"runs_before": runs, "watermark_before": previous, "attempt_seen": seen}

        load()

    watermark()
    """
)


def _finished(run: DagRun) -> bool:
    run.refresh_from_db()
    return run.state in ("success", "failed")


@pytest.mark.timeout(1500)
def test_a_watermark_dag_run_three_times_reads_back_what_it_wrote(module_web, tmp_path):
    base, env = synced_dag_folder(
        tmp_path, module_web.url, {"watermark.py": DAG}, worker_key=settings.WORKER_API_KEY
    )
    log = tmp_path / "worker.log"
    # One worker for the three runs, each triggered once the one before has ended.
    worker = start([*base, "--no-sync", "--concurrency", "1"], env, log)
    returned = []
    try:
        for _ in range(3):
            call_command("trigger_dag", "watermark")
            run = DagRun.objects.order_by("-id").first()
            wait_for(lambda run=run: _finished(run), seconds=600, what="the run's end", logs=[log])
            ti = TaskInstance.objects.get(dag_run=run)
            assert ti.state == "success", log.read_text()[-3000:]
            returned.append(
                (
                    ti.try_number,
                    XCom.objects.get(run_id=run.run_id, task_id="load", key="return_value").value,
                )
            )
        assert worker.poll() is None, log.read_text()[-3000:]  # the worker did not stop early
    finally:
        stop(worker)

    assert returned == [
        (2, {"runs_before": 0, "watermark_before": "start", "attempt_seen": 1}),
        (1, {"runs_before": 1, "watermark_before": "after-run-1", "attempt_seen": None}),
        (1, {"runs_before": 2, "watermark_before": "after-run-2", "attempt_seen": None}),
    ]
    assert dict(AssetStateStore.objects.values_list("key", "value")) == {
        "runs": "3",
        "watermark": '"after-run-3"',
    }
    writer = AssetStateStore.objects.get(key="runs")
    assert (writer.last_updated_by_kind, writer.last_updated_by_task_id) == ("task", "load")
    # Per run: run 1 kept its first try's key (NEVER_EXPIRE: no expiry) beside its "done".
    keys = sorted(TaskStateStore.objects.values_list("run_id", "key", "expires_at"))
    first_run = DagRun.objects.order_by("id").first().run_id
    assert (first_run, "attempt", None) in keys
    assert [k for _, k, _ in keys].count("done") == 3
    # "done" used the default retention: an expiry the worker resolved (30 days).
    assert all(expires is not None for _, key, expires in keys if key == "done")


EXAMPLES = ROOT / ".venv-airflow-worker/lib/python3.11/site-packages/airflow/example_dags"


@pytest.mark.timeout(1500)
def test_airflows_own_state_store_examples_succeed(module_web, tmp_path):
    """Airflow 3.3.2's `example_task_state_store` (the retry reattaches to the job its first try
    stored), `example_task_state_store_mapped` (a key per map index) and
    `example_asset_state_store` (the producer advances a watermark on the asset,
    the asset-triggered consumer reads it), as shipped, through the stock worker."""
    names = ("example_task_state_store", "example_task_state_store_mapped")
    names += ("example_asset_state_store",)
    files = {f"{n}.py": (EXAMPLES / f"{n}.py").read_text() for n in names}
    base, env = synced_dag_folder(
        tmp_path, module_web.url, files, worker_key=settings.WORKER_API_KEY
    )
    # New Dags are paused at creation (as Airflow's DAGS_ARE_PAUSED_AT_CREATION): unpause them.
    assert Dag.objects.filter(dag_id__startswith="example_").count() == 4
    Dag.objects.filter(dag_id__startswith="example_").update(is_paused=False)
    log = tmp_path / "worker.log"
    worker = start([*base, "--no-sync", "--concurrency", "2"], env, log)
    try:
        manual = ("example_task_state_store", "example_task_state_store_mapped")
        for dag_id in (*manual, "example_asset_state_store_producer"):
            call_command("trigger_dag", dag_id)
        runs = DagRun.objects.filter(dag__dag_id__startswith="example_")
        wait_for(
            lambda: not runs.exclude(state__in=["success", "failed"]).exists(),
            seconds=900,
            what="the three runs' end",
            logs=[log],
        )
        # The producer's event becomes the consumer's run (no django-q cluster runs here).
        call_command("drain_asset_queue", "--once")
        call_command("run_scheduler", "--once")
        assert runs.count() == 4, log.read_text()[-3000:]
        wait_for(
            lambda: not runs.exclude(state__in=["success", "failed"]).exists(),
            seconds=900,
            what="the consumer run's end",
            logs=[log],
        )
        assert worker.poll() is None, log.read_text()[-3000:]  # the worker did not stop early
    finally:
        stop(worker)
    stderr = log.read_text()
    states = {
        (ti.dag_id, ti.task_id, ti.map_index): (ti.state, ti.try_number)
        for ti in TaskInstance.objects.filter(dag_id__startswith="example_")
    }
    assert states == {
        ("example_task_state_store", "run_job", -1): ("success", 2),
        ("example_task_state_store_mapped", "get_tables", -1): ("success", 1),
        **{
            ("example_task_state_store_mapped", "process_table", i): ("success", 1)
            for i in range(3)
        },
        ("example_asset_state_store_producer", "load", -1): ("success", 1),
        ("example_asset_state_store_consumer", "consume", -1): ("success", 1),
    }, stderr[-3000:]
    job = TaskStateStore.objects.get(dag_id="example_task_state_store", key="job_id")
    assert job.value.startswith('"job-') and job.expires_at is None  # NEVER_EXPIRE
    assert set(
        TaskStateStore.objects.filter(dag_id="example_task_state_store").values_list(
            "key", flat=True
        )
    ) == {"job_id", "submitted_at", "status", "result"}
    # Mapped: each map index its own keys, its own result.
    mapped = TaskStateStore.objects.filter(dag_id="example_task_state_store_mapped", key="result")
    results = {row.map_index: json.loads(row.value) for row in mapped}
    assert {i: r["table"] for i, r in results.items()} == {
        0: "orders",
        1: "customers",
        2: "products",
    }
    assert all(r["map_index"] == i for i, r in results.items())
    keys = dict(AssetStateStore.objects.values_list("key", "value"))
    assert keys["total_runs"] == "1" and set(keys) == {
        "watermark",
        "total_runs",
        "last_run_summary",
    }
