"""Issue 39's silent divergence on Airflow's own `example_inlet_event_extra`: its readers read
`Asset("s3://output/1.txt")` while `example_outlet_event_extra`'s producers write
`Asset(name="test-asset", uri="s3://output/1.txt")`. On Airflow 3.3.2 one of the two is inactive
and the Task SDK fails its tasks before they run; before the service answered the inlet check as
Airflow does, both readers succeeded here (the classic one echoing the producers' extra).

Both files, as shipped, through the stock Task SDK worker (`bin/airflow-worker`): the producers
succeed (their asset, an outlet's, wins), the readers fail without running and push nothing."""

from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command

from assets_app.models import AssetEvent, Dag, DagRun, TaskInstance, XCom
from tests.compat.airflow_worker_env import start, stop, synced_dag_folder, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / ".venv-airflow-worker/lib/python3.11/site-packages/airflow/example_dags"
PRODUCERS = (
    "asset_with_extra_by_context",
    "asset_with_extra_by_yield",
    "asset_with_extra_from_classic_operator",
)
READERS = ("read_asset_event", "read_asset_event_from_classic")


def _runs_ended(dag_ids) -> bool:
    runs = DagRun.objects.filter(dag_id__in=dag_ids)
    return (
        runs.count() == len(dag_ids) and not runs.exclude(state__in=["success", "failed"]).exists()
    )


@pytest.mark.timeout(1500)
def test_airflows_inlet_event_extra_readers_fail_on_their_inactive_inlet(module_web, tmp_path):
    files = {
        name: (EXAMPLES / name).read_text()
        for name in ("example_inlet_event_extra.py", "example_outlet_event_extra.py")
    }
    base, env = synced_dag_folder(
        tmp_path, module_web.url, files, worker_key=settings.WORKER_API_KEY
    )
    assert set(Dag.objects.values_list("dag_id", flat=True)) == {*PRODUCERS, *READERS}
    Dag.objects.update(is_paused=False)
    log = tmp_path / "worker.log"
    # One worker for both rounds: the readers are triggered once the producers' runs ended.
    worker = start([*base, "--no-sync", "--concurrency", "2"], env, log)
    try:
        for dag_id in PRODUCERS:
            call_command("trigger_dag", dag_id)
        wait_for(lambda: _runs_ended(PRODUCERS), seconds=900, what="the producers' end", logs=[log])
        call_command("drain_asset_queue", "--once")  # no django-q cluster runs here
        # The producers' events exist: a reader that ran would find one.
        assert AssetEvent.objects.filter(asset__name="test-asset").count() == 3
        for dag_id in READERS:
            call_command("trigger_dag", dag_id)
        wait_for(lambda: _runs_ended(READERS), seconds=900, what="the readers' end", logs=[log])
        assert worker.poll() is None, log.read_text()[-3000:]  # the worker did not stop early
    finally:
        stop(worker)
    stderr = log.read_text()
    states = dict(TaskInstance.objects.values_list("dag_id", "state"))
    assert states == {
        **dict.fromkeys(PRODUCERS, "success"),
        **dict.fromkeys(READERS, "failed"),
    }, stderr[-3000:]
    assert not XCom.objects.filter(dag_id__in=READERS).exists()
    logs = "".join(p.read_text() for p in (tmp_path / "logs").rglob("*") if p.is_file())
    assert "AirflowInactiveAssetInInletOrOutletException" in logs
