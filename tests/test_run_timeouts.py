"""dagrun_timeout (issue 39) against real PostgreSQL, with Airflow 3.3.2's semantics
(`SchedulerJobRunner._schedule_dag_run`): a running run past its start plus the timeout is
failed, its unfinished TIs skipped, audited; a worker still running one is told at its
heartbeat (409 not_running). Time-controlled: the timer's pass is given its `now`."""

import datetime
import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from assets_app.catalog import dags
from assets_app.definitions import sync as definitions
from assets_app.models import AuditEntry, Dag, DagRun, DagRunState, TaskInstance, TIState
from assets_app.scheduling import runs, timeouts
from assets_app.sql import connection as connection_sql
from assets_app.sql import wakeups
from assets_app.task_state import starting
from assets_app.timers import service
from tests.api.conftest import WorkerClient

pytestmark = pytest.mark.django_db

HOUR = datetime.timedelta(hours=1)


def sync(timeout_seconds: float | None) -> None:
    dag = {
        "dag_id": "d",
        "is_paused": False,
        "tasks": [
            {"task_id": "a"},
            {"task_id": "b"},
            {"task_id": "c", "upstream": ["a"]},
        ],
    }
    if timeout_seconds is not None:
        dag["dagrun_timeout_seconds"] = timeout_seconds
    definitions.sync_definitions(dags=definitions.parse_text(json.dumps(dag), file="t.json"))


def start(run: DagRun, task_id: str) -> TaskInstance:
    ti = TaskInstance.objects.get(dag_run=run, task_id=task_id)
    starting.start(
        ti_id=ti.id,
        try_number=ti.try_number,
        hostname="worker-1",
        unixname="u",
        pid=4242,
        start_date=timezone.now(),
    )
    return ti


def states(run: DagRun) -> dict[str, str]:
    return dict(TaskInstance.objects.filter(dag_run=run).values_list("task_id", "state"))


def test_the_timeout_is_stored_and_a_started_run_gets_its_due_time():
    sync(3600)
    assert Dag.objects.get(dag_id="d").dagrun_timeout == HOUR
    run = runs.trigger_dag(dag_id="d")
    assert timeouts.next_due_at() is None  # queued: not started yet
    start(run, "a")
    run.refresh_from_db()
    assert run.state == DagRunState.RUNNING
    assert run.timeout_at == run.start_date + HOUR
    assert timeouts.next_due_at() == run.timeout_at


def test_a_run_that_never_started_never_times_out_as_on_airflow():
    """Airflow 3.3.2 checks `dagrun_timeout` only in `_schedule_dag_run`, on the running runs
    it examines, against their `start_date` (set when `_start_queued_dagruns` starts them): a
    queued run, however old (a paused Dag's, held by max_active_runs), is never timed out, and
    once started its timeout counts from its start. Same here."""
    sync(3600)
    Dag.objects.filter(dag_id="d").update(is_paused=True)
    run = runs.trigger_dag(dag_id="d")
    DagRun.objects.filter(pk=run.pk).update(queued_at=timezone.now() - 1000 * HOUR)
    assert timeouts.next_due_at() is None
    assert timeouts.time_out_due_runs(now=timezone.now() + 1000 * HOUR).runs == ()
    run.refresh_from_db()
    assert (run.state, run.timeout_at) == (DagRunState.QUEUED, None)
    Dag.objects.filter(dag_id="d").update(is_paused=False)
    start(run, "a")
    run.refresh_from_db()
    assert run.timeout_at == run.start_date + HOUR


def test_a_paused_dags_running_run_times_out_only_once_unpaused():
    """Airflow examines only the running runs of unpaused Dags
    (`DagRun.get_running_dag_runs_to_examine`), so a paused Dag's run past its timeout stays
    running until the unpause, and is then timed out at the scheduler's next look. Here the
    unpause wakes the timer, whose next pass ends it."""
    sync(3600)
    run = runs.trigger_dag(dag_id="d")
    start(run, "a")
    run.refresh_from_db()
    late = run.start_date + 2 * HOUR
    Dag.objects.filter(dag_id="d").update(is_paused=True)
    assert timeouts.next_due_at() is None
    assert timeouts.time_out_due_runs(now=late).runs == ()
    assert DagRun.objects.get(pk=run.pk).state == DagRunState.RUNNING
    dags.set_paused(dag_id="d", is_paused=False)
    assert timeouts.next_due_at() == run.timeout_at
    assert timeouts.time_out_due_runs(now=late).runs == ((run.pk, "d", run.run_id),)


@pytest.mark.django_db(transaction=True)
def test_an_unpause_wakes_the_timeout_timer():
    sync(3600)
    Dag.objects.filter(dag_id="d").update(is_paused=True)
    with connection_sql.open_listener(wakeups.TIMEOUTS, using="default") as listener:
        dags.set_paused(dag_id="d", is_paused=False)
        received = list(listener.notifies(timeout=5, stop_after=1))
    assert [n.channel for n in received] == [wakeups.TIMEOUTS]


def test_a_dag_without_a_timeout_never_times_out():
    sync(None)
    run = runs.trigger_dag(dag_id="d")
    start(run, "a")
    run.refresh_from_db()
    assert run.timeout_at is None
    assert timeouts.next_due_at() is None
    assert timeouts.time_out_due_runs(now=timezone.now() + 1000 * HOUR).runs == ()


def test_a_run_past_its_timeout_fails_and_its_unfinished_tis_are_skipped(worker_api_factory):
    sync(3600)
    run = runs.trigger_dag(dag_id="d")
    running = start(run, "a")
    run.refresh_from_db()
    assert timeouts.time_out_due_runs(now=run.start_date + HOUR / 2).runs == ()
    assert states(run) == {"a": "running", "b": "queued", "c": "scheduled"}

    ended = timeouts.time_out_due_runs(now=run.start_date + HOUR + datetime.timedelta(seconds=1))

    assert ended.runs == ((run.pk, "d", run.run_id),)
    assert ended.skipped == 3
    run.refresh_from_db()
    assert run.state == DagRunState.FAILED
    assert run.end_date == run.start_date + HOUR + datetime.timedelta(seconds=1)
    assert states(run) == {"a": "skipped", "b": "skipped", "c": "skipped"}
    entry = AuditEntry.objects.get(action="dag_run.timed_out")
    assert entry.summary == f"Run {run.run_id} of d has timed-out"
    assert entry.dag_id == "d"
    # The worker running `a` is told to stop at its next heartbeat, as Airflow's API does.
    response = worker_api_factory.request(
        "PUT",
        f"/task-instances/{running.id}/heartbeat",
        {"hostname": "worker-1", "pid": 4242},
        ti_id=running.id,
    )
    assert response.status_code == 409
    assert response.json()["detail"]["reason"] == "not_running"
    assert response.json()["detail"]["current_state"] == TIState.SKIPPED
    # A second pass finds nothing.
    assert timeouts.time_out_due_runs(now=run.start_date + 2 * HOUR).runs == ()


def test_a_run_that_finished_in_time_is_left_alone():
    sync(3600)
    run = runs.trigger_dag(dag_id="d")
    start(run, "a")
    DagRun.objects.filter(pk=run.pk).update(state=DagRunState.SUCCESS)
    assert timeouts.next_due_at() is None
    assert timeouts.time_out_due_runs(now=timezone.now() + 2 * HOUR).runs == ()
    assert DagRun.objects.get(pk=run.pk).state == DagRunState.SUCCESS


def test_a_changed_timeout_retimes_the_running_runs():
    sync(3600)
    run = runs.trigger_dag(dag_id="d")
    start(run, "a")
    sync(60)
    assert timeouts.retime() == 1
    run.refresh_from_db()
    assert run.timeout_at == run.start_date + datetime.timedelta(seconds=60)
    sync(None)
    assert timeouts.retime() == 1
    assert timeouts.next_due_at() is None


def test_the_due_time_read_is_one_statement():
    sync(3600)
    with CaptureQueriesContext(connection) as queries:
        timeouts.next_due_at()
    assert len(queries) == 1
    assert "dag_run_timeout_due" in _plan(queries[0]["sql"])


def _plan(sql: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.fixture
def worker_api_factory() -> WorkerClient:
    return WorkerClient()


@pytest.mark.django_db(transaction=True)
def test_a_run_with_a_timeout_starting_wakes_the_timeout_timer():
    sync(3600)
    plain = runs.trigger_dag(dag_id="d")
    with connection_sql.open_listener(wakeups.TIMEOUTS, using="default") as listener:
        Dag.objects.filter(dag_id="d").update(dagrun_timeout=None)
        start(plain, "a")
        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []
        Dag.objects.filter(dag_id="d").update(dagrun_timeout=HOUR)
        start(runs.trigger_dag(dag_id="d"), "a")
        received = list(listener.notifies(timeout=5, stop_after=1))
    assert [n.channel for n in received] == [wakeups.TIMEOUTS]


def test_the_timers_process_runs_the_timeout_timer_on_its_channel():
    (timer,) = [t for t in service.timers() if t.name == "run-timeouts"]
    assert timer.channels == (wakeups.TIMEOUTS,)
    assert timer.next_due is timeouts.next_due_at
