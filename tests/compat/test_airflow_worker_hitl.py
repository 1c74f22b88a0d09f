"""Issue 42's Human-in-the-loop acceptance: a Dag file with two `ApprovalOperator`s, run by the
stock Task SDK worker (`bin/airflow-worker`), parks both in `awaiting_input` (Airflow 3.3's
`TaskAwaitingInput`: no trigger, no triggerer); both are answered through the public API
(`PATCH .../hitlDetails`), the worker resumes each in `execute_complete` with the response, the
approved one's downstream runs and the rejected one's is skipped (the operator's own
`SkipMixin.skip`). A third, unanswered, has its default applied by the response-timeout sweep
(the timers process) and its downstream skipped too. Before, the SDK's `POST
/execution/hitlDetails/...` was a 404 and the task failed."""

import json
import textwrap
import urllib.request

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command

from assets_app.api.public_auth import create_api_token
from assets_app.models import DagRun, HITLDetail, TaskInstance, XCom
from tests.compat.airflow_worker_env import start, stop, synced_dag_folder, wait_for
from tests.compat.test_airflow_worker_deferral import _states

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

FINISHED = {"success", "failed", "skipped", "upstream_failed"}

DAG = textwrap.dedent(
    """
    from datetime import timedelta

    from airflow.providers.standard.operators.hitl import ApprovalOperator
    from airflow.sdk import dag, task

    @dag(dag_id="approvals", schedule=None, is_paused_upon_creation=False)
    def approvals():
        ship = ApprovalOperator(
            task_id="ship", subject="Ship release?", response_timeout=timedelta(hours=1)
        )
        risky = ApprovalOperator(task_id="risky", subject="Run the risky step?")
        # Nobody answers: its response timeout applies the default ("Reject").
        lapse = ApprovalOperator(
            task_id="lapse", subject="Anyone?", defaults="Reject",
            response_timeout=timedelta(seconds=20),
        )

        @task
        def after_lapse():
            return "ran"

        @task
        def deploy(ti=None):
            return ti.xcom_pull(task_ids="ship")["chosen_options"]

        @task
        def gamble():
            return "ran"

        ship >> deploy()
        risky >> gamble()
        lapse >> after_lapse()

    approvals()
    """
)


def _patch(url: str, key: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="PATCH",
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, json.loads(response.read())


@pytest.mark.timeout(900)
def test_approval_waits_is_answered_through_the_api_and_its_downstream_follows(servers, tmp_path):
    web = servers("gunicorn")
    servers("timers")  # the response-timeout sweep
    get_user_model().objects.create_superuser("approver", password="pw")
    _, key = create_api_token(username="approver", name="t")
    base, env = synced_dag_folder(
        tmp_path, web.url, {"approvals.py": DAG}, worker_key=settings.WORKER_API_KEY
    )
    logs = [tmp_path / "worker.log"]
    worker = start([*base, "--no-sync", "--concurrency", "2"], env, logs[0])
    try:
        call_command("trigger_dag", "approvals")
        run = DagRun.objects.get(dag_id="approvals")
        wait_for(
            lambda: list(_states(run).values()).count("awaiting_input") == 3,
            seconds=300,
            what="the three approvals awaiting input",
            logs=logs,
        )
        assert HITLDetail.objects.get(ti__task_id="ship").subject == "Ship release?"
        answers = {"ship": "Approve", "risky": "Reject"}
        for task_id, option in answers.items():
            status, body = _patch(
                f"{web.url}/api/v2/dags/approvals/dagRuns/{run.run_id}/taskInstances/"
                f"{task_id}/-1/hitlDetails",
                key,
                {"chosen_options": [option]},
            )
            assert status == 200
            assert body["responded_by"]["name"] == "approver"
        # Every TI finished: an approval skips its downstream before it reports its own
        # success, so a downstream's end alone left `lapse` still running (a CI run).
        wait_for(
            lambda: set(_states(run).values()) <= FINISHED and len(_states(run)) == 6,
            seconds=300,
            what="every task's end",
            logs=logs,
        )
        states = _states(run)
    finally:
        stop(worker)
    log = logs[0].read_text()
    assert states == {
        "ship": "success",
        "risky": "success",
        "deploy": "success",
        "gamble": "skipped",
        "lapse": "success",
        "after_lapse": "skipped",
    }, log[-5000:]
    lapsed = HITLDetail.objects.get(ti__task_id="lapse")
    assert (lapsed.chosen_options, lapsed.responded_by) == (["Reject"], None)
    ship = TaskInstance.objects.get(dag_run=run, task_id="ship")
    assert ship.try_number == 1
    assert XCom.objects.get(run_id=run.run_id, task_id="deploy", key="return_value").value == [
        "Approve"
    ]
