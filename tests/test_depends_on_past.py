"""depends_on_past, ignore_first_depends_on_past and wait_for_downstream (issue 39) against real
PostgreSQL, with Airflow 3.3.2's `PrevDagrunDep` semantics: a TI waits (`scheduled`) until its
task's TIs in the Dag's previous run by logical date are success or skipped, and, with
wait_for_downstream, their direct downstream there too; the finish of the previous run's TI
wakes it, in the same evaluation statement."""

import datetime
import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from assets_app.definitions import sync as definitions
from assets_app.models import DagRun, Task, TaskInstance, TIState
from assets_app.scheduling import dependencies, runs
from assets_app.task_state import finishing, repair, starting, success

pytestmark = pytest.mark.django_db

DAY1 = datetime.datetime(2026, 6, 1, tzinfo=datetime.UTC)


def sync(dag: dict) -> None:
    definitions.sync_definitions(
        dags=definitions.parse_text(json.dumps({"is_paused": False, **dag}), file="t.json")
    )


def trigger(dag_id: str, day: int | None, capture) -> DagRun:
    """A run of `dag_id` at DAY1 + `day` days (None: no logical date), its after-commit
    evaluation run."""
    logical_date = None if day is None else DAY1 + datetime.timedelta(days=day)
    with capture(execute=True):
        return runs.trigger_dag(dag_id=dag_id, logical_date=logical_date)


def state(run: DagRun, task_id: str) -> str:
    return TaskInstance.objects.get(dag_run=run, task_id=task_id).state


def run_and_finish(run: DagRun, task_id: str, end_state: str = TIState.SUCCESS) -> None:
    ti = TaskInstance.objects.get(dag_run=run, task_id=task_id)
    tries = {"ti_id": ti.id, "try_number": ti.try_number}
    starting.start(**tries, hostname="h", unixname="u", pid=1, start_date=timezone.now())
    if end_state == TIState.SUCCESS:
        success.succeed(**tries, end_date=timezone.now(), task_outlets=[], outlet_events=[])
    else:
        finishing.finish(**tries, state=end_state, end_date=timezone.now())


def test_sync_stores_the_flags_and_wait_for_downstream_implies_depends_on_past():
    sync(
        {
            "dag_id": "d",
            "tasks": [
                {"task_id": "a", "depends_on_past": True, "ignore_first_depends_on_past": True},
                {"task_id": "b", "wait_for_downstream": True},
                {"task_id": "c"},
            ],
        }
    )
    flags = {
        t.task_id: (t.depends_on_past, t.ignore_first_depends_on_past, t.wait_for_downstream)
        for t in Task.objects.filter(dag_id="d")
    }
    assert flags == {
        "a": (True, True, False),
        "b": (True, False, True),
        "c": (False, False, False),
    }


def test_the_second_runs_ti_waits_for_the_first_runs_success(
    django_capture_on_commit_callbacks,
):
    sync({"dag_id": "d", "tasks": [{"task_id": "a", "depends_on_past": True}]})
    first = trigger("d", 0, django_capture_on_commit_callbacks)
    second = trigger("d", 1, django_capture_on_commit_callbacks)
    # The first run has no previous run: its root is queued at once (after the commit).
    assert state(first, "a") == TIState.QUEUED
    assert state(second, "a") == TIState.SCHEDULED
    repair.sweep_waiting_runs()
    assert state(second, "a") == TIState.SCHEDULED
    run_and_finish(first, "a")
    assert state(second, "a") == TIState.QUEUED


def test_a_run_created_after_its_previous_succeeded_is_queued_at_once(
    django_capture_on_commit_callbacks,
):
    sync({"dag_id": "d", "tasks": [{"task_id": "a", "depends_on_past": True}]})
    first = trigger("d", 0, django_capture_on_commit_callbacks)
    run_and_finish(first, "a")
    second = trigger("d", 1, django_capture_on_commit_callbacks)
    assert state(second, "a") == TIState.QUEUED


def test_a_failed_previous_ti_keeps_it_waiting(django_capture_on_commit_callbacks):
    sync({"dag_id": "d", "tasks": [{"task_id": "a", "depends_on_past": True}]})
    first = trigger("d", 0, django_capture_on_commit_callbacks)
    second = trigger("d", 1, django_capture_on_commit_callbacks)
    run_and_finish(first, "a", TIState.FAILED)
    assert state(second, "a") == TIState.SCHEDULED
    repair.sweep_waiting_runs()
    assert state(second, "a") == TIState.SCHEDULED


def test_a_skipped_previous_ti_lets_it_run(django_capture_on_commit_callbacks):
    sync({"dag_id": "d", "tasks": [{"task_id": "a", "depends_on_past": True}]})
    first = trigger("d", 0, django_capture_on_commit_callbacks)
    second = trigger("d", 1, django_capture_on_commit_callbacks)
    run_and_finish(first, "a", TIState.SKIPPED)
    assert state(second, "a") == TIState.QUEUED


def test_the_previous_run_is_by_logical_date_not_by_creation(
    django_capture_on_commit_callbacks,
):
    sync({"dag_id": "d", "tasks": [{"task_id": "a", "depends_on_past": True}]})
    later = trigger("d", 5, django_capture_on_commit_callbacks)
    earlier = trigger("d", 1, django_capture_on_commit_callbacks)
    # `later` was created first, with no previous run then; it started queued. `earlier` has
    # no run before it by logical date.
    assert state(earlier, "a") == TIState.QUEUED
    assert state(later, "a") == TIState.QUEUED


def test_a_run_without_a_logical_date_does_not_wait(django_capture_on_commit_callbacks):
    sync({"dag_id": "d", "tasks": [{"task_id": "a", "depends_on_past": True}]})
    trigger("d", 0, django_capture_on_commit_callbacks)
    undated = trigger("d", None, django_capture_on_commit_callbacks)
    assert state(undated, "a") == TIState.QUEUED


def test_a_downstream_task_waits_for_its_own_previous_ti_as_well_as_its_upstream(
    django_capture_on_commit_callbacks,
):
    sync(
        {
            "dag_id": "d",
            "tasks": [
                {"task_id": "a"},
                {"task_id": "b", "upstream": ["a"], "depends_on_past": True},
            ],
        }
    )
    first = trigger("d", 0, django_capture_on_commit_callbacks)
    second = trigger("d", 1, django_capture_on_commit_callbacks)
    run_and_finish(first, "a")
    run_and_finish(second, "a")
    assert state(first, "b") == TIState.QUEUED
    assert state(second, "b") == TIState.SCHEDULED
    run_and_finish(first, "b")
    assert state(second, "b") == TIState.QUEUED


def test_a_failed_upstream_still_marks_it_upstream_failed_whatever_its_past(
    django_capture_on_commit_callbacks,
):
    """Airflow's TriggerRuleDep sets upstream_failed even while PrevDagrunDep fails."""
    sync(
        {
            "dag_id": "d",
            "tasks": [
                {"task_id": "a"},
                {"task_id": "b", "upstream": ["a"], "depends_on_past": True},
            ],
        }
    )
    trigger("d", 0, django_capture_on_commit_callbacks)
    second = trigger("d", 1, django_capture_on_commit_callbacks)
    run_and_finish(second, "a", TIState.FAILED)
    assert state(second, "b") == TIState.UPSTREAM_FAILED


def test_wait_for_downstream_waits_for_the_previous_runs_direct_downstream(
    django_capture_on_commit_callbacks,
):
    sync(
        {
            "dag_id": "d",
            "tasks": [
                {"task_id": "a", "wait_for_downstream": True},
                {"task_id": "b", "upstream": ["a"]},
                {"task_id": "c", "upstream": ["b"]},
            ],
        }
    )
    first = trigger("d", 0, django_capture_on_commit_callbacks)
    second = trigger("d", 1, django_capture_on_commit_callbacks)
    run_and_finish(first, "a")
    assert state(second, "a") == TIState.SCHEDULED
    run_and_finish(first, "b")
    # Only direct downstream count (Airflow's `_has_unsuccessful_dependants`): c may still run.
    assert state(first, "c") == TIState.QUEUED
    assert state(second, "a") == TIState.QUEUED


def test_a_previous_run_without_the_task_holds_it_unless_ignore_first(
    django_capture_on_commit_callbacks,
):
    sync({"dag_id": "d", "tasks": [{"task_id": "old"}]})
    trigger("d", 0, django_capture_on_commit_callbacks)
    tasks = [{"task_id": "old"}, {"task_id": "a", "depends_on_past": True}]
    tasks.append({"task_id": "b", "depends_on_past": True, "ignore_first_depends_on_past": True})
    sync({"dag_id": "d", "tasks": tasks})
    second = trigger("d", 1, django_capture_on_commit_callbacks)
    # Airflow: "the previous task instance has not run yet" holds `a` for ever; `b` is the
    # first TI of its task ever.
    assert state(second, "a") == TIState.SCHEDULED
    assert state(second, "b") == TIState.QUEUED


def test_a_root_that_depends_on_the_past_starts_waiting(django_capture_on_commit_callbacks):
    sync({"dag_id": "d", "tasks": [{"task_id": "a", "depends_on_past": True}]})
    assert runs.initial_ti_states(dag_id="d", task_ids=["a"]) == {"a": TIState.SCHEDULED}


def test_a_finish_in_a_dag_without_depends_on_past_costs_the_same_statements(
    django_capture_on_commit_callbacks,
):
    """The wake-up rides in the evaluation statement: no statement more per finish."""
    sync({"dag_id": "d", "tasks": [{"task_id": "a"}, {"task_id": "b", "upstream": ["a"]}]})
    run = trigger("d", 0, django_capture_on_commit_callbacks)
    with CaptureQueriesContext(connection) as plain:
        dependencies.evaluate(dag_run_id=run.pk, finished_task_ids=["a"])
    assert len(plain) == 1


def test_a_ti_fail_fast_skips_wakes_the_next_runs_ti_waiting_on_it(
    django_capture_on_commit_callbacks,
):
    """fail_fast skips `b` of the first run (`dependencies.stop_remaining`): skipped counts as
    done for depends_on_past, so the second run's `b` is woken by the same follow-up."""
    sync(
        {
            "dag_id": "d",
            "fail_fast": True,
            "tasks": [{"task_id": "a"}, {"task_id": "b", "depends_on_past": True}],
        }
    )
    first = trigger("d", 0, django_capture_on_commit_callbacks)
    second = trigger("d", 1, django_capture_on_commit_callbacks)
    assert state(second, "b") == TIState.SCHEDULED
    run_and_finish(first, "a", TIState.FAILED)
    assert state(first, "b") == TIState.SKIPPED
    assert state(second, "b") == TIState.QUEUED
