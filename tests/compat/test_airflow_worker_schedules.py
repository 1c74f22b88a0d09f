"""Issue 24's fourth acceptance item: an Airflow DAG file with `schedule="@daily"` and one with
`CronTriggerTimetable(..., timezone="Europe/Zurich")` sync through `bin/airflow-worker`, the
time scheduler creates their due runs, and the stock Task SDK supervisor runs them with
`{{ ds }}` and `{{ data_interval_start }}` rendered from the run's dates; so does the tick run
of an `AssetOrTimeSchedule` DAG file (its asset half synced as its schedule).
"""

import datetime as dt
import subprocess
import textwrap
from zoneinfo import ZoneInfo

import pytest

from assets_app.models import DagRun, TaskInstance, XCom
from assets_app.scheduling import time_runs as time_scheduling
from tests.compat.test_airflow_worker import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

DAG_FILE = """
import pendulum
from airflow.sdk import DAG, BaseOperator
from airflow.sdk import Asset
from airflow.sdk.definitions.timetables.assets import AssetOrTimeSchedule
from airflow.timetables.trigger import CronTriggerTimetable


class Echo(BaseOperator):
    template_fields = ("value",)

    def __init__(self, value, **kwargs):
        super().__init__(**kwargs)
        self.value = value

    def execute(self, context):
        return self.value


START = pendulum.now("UTC").subtract(days=3).start_of("day")
for dag_id, schedule in (
    ("{prefix}_daily", "@daily"),
    ("{prefix}_zurich", CronTriggerTimetable("0 3 * * *", timezone="Europe/Zurich")),
    ("{prefix}_either", AssetOrTimeSchedule(
        timetable=CronTriggerTimetable("@daily", timezone="UTC"), assets=[Asset("tt_input")])),
):
    with DAG(
        dag_id, schedule=schedule, start_date=START, catchup=False, is_paused_upon_creation=False
    ):
        Echo(task_id="echo", value="{{{{ ds }}}} {{{{ data_interval_start }}}}")
"""


@pytest.mark.timeout(1200)
def test_time_scheduled_dag_files_run_on_the_stock_supervisor(service, tmp_path):
    folder = tmp_path / "dags"
    folder.mkdir()
    (folder / "timed.py").write_text(textwrap.dedent(DAG_FILE.format(prefix="tt")))

    def worker(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                str(ROOT / "bin/airflow-worker"),
                "--dags",
                str(folder),
                "--url",
                service["url"],
                "--logs",
                str(tmp_path / "logs"),
                *args,
            ],
            env={**service["env"], "AIRFLOW_HOME": str(tmp_path / "airflow-home")},
            capture_output=True,
            text=True,
            timeout=900,
        )

    synced = worker("--sync-only")
    assert synced.returncode == 0, synced.stderr[-3000:]
    # The service's own cluster runs the time scheduler too (a sweep): on a loaded machine it may
    # create the due runs before this pass does. Either way each Dag has exactly its one due run.
    time_scheduling.create_due_runs()
    assert sorted(
        DagRun.objects.filter(dag__dag_id__startswith="tt_").values_list("dag_id", flat=True)
    ) == ["tt_daily", "tt_either", "tt_zurich"]
    ran = worker("--no-sync", "--concurrency", "2", "--idle-exit", "15", "--max-seconds", "600")
    assert ran.returncode == 0, ran.stderr[-3000:]
    for dag_id in ("tt_daily", "tt_zurich", "tt_either"):
        run = DagRun.objects.get(dag_id=dag_id)
        assert run.run_type == "scheduled" and run.run_id.startswith("scheduled__")
        ti = TaskInstance.objects.get(dag_run=run)
        assert ti.state == "success", ran.stderr[-3000:]
        value = XCom.objects.get(dag_id=dag_id, task_id="echo", key="return_value").value
        logical = run.logical_date.astimezone(dt.UTC)
        ds, start = value.split(" ", 1)
        assert ds == logical.date().isoformat()
        assert dt.datetime.fromisoformat(start) == run.data_interval_start
    zurich = DagRun.objects.get(dag_id="tt_zurich").logical_date
    # The latest 03:00 on Zurich's wall clock.
    local = zurich.astimezone(ZoneInfo("Europe/Zurich"))
    assert (local.hour, local.minute) == (3, 0)
