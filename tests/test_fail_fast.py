"""A Dag's `fail_fast` (Airflow's, issue 39): a TI that fails for good fails its run's running
TIs and skips the others (Airflow's `_stop_remaining_tasks`), against real PostgreSQL, with a
worker starting a TI while it happens (real threads)."""

import contextlib
import threading

import pytest
from django.db import connection
from django.utils import timezone

from assets_app.definitions import sync as definitions
from assets_app.guards import exceptions
from assets_app.models import DagRunState, TaskInstance, TIState
from assets_app.scheduling import runs
from assets_app.task_state import finishing, retries, starting, success
from tests.test_dependencies import states, sync, ti

pytestmark = pytest.mark.django_db

FAST = {
    "dag_id": "fast",
    "fail_fast": True,
    "tasks": [
        {"task_id": "a"},
        {"task_id": "b"},
        {"task_id": "c"},
        {"task_id": "d", "upstream": ["a"]},
        {"task_id": "e", "upstream": ["b"]},
    ],
}


def start(t: TaskInstance) -> None:
    starting.start(
        ti_id=t.id,
        try_number=t.try_number,
        hostname="h",
        unixname="u",
        pid=1,
        start_date=timezone.now(),
    )


def fail(t: TaskInstance) -> None:
    finishing.finish(
        ti_id=t.id, try_number=t.try_number, state=TIState.FAILED, end_date=timezone.now()
    )


def test_a_failure_fails_the_running_skips_the_rest_and_the_run_fails():
    sync(FAST)
    run = runs.trigger_dag(dag_id="fast")
    start(ti(run, "a"))
    start(ti(run, "b"))
    fail(ti(run, "a"))
    assert states(run) == {
        "a": TIState.FAILED,
        "b": TIState.FAILED,  # it was running: failed, its worker told at its next heartbeat
        "c": TIState.SKIPPED,
        "d": TIState.SKIPPED,
        "e": TIState.SKIPPED,
    }
    run.refresh_from_db()
    # Airflow's DagRun.update_state judges a run by its leaves only: c, d and e are skipped, so
    # the run succeeds although `a` and `b` failed (as on Airflow 3.3.2).
    assert run.state == DagRunState.SUCCESS
    # The stopped worker's report of success comes too late and changes nothing.
    b = ti(run, "b")
    with pytest.raises(exceptions.InvalidState):
        success.succeed(
            ti_id=b.id,
            try_number=b.try_number,
            end_date=timezone.now(),
            task_outlets=[],
            outlet_events=[],
        )
    assert ti(run, "b").state == TIState.FAILED


def test_without_fail_fast_nothing_else_is_stopped():
    sync({**FAST, "fail_fast": False})
    run = runs.trigger_dag(dag_id="fast")
    start(ti(run, "a"))
    fail(ti(run, "a"))
    assert states(run) == {
        "a": TIState.FAILED,
        "b": TIState.QUEUED,
        "c": TIState.QUEUED,
        "d": TIState.UPSTREAM_FAILED,
        "e": TIState.SCHEDULED,
    }


def test_a_failure_with_retries_left_stops_nothing():
    sync({**FAST, "tasks": [{"task_id": "a", "retries": 1}, *FAST["tasks"][1:]]})
    run = runs.trigger_dag(dag_id="fast")
    a = ti(run, "a")
    start(a)
    retries.retry(ti_id=a.id, try_number=a.try_number, end_date=timezone.now())
    assert states(run)["b"] == TIState.QUEUED
    a.refresh_from_db()
    start(a)
    retries.retry(ti_id=a.id, try_number=a.try_number, end_date=timezone.now())  # for good
    assert states(run) == {
        "a": TIState.FAILED,
        "b": TIState.SKIPPED,
        "c": TIState.SKIPPED,
        "d": TIState.SKIPPED,
        "e": TIState.SKIPPED,
    }


def test_the_failed_tasks_own_map_indexes_go_on():
    sync(
        {
            "dag_id": "fast",
            "fail_fast": True,
            "tasks": [{"task_id": "m", "expand": {"x": [1, 2, 3]}}, {"task_id": "other"}],
        }
    )
    run = runs.trigger_dag(dag_id="fast")
    first = TaskInstance.objects.get(dag_run=run, task_id="m", map_index=0)
    start(first)
    fail(first)
    left = dict(
        TaskInstance.objects.filter(dag_run=run, task_id="m").values_list("map_index", "state")
    )
    assert left == {0: TIState.FAILED, 1: TIState.QUEUED, 2: TIState.QUEUED}
    assert ti(run, "other").state == TIState.SKIPPED


def test_a_definition_with_another_trigger_rule_is_refused_as_airflow_refuses_it():
    dag = {**FAST, "tasks": [{"task_id": "a"}, {"task_id": "b", "trigger_rule": "all_done"}]}
    with pytest.raises(definitions.DefinitionError) as refused:
        definitions.parse_document(dag, file="fast.json")
    assert refused.value.path == "tasks[1].trigger_rule"
    assert refused.value.message.startswith(
        "A 'fail_fast' dag can only have TriggerRule.ALL_SUCCESS trigger rule"
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("seed", range(6))
def test_a_worker_starting_a_task_while_fail_fast_stops_it_never_leaves_it_running(seed):
    """Under any interleaving of a worker's start of `c` and the failure of `a`: `c` ends
    failed (started first) or skipped (its start then refused), never running or queued."""
    sync(FAST)
    run = runs.trigger_dag(dag_id="fast")
    a, c = ti(run, "a"), ti(run, "c")
    start(a)
    go = threading.Barrier(2)
    errors: list[BaseException] = []

    def worker():
        try:
            go.wait()
            if seed % 2:
                threading.Event().wait(0.001 * seed)
            with contextlib.suppress(exceptions.DomainError):
                start(c)  # refused when fail_fast stopped it first
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=worker)
    thread.start()
    go.wait()
    if not seed % 2:
        threading.Event().wait(0.001 * seed)
    fail(a)
    thread.join(30)
    assert not thread.is_alive() and errors == []
    c_state = ti(run, "c").state
    assert c_state in (TIState.FAILED, TIState.SKIPPED)
    run.refresh_from_db()
    # `c` is a leaf: the run fails when it was failed, succeeds when skipped (Airflow's leaves).
    assert run.state == (DagRunState.FAILED if c_state == TIState.FAILED else DagRunState.SUCCESS)
