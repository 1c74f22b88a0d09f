"""Try numbers as Airflow 3.3.2 counts them (issue 39): a try is counted when a TI is queued
(`DagRun.schedule_tis`: try_number + 1), so a TI that never was (skipped by a branch,
upstream_failed, the one TI of a mapped task over an empty list) stays at try 0, as on Airflow;
a retry and a clear count the next one, and a worker's token keeps the try it claimed."""

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from assets_app.models import TaskInstance, TIState
from assets_app.scheduling import runs
from assets_app.task_state import finishing, retries, success
from tests.factories import TaskInstanceFactory
from tests.test_mapping import fail, one, start, succeed, sync

pytestmark = pytest.mark.django_db

BRANCHING = {
    "dag_id": "b",
    "tasks": [
        {"task_id": "choose"},
        {"task_id": "left", "upstream": ["choose"]},
        {"task_id": "right", "upstream": ["choose"]},
        {"task_id": "after_right", "upstream": ["right"]},
        {"task_id": "broken", "upstream": ["left"], "retries": 1},
        {"task_id": "after_broken", "upstream": ["broken"]},
    ],
}


def tries(run) -> dict[str, tuple[str, int]]:
    return {
        ti.task_id: (ti.state, ti.try_number) for ti in TaskInstance.objects.filter(dag_run=run)
    }


def test_a_ti_counts_a_try_when_it_is_queued_and_one_never_queued_stays_at_0():
    """Airflow's `example_branch_*` and `example_bash_operator`: the branch's other side is
    skipped while it waits (try 0 on Airflow), the failed task's downstream upstream_failed."""
    sync(BRANCHING)
    run = runs.trigger_dag(dag_id="b")
    assert tries(run) == {
        "choose": ("queued", 1),
        **dict.fromkeys(
            ["left", "right", "after_right", "broken", "after_broken"], ("scheduled", 0)
        ),
    }
    choose = one(run, "choose")
    token = start(choose)
    finishing.skip_downstream(**token, tasks=[("right", -1)])
    success.succeed(**token, end_date=timezone.now(), task_outlets=[], outlet_events=[])
    assert tries(run)["left"] == ("queued", 1)
    assert tries(run)["right"] == ("skipped", 0)
    assert tries(run)["after_right"] == ("skipped", 0)
    succeed(one(run, "left"))
    broken = one(run, "broken")
    assert (broken.state, broken.try_number) == ("queued", 1)
    # A retry counts the next try at once, as the token of try 1 goes stale.
    retried = retries.retry(**start(broken), end_date=timezone.now(), retry_delay_seconds=0)
    assert (retried.state, retried.try_number) == (TIState.QUEUED, 2)
    fail(one(run, "broken"))
    assert tries(run) == {
        "choose": ("success", 1),
        "left": ("success", 1),
        "right": ("skipped", 0),
        "after_right": ("skipped", 0),
        "broken": ("failed", 2),
        "after_broken": ("upstream_failed", 0),
    }


def test_a_mapped_task_over_an_empty_list_is_skipped_at_try_0():
    """Airflow's `example_dynamic_task_mapping` style empty expansions: a literal [] (its TI
    skipped at the run's creation) and an upstream's empty return value."""
    sync(
        {
            "dag_id": "m",
            "tasks": [
                {"task_id": "src"},
                {"task_id": "over_nothing", "expand": {"x": []}},
                {"task_id": "over_src", "upstream": ["src"], "expand": {"x": {"xcom": "src"}}},
            ],
        }
    )
    run = runs.trigger_dag(dag_id="m")
    assert (one(run, "over_nothing").state, one(run, "over_nothing").try_number) == (
        "skipped",
        0,
    )
    succeed(one(run, "src"), returned=[], mapped_length=0)
    assert (one(run, "over_src").state, one(run, "over_src").try_number) == ("skipped", 0)


def test_a_cleared_ti_is_at_its_next_try_and_keeps_it_when_queued():
    sync(BRANCHING)
    run = runs.trigger_dag(dag_id="b")
    fail(one(run, "choose"))
    assert tries(run)["left"] == ("upstream_failed", 0)
    runs.clear_task_instances(dag_run_id=run.pk)
    # choose (a root) is queued at try 2; left waits at try 1 and keeps it when queued.
    assert tries(run)["choose"] == ("queued", 2)
    assert tries(run)["left"] == ("scheduled", 1)
    succeed(one(run, "choose"))
    assert tries(run)["left"] == ("queued", 1)


def test_the_database_refuses_a_queued_or_running_ti_without_a_try():
    for state in (TIState.QUEUED, TIState.RUNNING, TIState.UP_FOR_RETRY):
        with pytest.raises(IntegrityError), transaction.atomic():
            TaskInstanceFactory(state=state, try_number=0)
    for state in (TIState.SCHEDULED, TIState.SKIPPED, TIState.UPSTREAM_FAILED):
        assert TaskInstanceFactory(state=state, try_number=0).try_number == 0
