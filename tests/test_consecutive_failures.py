"""max_consecutive_failed_dag_runs (issue 39) against real PostgreSQL, with Airflow 3.3.2's
semantics (`DagRun.update_state` -> `_check_last_n_dagruns_failed`): when a run fails for a task
failure, the Dag is paused if its last N runs by run_after all failed; audited with Airflow's
log line. The success path's statements do not grow."""

import datetime
import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from assets_app.definitions import sync as definitions
from assets_app.models import AuditEntry, Dag, DagRun, TaskInstance, TIState
from assets_app.scheduling import dependencies, runs
from assets_app.task_state import finishing, starting, success

pytestmark = pytest.mark.django_db

T0 = datetime.datetime(2026, 6, 1, tzinfo=datetime.UTC)


def sync(limit: int) -> None:
    dag = {"dag_id": "d", "is_paused": False, "tasks": [{"task_id": "a"}]}
    if limit:
        dag["max_consecutive_failed_dag_runs"] = limit
    definitions.sync_definitions(dags=definitions.parse_text(json.dumps(dag), file="t.json"))


def run_once(minute: int, end_state: str) -> DagRun:
    run = runs.trigger_dag(dag_id="d", run_after=T0 + datetime.timedelta(minutes=minute))
    ti = TaskInstance.objects.get(dag_run=run)
    tries = {"ti_id": ti.id, "try_number": ti.try_number}
    starting.start(**tries, hostname="h", unixname="u", pid=1, start_date=timezone.now())
    if end_state == TIState.SUCCESS:
        success.succeed(**tries, end_date=timezone.now(), task_outlets=[], outlet_events=[])
    else:
        finishing.finish(**tries, state=end_state, end_date=timezone.now())
    return run


def paused() -> bool:
    return Dag.objects.get(dag_id="d").is_paused


def test_the_dag_pauses_after_n_consecutive_failed_runs_audited():
    sync(3)
    assert Dag.objects.get(dag_id="d").max_consecutive_failed_dag_runs == 3
    run_once(0, TIState.FAILED)
    run_once(1, TIState.FAILED)
    assert not paused()
    run_once(2, TIState.FAILED)
    assert paused()
    entry = AuditEntry.objects.get(action="dag.pause")
    assert entry.summary == "Pausing DAG d because last 3 DAG runs failed."
    assert entry.actor_name == "scheduler"
    assert entry.dag_id == "d"
    assert entry.detail == {"is_paused": True, "max_consecutive_failed_dag_runs": 3}


def test_a_success_in_the_last_n_keeps_it_running():
    sync(2)
    run_once(0, TIState.FAILED)
    run_once(1, TIState.SUCCESS)
    run_once(2, TIState.FAILED)
    assert not paused()
    run_once(3, TIState.FAILED)
    assert paused()


def test_the_last_runs_are_by_run_after_not_by_finish():
    """A failure of an older run (by run_after) counts only among the last N by run_after."""
    sync(2)
    run_once(5, TIState.SUCCESS)
    run_once(0, TIState.FAILED)
    run_once(1, TIState.FAILED)
    # The last two by run_after are minute 5 (success) and minute 1 (failed).
    assert not paused()


def test_zero_never_pauses():
    sync(0)
    for minute in range(5):
        run_once(minute, TIState.FAILED)
    assert not paused()
    assert not AuditEntry.objects.filter(action="dag.pause").exists()


def test_a_successful_finish_costs_no_statement_more():
    """The run's state comes back with its finishing UPDATE (RETURNING); the pause check runs
    only for a run that failed."""
    sync(3)
    run = runs.trigger_dag(dag_id="d")
    ti = TaskInstance.objects.get(dag_run=run)
    TaskInstance.objects.filter(pk=ti.pk).update(state=TIState.SUCCESS)
    with CaptureQueriesContext(connection) as queries:
        dependencies.finish_run_if_done(run.pk, dag_id="d", now=timezone.now())
    statements = [q["sql"] for q in queries]
    assert not any("max_consecutive_failed_dag_runs" in sql for sql in statements)
    assert len(statements) == 3  # the finish, its webhook message, the queued-events probe
