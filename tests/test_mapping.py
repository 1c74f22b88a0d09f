"""Dynamic task mapping (issue 25) against real PostgreSQL: mapped tasks in the definition
format and their sync."""

import json

import pytest
from django.utils import timezone

from assets_app import definitions, dependencies, runs, xcoms
from assets_app.models import Dag, DagRun, Task, TaskInstance, TIState, XCom
from assets_app.task_state import finishing, starting, success

pytestmark = pytest.mark.django_db

FAN_OUT = {
    "dag_id": "fan_out",
    "tasks": [
        {"task_id": "list_files"},
        {"task_id": "each", "upstream": ["list_files"], "expand": {"path": {"xcom": "list_files"}}},
        {"task_id": "fixed", "expand": {"n": [1, "two", {"three": 3}]}},
        {"task_id": "none", "expand": {"n": []}},
        {"task_id": "sum", "upstream": ["each"]},
    ],
}


def sync(*dags: dict) -> definitions.SyncResult:
    return definitions.sync_definitions(
        dags=[d for dag in dags for d in definitions.parse_text(json.dumps(dag), file="t.json")]
    )


def mapping(dag_id: str) -> dict[str, tuple[int | None, str]]:
    return {
        task_id: (length, upstream)
        for task_id, length, upstream in Task.objects.filter(dag_id=dag_id).values_list(
            "task_id", "map_length", "map_upstream"
        )
    }


def test_sync_stores_what_each_task_maps_over_and_a_second_sync_changes_nothing():
    sync(FAN_OUT)
    assert mapping("fan_out") == {
        "list_files": (None, ""),
        "each": (None, "list_files"),
        "fixed": (3, ""),
        "none": (0, ""),
        "sum": (None, ""),
    }
    assert [t.task_id for t in Task.objects.filter(dag_id="fan_out") if t.is_mapped] == [
        "each",
        "fixed",
        "none",
    ]
    assert sync(FAN_OUT).tasks_unchanged == 5


def test_a_changed_expand_updates_the_task_and_a_removed_one_unmaps_it():
    sync(FAN_OUT)
    changed = json.loads(json.dumps(FAN_OUT))
    changed["tasks"][1].pop("expand")
    changed["tasks"][2]["expand"] = {"n": [1]}
    result = sync(changed)
    assert result.tasks_updated == 2
    assert mapping("fan_out")["each"] == (None, "")
    assert mapping("fan_out")["fixed"] == (1, "")


def test_a_literal_of_exactly_max_map_length_values_is_accepted(settings):
    settings.MAX_MAP_LENGTH = 4
    sync({"dag_id": "d", "tasks": [{"task_id": "a", "expand": {"x": [1, 2, 3, 4]}}]})
    assert mapping("d") == {"a": (4, "")}
    with pytest.raises(definitions.DefinitionError, match="expand over 5 values, more than"):
        sync({"dag_id": "d", "tasks": [{"task_id": "a", "expand": {"x": [1, 2, 3, 4, 5]}}]})
    assert mapping("d") == {"a": (4, "")}


# --- expansion --------------------------------------------------------------------------------


def tis(run: DagRun, task_id: str) -> list[tuple[int, str]]:
    return list(
        TaskInstance.objects.filter(dag_run=run, task_id=task_id)
        .order_by("map_index")
        .values_list("map_index", "state")
    )


def start(ti: TaskInstance) -> dict:
    tries = {"ti_id": ti.id, "try_number": ti.try_number}
    starting.start(**tries, hostname="h", unixname="u", pid=1, start_date=timezone.now())
    return tries


def succeed(ti: TaskInstance, *, returned=None, mapped_length=None, push=True) -> None:
    """Run a queued TI as the Task SDK does: start, push its return value (with the length it
    sends when a mapped task expands over it), succeed."""
    tries = start(ti)
    if push:
        xcoms.push(
            dag_id=ti.dag_id,
            run_id=ti.run_id,
            task_id=ti.task_id,
            key="return_value",
            value=returned,
            map_index=ti.map_index,
            mapped_length=mapped_length,
        )
    success.succeed(**tries, end_date=timezone.now(), task_outlets=[], outlet_events=[])


def fail(ti: TaskInstance) -> None:
    finishing.finish(**start(ti), state=TIState.FAILED, end_date=timezone.now())


def one(run: DagRun, task_id: str, map_index: int = -1) -> TaskInstance:
    return TaskInstance.objects.get(dag_run=run, task_id=task_id, map_index=map_index)


def test_a_literal_expands_when_the_run_is_created_in_the_same_ti_insert(
    django_assert_num_queries,
):
    sync(FAN_OUT)
    dag = Dag.objects.get(dag_id="fan_out")
    # tasks, run, TIs (one INSERT for all of them, map indexes included)
    with django_assert_num_queries(3):
        run = runs.create_dag_run(dag=dag, run_type="manual", run_after=timezone.now())
    assert tis(run, "fixed") == [(0, "queued"), (1, "queued"), (2, "queued")]
    assert tis(run, "each") == [(-1, "scheduled")]
    assert tis(run, "list_files") == [(-1, "queued")]
    # A root over an empty literal: skipped at once (nothing downstream of it here).
    assert tis(run, "none") == [(-1, "skipped")]


def test_an_empty_literal_skips_the_task_and_its_downstream_after_the_commit(
    django_capture_on_commit_callbacks,
):
    sync(
        {
            "dag_id": "empty",
            "tasks": [
                {"task_id": "none", "expand": {"n": []}},
                {"task_id": "after", "upstream": ["none"]},
                {"task_id": "anyway", "upstream": ["none"], "trigger_rule": "all_done"},
            ],
        }
    )
    with django_capture_on_commit_callbacks(execute=True):
        run = runs.trigger_dag(dag_id="empty")
    assert tis(run, "none") == [(-1, "skipped")]
    assert tis(run, "after") == [(-1, "skipped")]
    assert tis(run, "anyway") == [(-1, "queued")]


def test_an_upstream_return_value_expands_the_mapped_task_into_queued_map_indexes():
    sync(FAN_OUT)
    run = runs.trigger_dag(dag_id="fan_out")
    succeed(one(run, "list_files"), returned=["a", "b", "c"], mapped_length=3)
    assert XCom.objects.get(task_id="list_files").mapped_length == 3
    assert tis(run, "each") == [(0, "queued"), (1, "queued"), (2, "queued")]
    assert tis(run, "sum") == [(-1, "scheduled")]
    # The expanded TIs are those tasks' own: their retries, a first try.
    assert set(
        TaskInstance.objects.filter(dag_run=run, task_id="each").values_list(
            "try_number", "max_tries", "dag_id", "run_id"
        )
    ) == {(1, 0, "fan_out", run.run_id)}
    # A second evaluation (the sweep, a racing finish) finds nothing to expand.
    dependencies.evaluate(dag_run_id=run.pk, finished_task_ids=None)
    assert len(tis(run, "each")) == 3


def test_without_a_pushed_length_the_length_of_the_returned_list_is_used():
    sync(FAN_OUT)
    run = runs.trigger_dag(dag_id="fan_out")
    succeed(one(run, "list_files"), returned=[1, 2])
    assert tis(run, "each") == [(0, "queued"), (1, "queued")]


@pytest.mark.parametrize(
    ("returned", "push", "each", "downstream"),
    [
        # Airflow 3.3.2 TaskMap.expand_mapped_task: "Marking ... as SKIPPED since the map has
        # 0 values to expand"; all_success downstream of a skipped task is skipped.
        ([], True, "skipped", "skipped"),
        # Nothing to map over (NotFullyPopulated): the -1 TI is upstream_failed.
        (None, False, "upstream_failed", "upstream_failed"),
        ("a string", True, "upstream_failed", "upstream_failed"),
    ],
    ids=["zero_length_skips", "no_value_pushed_upstream_failed", "not_a_list_upstream_failed"],
)
def test_zero_length_or_missing_return_values(returned, push, each, downstream):
    sync(FAN_OUT)
    run = runs.trigger_dag(dag_id="fan_out")
    succeed(
        one(run, "list_files"),
        returned=returned,
        mapped_length=len(returned) if isinstance(returned, list) else None,
        push=push,
    )
    assert tis(run, "each") == [(-1, each)]
    assert tis(run, "sum") == [(-1, downstream)]


def test_a_mapped_task_whose_rule_fails_is_not_expanded():
    sync(FAN_OUT)
    run = runs.trigger_dag(dag_id="fan_out")
    fail(one(run, "list_files"))
    assert tis(run, "each") == [(-1, "upstream_failed")]
    assert tis(run, "sum") == [(-1, "upstream_failed")]
