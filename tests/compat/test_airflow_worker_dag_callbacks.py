"""Dag-level callbacks run by the stock worker (issue 39): a Dag file's `on_success_callback`
and `on_failure_callback` run in `bin/airflow-worker` once per run finish, with the context
Airflow 3.3.2's dag-processor builds (`_execute_dag_callbacks`: the relevant TI's template
context and `reason`); a callback that raises is recorded as the request's failure, the next
one still runs and the run's state stays as it was. Before, the ledger refused these Dags."""

import json
import subprocess
import textwrap

import pytest
from django.conf import settings
from django.core.management import call_command

from assets_app.models import CallbackState, DagCallbackRequest, DagRun
from tests.compat.airflow_worker_env import synced_dag_folder

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

DAGS = textwrap.dedent(
    """
    import json
    import os

    from airflow.sdk import dag, task

    OUT = os.environ["CALLBACK_OUT"]


    def record(context):
        with open(OUT, "a") as out:
            out.write(json.dumps({
                "dag_id": context["dag"].dag_id,
                "reason": context["reason"],
                "keys": sorted(context),
                "ti": context["ti"].task_id,
                "run_id": context["run_id"],
                "dag_run_state": str(context["dag_run"].state),
            }) + "\\n")


    def boom(context):
        raise RuntimeError("Boom from on_failure_callback")


    @dag(dag_id="fine", schedule=None, is_paused_upon_creation=False,
         on_success_callback=record)
    def fine():
        @task
        def first():
            return 1

        @task
        def last(x):
            return x

        last(first())


    @dag(dag_id="broken", schedule=None, is_paused_upon_creation=False,
         on_failure_callback=[boom, record])
    def broken():
        @task
        def fails():
            raise ValueError("no")

        fails()


    fine()
    broken()
    """
)

# Keys of Airflow 3.3.2's task template context (`RuntimeTaskInstance.get_template_context`)
# that a Dag callback sees, and the `reason` the processor adds.
EXPECTED_KEYS = {
    "dag",
    "dag_run",
    "ti",
    "task_instance",
    "task",
    "run_id",
    "reason",
    "params",
    "macros",
    "var",
    "conn",
    "outlet_events",
    "inlet_events",
    "triggering_asset_events",
}


@pytest.mark.timeout(900)
def test_dag_callbacks_run_once_per_finish_with_airflows_context(servers, tmp_path):
    web = servers("gunicorn")
    out = tmp_path / "callbacks.jsonl"
    base, env = synced_dag_folder(
        tmp_path,
        web.url,
        {"callbacks.py": DAGS},
        worker_key=settings.WORKER_API_KEY,
        env={"CALLBACK_OUT": str(out)},
    )
    call_command("trigger_dag", "fine")
    call_command("trigger_dag", "broken")
    done = subprocess.run(
        [*base, "--no-sync", "--concurrency", "2", "--idle-exit", "15"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    states = dict(DagRun.objects.values_list("dag_id", "state"))
    assert states == {"fine": "success", "broken": "failed"}, done.stderr[-5000:]
    callback_logs = "".join(p.read_text() for p in (tmp_path / "logs").glob("dag_callbacks/*"))
    why = f"{done.stderr[-4000:]}\n--- callback logs\n{callback_logs[-4000:]}"
    assert out.exists(), why
    seen = {line["dag_id"]: line for line in map(json.loads, out.read_text().splitlines())}
    assert len(out.read_text().splitlines()) == 2, why  # once per finish
    fine, broken = seen["fine"], seen["broken"]
    assert (fine["reason"], fine["ti"], fine["dag_run_state"]) == ("success", "last", "success")
    assert (broken["reason"], broken["ti"], broken["dag_run_state"]) == (
        "task_failure",
        "fails",
        "failed",
    )
    assert fine["run_id"] == DagRun.objects.get(dag_id="fine").run_id
    for line in (fine, broken):
        assert set(line["keys"]) >= EXPECTED_KEYS, line["keys"]
    requests = {r.dag_id: r for r in DagCallbackRequest.objects.all()}
    assert requests["fine"].state == CallbackState.SUCCESS
    assert requests["broken"].state == CallbackState.FAILED
    assert "Boom from on_failure_callback" in requests["broken"].last_error
    assert requests["broken"].attempts == 1
