"""Worker API and task dependencies: retries honour the task's delay and Airflow's backoff,
`PATCH .../skip-downstream` skips a branch and lets the rules propagate, and a worker that
stops heartbeating is failed or retried by the sweep; its late calls then get 409."""

import ast
import json
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from assets_app.definitions import sync as definitions
from assets_app.models import DagRunState, TaskInstance, TIState
from assets_app.scheduling import runs
from assets_app.task_state import claims, repair, retries
from tests.api.snapshots import db_snapshot

pytestmark = pytest.mark.django_db

SDK_MODELS = Path(
    "/tmp/airflow_ref/apache_airflow_task_sdk-1.3.2/airflow/sdk/api/datamodels/_generated.py"
)


def unpaused(dag: dict) -> dict:
    """The Dag runs once synced (a sync pauses a new Dag unless it says so, issue 39)."""
    return {"is_paused": False, **dag}


def sync(*dags: dict) -> None:
    definitions.sync_definitions(
        dags=[
            d
            for dag in dags
            for d in definitions.parse_text(json.dumps(unpaused(dag)), file="t.json")
        ]
    )


def ti(run, task_id: str) -> TaskInstance:
    return TaskInstance.objects.get(dag_run=run, task_id=task_id)


def start(worker_api, t: TaskInstance) -> None:
    response = worker_api.request(
        "PATCH",
        f"/task-instances/{t.id}/run",
        {
            "state": "running",
            "hostname": "h",
            "unixname": "u",
            "pid": 7,
            "start_date": timezone.now().isoformat(),
        },
        ti_id=t.id,
    )
    assert response.status_code == 200, response.content


def end(worker_api, t: TaskInstance, state: str, **extra):
    return worker_api.request(
        "PATCH",
        f"/task-instances/{t.id}/state",
        {"state": state, "end_date": timezone.now().isoformat(), **extra},
        ti_id=t.id,
    )


# --- retry delay ------------------------------------------------------------------------------


def test_retry_waits_the_tasks_delay_unless_the_worker_gives_one(worker_api):
    sync(
        {
            "dag_id": "r",
            "tasks": [
                {"task_id": "slow", "retries": 3, "retry_delay_seconds": 120},
                {"task_id": "default", "retries": 1},
            ],
        }
    )
    run = runs.trigger_dag(dag_id="r")
    for task_id, body, expected in (
        ("slow", {"retry_delay_seconds": None}, 120),
        ("default", {}, 300),
    ):
        t = ti(run, task_id)
        start(worker_api, t)
        before = timezone.now()
        assert end(worker_api, t, "up_for_retry", **body).status_code == 204
        t.refresh_from_db()
        assert (t.state, t.try_number) == (TIState.QUEUED, 2)
        waited = (t.retry_at - before).total_seconds()
        assert expected - 1 < waited <= expected + 1
    # The worker's value wins when given.
    t = ti(run, "slow")
    TaskInstance.objects.filter(id=t.id).update(retry_at=None)
    start(worker_api, t)
    before = timezone.now()
    assert end(worker_api, t, "up_for_retry", retry_delay_seconds=5).status_code == 204
    t.refresh_from_db()
    assert 4 < (t.retry_at - before).total_seconds() <= 6
    # Not claimable before the delay has passed.
    assert [w.ti.task_id for w in claims.claim_workloads(hostname="w", limit=10)] == []


def test_exponential_backoff_follows_airflows_formula_and_cap():
    policy = retries.RetryPolicy(delay_seconds=10, backoff=2.0, max_delay_seconds=None)
    delays = [
        retries.retry_delay_for(policy=policy, dag_id="d", task_id="t", try_number=n)
        for n in range(1, 6)
    ]
    # Between ceil(10 * 2 ** (try - 1)) and twice that (a deterministic hash of the TI).
    for n, delay in enumerate(delays, start=1):
        low = 10 * 2 ** (n - 1)
        assert low <= delay < 2 * low
    assert delays == [
        retries.retry_delay_for(policy=policy, dag_id="d", task_id="t", try_number=n)
        for n in range(1, 6)
    ]
    capped = retries.RetryPolicy(delay_seconds=10, backoff=2.0, max_delay_seconds=25)
    assert retries.retry_delay_for(policy=capped, dag_id="d", task_id="t", try_number=5) == 25
    constant = retries.RetryPolicy(delay_seconds=10, backoff=0)
    assert retries.retry_delay_for(policy=constant, dag_id="d", task_id="t", try_number=5) == 10
    huge = retries.RetryPolicy(delay_seconds=10**6, backoff=10)
    assert (
        retries.retry_delay_for(policy=huge, dag_id="d", task_id="t", try_number=400)
        == retries.MAX_RETRY_DELAY_SECONDS
    )


# --- skip-downstream --------------------------------------------------------------------------

BRANCH = {
    "dag_id": "branchy",
    "tasks": [
        {"task_id": "branch"},
        {"task_id": "left", "upstream": ["branch"]},
        {"task_id": "right", "upstream": ["branch"]},
        {"task_id": "after_right", "upstream": ["right"]},
        {
            "task_id": "join",
            "upstream": ["left", "after_right"],
            "trigger_rule": "none_failed_min_one_success",
        },
    ],
}


def test_skip_downstream_body_is_airflows():
    if not SDK_MODELS.exists():
        pytest.skip("the Task SDK's models are not unpacked here")
    tree = ast.parse(SDK_MODELS.read_text())
    model = next(
        node
        for node in tree.body
        if isinstance(node, ast.ClassDef) and node.name == "TISkippedDownstreamTasksStatePayload"
    )
    fields = {n.target.id for n in model.body if isinstance(n, ast.AnnAssign)}
    from assets_app.api.schemas import TISkippedDownstreamTasksStatePayload

    assert set(TISkippedDownstreamTasksStatePayload.model_fields) == fields - {"model_config"}


def test_a_branch_skips_one_side_and_the_rules_propagate(worker_api):
    sync(BRANCH)
    run = runs.trigger_dag(dag_id="branchy")
    branch = ti(run, "branch")
    start(worker_api, branch)
    response = worker_api.request(
        "PATCH",
        f"/task-instances/{branch.id}/skip-downstream",
        {"tasks": ["right", ["unknown", -1]]},
        ti_id=branch.id,
    )
    assert response.status_code == 204, response.content
    # Replayed while the branch runs: nothing more to skip, nothing written.
    before = db_snapshot()
    replay = worker_api.request(
        "PATCH",
        f"/task-instances/{branch.id}/skip-downstream",
        {"tasks": [["right", -1]]},
        ti_id=branch.id,
    )
    assert replay.status_code == 204
    assert db_snapshot() == before
    assert end(worker_api, branch, "success", task_outlets=[], outlet_events=[]).status_code == 204
    states = dict(TaskInstance.objects.filter(dag_run=run).values_list("task_id", "state"))
    assert states == {
        "branch": TIState.SUCCESS,
        "left": TIState.QUEUED,
        "right": TIState.SKIPPED,
        "after_right": TIState.SKIPPED,
        "join": TIState.SCHEDULED,
    }
    left = ti(run, "left")
    start(worker_api, left)
    assert end(worker_api, left, "success", task_outlets=[], outlet_events=[]).status_code == 204
    assert ti(run, "join").state == TIState.QUEUED
    # Once the branch finished its token changes no other TI (issue 26): 403, nothing written.
    before = db_snapshot()
    response = worker_api.request(
        "PATCH",
        f"/task-instances/{branch.id}/skip-downstream",
        {"tasks": [["right", -1]]},
        ti_id=branch.id,
    )
    assert response.status_code == 403
    assert response.json()["detail"]["reason"] == "task_not_running"
    assert db_snapshot() == before


def test_skip_downstream_leaves_running_and_finished_tis_alone(worker_api):
    sync(BRANCH)
    run = runs.trigger_dag(dag_id="branchy")
    branch = ti(run, "branch")
    start(worker_api, branch)
    response = worker_api.request(
        "PATCH",
        f"/task-instances/{branch.id}/skip-downstream",
        {"tasks": ["branch"]},
        ti_id=branch.id,
    )
    assert response.status_code == 204
    assert ti(run, "branch").state == TIState.RUNNING


@pytest.mark.parametrize(
    "body",
    [{}, {"tasks": "left"}, {"tasks": [["left"]]}, {"tasks": [""]}, {"tasks": [], "x": 1}],
)
def test_bad_skip_downstream_bodies_are_422_and_write_nothing(worker_api, body):
    sync(BRANCH)
    run = runs.trigger_dag(dag_id="branchy")
    branch = ti(run, "branch")
    before = db_snapshot()
    response = worker_api.request(
        "PATCH", f"/task-instances/{branch.id}/skip-downstream", body, ti_id=branch.id
    )
    assert response.status_code == 422
    assert db_snapshot() == before


def test_skip_downstream_of_an_unknown_ti_is_404(worker_api):
    import uuid

    ti_id = uuid.uuid4()
    response = worker_api.request(
        "PATCH", f"/task-instances/{ti_id}/skip-downstream", {"tasks": ["x"]}, ti_id=ti_id
    )
    assert response.status_code == 404


# --- workers that die -------------------------------------------------------------------------


def test_a_dead_workers_ti_is_retried_then_failed_and_its_late_calls_get_409(worker_api, settings):
    settings.TASK_HEARTBEAT_TIMEOUT_SECONDS = 60
    sync(
        {
            "dag_id": "dies",
            "tasks": [
                {"task_id": "work", "retries": 1, "retry_delay_seconds": 0},
                {"task_id": "next", "upstream": ["work"]},
            ],
        }
    )
    run = runs.trigger_dag(dag_id="dies")
    work = ti(run, "work")
    start(worker_api, work)
    # A fresh heartbeat: nothing to do.
    assert repair.repair_task_instances().tis_retried == 0
    stale = timezone.now() - timedelta(seconds=61)
    TaskInstance.objects.filter(id=work.id).update(last_heartbeat_at=stale)
    result = repair.repair_task_instances()
    assert (result.tis_retried, result.tis_failed) == (1, 0)
    work.refresh_from_db()
    assert (work.state, work.try_number) == (TIState.QUEUED, 2)
    # The dead worker wakes up: its heartbeat and its success change nothing.
    before = db_snapshot()
    late = worker_api.request(
        "PUT", f"/task-instances/{work.id}/heartbeat", {"hostname": "h", "pid": 7}, ti_id=work.id
    )
    assert late.status_code == 409
    late = end(worker_api, work, "success", task_outlets=[], outlet_events=[])
    assert late.status_code == 409
    assert db_snapshot() == before
    # The second try dies too: no tries left, so it fails and `next` is upstream_failed.
    start(worker_api, work)
    TaskInstance.objects.filter(id=work.id).update(last_heartbeat_at=stale)
    result = repair.repair_task_instances()
    assert (result.tis_retried, result.tis_failed) == (0, 1)
    states = dict(TaskInstance.objects.filter(dag_run=run).values_list("task_id", "state"))
    assert states == {"work": TIState.FAILED, "next": TIState.UPSTREAM_FAILED}
    run.refresh_from_db()
    assert run.state == DagRunState.FAILED
