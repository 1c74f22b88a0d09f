"""Dynamic task mapping (issue 25) against real PostgreSQL: mapped tasks in the definition
format and their sync."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from assets_app.definitions import sync as definitions
from assets_app.models import Dag, DagRun, Task, TaskInstance, TIState, XCom
from assets_app.runtime import xcoms
from assets_app.scheduling import dependencies, mapping, runs
from assets_app.task_state import claims, finishing, retries, starting, success

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parent.parent

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


def unpaused(dag: dict) -> dict:
    """The Dag runs once synced (a sync pauses a new Dag unless it says so, issue 39)."""
    return {"is_paused": False, **dag}


def sync(*dags: dict) -> definitions.SyncResult:
    return definitions.sync_definitions(
        dags=[
            d
            for dag in dags
            for d in definitions.parse_text(json.dumps(unpaused(dag)), file="t.json")
        ]
    )


def mapped_over(dag_id: str) -> dict[str, tuple[int | None, str]]:
    return {
        task_id: (length, upstream)
        for task_id, length, upstream in Task.objects.filter(dag_id=dag_id).values_list(
            "task_id", "map_length", "map_upstream"
        )
    }


def test_sync_stores_what_each_task_maps_over_and_a_second_sync_changes_nothing():
    sync(FAN_OUT)
    assert mapped_over("fan_out") == {
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
    assert mapped_over("fan_out")["each"] == (None, "")
    assert mapped_over("fan_out")["fixed"] == (1, "")


def test_a_literal_of_exactly_max_map_length_values_is_accepted(settings):
    settings.MAX_MAP_LENGTH = 4
    sync({"dag_id": "d", "tasks": [{"task_id": "a", "expand": {"x": [1, 2, 3, 4]}}]})
    assert mapped_over("d") == {"a": (4, "")}
    with pytest.raises(definitions.DefinitionError, match="expand over 5 values, more than"):
        sync({"dag_id": "d", "tasks": [{"task_id": "a", "expand": {"x": [1, 2, 3, 4, 5]}}]})
    assert mapped_over("d") == {"a": (4, "")}


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


def test_mapped_tasks_added_to_an_existing_run_are_expanded_not_run_unmapped():
    sync({"dag_id": "grows", "tasks": [{"task_id": "list_files"}]})
    run = runs.trigger_dag(dag_id="grows")
    succeed(one(run, "list_files"), returned=["a", "b"], mapped_length=2)
    sync(
        {
            "dag_id": "grows",
            "tasks": [
                {"task_id": "list_files"},
                {
                    "task_id": "each",
                    "upstream": ["list_files"],
                    "expand": {"x": {"xcom": "list_files"}},
                },
                {"task_id": "fixed", "expand": {"x": [1, 2, 3]}},
                {"task_id": "none", "expand": {"x": []}},
            ],
        }
    )
    result = runs.clear_dag_run(dag_id="grows", run_id=run.run_id, dry_run=False, only_new=True)
    assert result.new_task_ids == ["each", "fixed", "none"]
    assert tis(run, "each") == [(0, "queued"), (1, "queued")]
    assert tis(run, "fixed") == [(0, "queued"), (1, "queued"), (2, "queued")]
    assert tis(run, "none") == [(-1, "skipped")]


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


# --- downstream of a mapped task ----------------------------------------------------------------


def mapped_dag(rule: str) -> DagRun:
    sync(
        {
            "dag_id": "m",
            "tasks": [
                {"task_id": "list_files"},
                {
                    "task_id": "each",
                    "upstream": ["list_files"],
                    "expand": {"path": {"xcom": "list_files"}},
                },
                {"task_id": "after", "upstream": ["each"], "trigger_rule": rule},
            ],
        }
    )
    run = runs.trigger_dag(dag_id="m")
    succeed(one(run, "list_files"), returned=["a", "b", "c"], mapped_length=3)
    return run


@pytest.mark.parametrize(
    ("rule", "finishes", "after"),
    [
        # Waits for every map index, then runs.
        ("all_success", ["success", "success", "success"], ["scheduled", "scheduled", "queued"]),
        # One failed map index is enough to know (Airflow's flag_upstream_failed).
        ("all_success", ["success", "failed"], ["scheduled", "upstream_failed"]),
        ("all_done", ["success", "failed", "success"], ["scheduled", "scheduled", "queued"]),
        ("one_failed", ["success", "failed"], ["scheduled", "queued"]),
        (
            "one_success",
            ["failed", "failed", "failed"],
            ["scheduled", "scheduled", "upstream_failed"],
        ),
        (
            "none_failed",
            ["success", "success", "failed"],
            ["scheduled", "scheduled", "upstream_failed"],
        ),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_downstream_of_a_mapped_task_applies_its_rule_over_every_map_index(rule, finishes, after):
    run = mapped_dag(rule)
    seen = []
    for map_index, outcome in enumerate(finishes):
        ti = one(run, "each", map_index)
        succeed(ti, returned=map_index) if outcome == "success" else fail(ti)
        seen.append(tis(run, "after")[0][1])
    assert seen == after


def test_retries_are_per_map_index():
    sync(
        {
            "dag_id": "r",
            "tasks": [
                {"task_id": "list_files"},
                {
                    "task_id": "each",
                    "upstream": ["list_files"],
                    "retries": 1,
                    "retry_delay_seconds": 0,
                    "expand": {"path": {"xcom": "list_files"}},
                },
                {"task_id": "after", "upstream": ["each"]},
            ],
        }
    )
    run = runs.trigger_dag(dag_id="r")
    succeed(one(run, "list_files"), returned=["a", "b", "c"], mapped_length=3)
    assert {ti.max_tries for ti in TaskInstance.objects.filter(dag_run=run, task_id="each")} == {1}
    succeed(one(run, "each", 0), returned=0)
    flaky = one(run, "each", 1)
    retries.retry(**start(flaky), end_date=timezone.now())
    succeed(one(run, "each", 2), returned=2)
    tries = dict(
        TaskInstance.objects.filter(dag_run=run, task_id="each").values_list(
            "map_index", "try_number"
        )
    )
    assert tries == {0: 1, 1: 2, 2: 1}
    assert tis(run, "each") == [(0, "success"), (1, "queued"), (2, "success")]
    assert tis(run, "after") == [(-1, "scheduled")]
    succeed(one(run, "each", 1), returned=1)
    assert tis(run, "after") == [(-1, "queued")]


def test_clearing_one_map_index_runs_only_it_again_and_its_downstream_waits_for_it():
    run = mapped_dag("all_success")
    for map_index in range(3):
        succeed(one(run, "each", map_index), returned=map_index)
    succeed(one(run, "after"), returned=None)
    cleared = one(run, "each", 1)
    after = one(run, "after")
    result = runs.clear_task_instances(dag_run_id=run.pk, ti_ids=[cleared.id, after.id])
    assert result.cleared == ("after", "each")
    assert tis(run, "each") == [(0, "success"), (1, "queued"), (2, "success")]
    assert one(run, "each", 1).try_number == 2
    assert tis(run, "after") == [(-1, "scheduled")]
    succeed(one(run, "each", 1), returned=1)
    assert tis(run, "after") == [(-1, "queued")]


@pytest.mark.parametrize(
    ("new_length", "each"),
    [
        (2, [(0, "queued", 2), (1, "queued", 2), (2, "removed", 2)]),
        (
            5,
            [
                (0, "queued", 2),
                (1, "queued", 2),
                (2, "queued", 2),
                (3, "queued", 1),
                (4, "queued", 1),
            ],
        ),
    ],
    ids=["shrinks_beyond_are_removed", "grows_new_map_indexes_are_added"],
)
def test_a_cleared_run_revises_the_map_indexes_to_the_new_length(new_length, each):
    """Airflow 3.3.2's DagRun._revise_map_indexes_if_mapped, when the upstream runs again."""
    run = mapped_dag("all_success")
    for map_index in range(3):
        succeed(one(run, "each", map_index), returned=map_index)
    succeed(one(run, "after"), returned=None)
    runs.clear_task_instances(dag_run_id=run.pk)
    assert tis(run, "each") == [(0, "scheduled"), (1, "scheduled"), (2, "scheduled")]
    succeed(one(run, "list_files"), returned=list(range(new_length)), mapped_length=new_length)
    got = TaskInstance.objects.filter(dag_run=run, task_id="each").order_by("map_index")
    assert [(ti.map_index, ti.state, ti.try_number) for ti in got] == each
    for ti in got.filter(state="queued"):
        assert tis(run, "after") == [(-1, "scheduled")]
        succeed(ti, returned=ti.map_index)
    assert tis(run, "after") == [(-1, "queued")]


def test_the_run_finishes_only_after_every_map_index_and_its_downstream():
    run = mapped_dag("all_success")
    for map_index in range(3):
        run.refresh_from_db()
        assert run.state != "success"
        succeed(one(run, "each", map_index), returned=map_index)
    succeed(one(run, "after"), returned=None)
    run.refresh_from_db()
    assert run.state == "success"


def test_the_expansion_of_the_sqlite_path_follows_the_same_rules():
    """`mapping.expand`, which SQLite's evaluation leaves the expansion to (PostgreSQL's does it
    in its statement), called as it is there: on waiting -1 TIs whose rule is met."""
    sync(FAN_OUT, {**FAN_OUT, "dag_id": "other"})
    run = runs.trigger_dag(dag_id="fan_out")
    TaskInstance.objects.filter(dag_run=run, task_id="list_files").update(state="success")
    xcoms.push(
        dag_id="fan_out",
        run_id=run.run_id,
        task_id="list_files",
        key="return_value",
        value=["a", "b"],
        mapped_length=2,
    )
    now = timezone.now()
    assert mapping.expand(dag_run_id=run.pk, task_ids=["each"], now=now) == [("each", "queued")]
    assert tis(run, "each") == [(0, "queued"), (1, "queued")]
    # Expanded already: the -1 TI is gone, nothing changes.
    mapping.expand(dag_run_id=run.pk, task_ids=["each"], now=now)
    assert tis(run, "each") == [(0, "queued"), (1, "queued")]
    other = runs.trigger_dag(dag_id="other")
    assert mapping.expand(dag_run_id=other.pk, task_ids=["each"], now=now) == [
        ("each", "upstream_failed")
    ]
    xcoms.push(
        dag_id="other", run_id=other.run_id, task_id="list_files", key="return_value", value={}
    )
    TaskInstance.objects.filter(dag_run=other, task_id="each").update(state="scheduled")
    assert mapping.expand(dag_run_id=other.pk, task_ids=["each"], now=now) == [("each", "skipped")]
    assert tis(other, "each") == [(-1, "skipped")]


# --- end to end through the worker API's functions, committing for real ----------------------


def wide_dag(dag_id: str, *, mapped: bool) -> None:
    each = {"task_id": "each", "upstream": ["list_files"]}
    if mapped:
        each["expand"] = {"path": {"xcom": "list_files"}}
    sync(
        {
            "dag_id": dag_id,
            # Room for every map index at once (Airflow's default max_active_tasks is 16).
            "max_active_tasks": 100,
            "tasks": [{"task_id": "list_files"}, each, {"task_id": "sum", "upstream": ["each"]}],
        }
    )


def claimed(dag_id: str, limit: int) -> list[TaskInstance]:
    tis_ = [w.ti for w in claims.claim_workloads(hostname="w", limit=limit)]
    assert {ti.dag_id for ti in tis_} <= {dag_id}
    return tis_


def statements_of_the_upstream_success(dag_id: str, *, returned: list) -> tuple[DagRun, int]:
    run = runs.trigger_dag(dag_id=dag_id)
    (root,) = claimed(dag_id, 10)
    tries = start(root)
    xcoms.push(
        dag_id=dag_id,
        run_id=run.run_id,
        task_id="list_files",
        key="return_value",
        value=returned,
        mapped_length=len(returned),
    )
    with CaptureQueriesContext(connection) as queries:
        success.succeed(**tries, end_date=timezone.now(), task_outlets=[], outlet_events=[])
    return run, len(queries.captured_queries)


@pytest.mark.django_db(transaction=True)
def test_a_50_wide_expansion_costs_the_statements_of_a_5_wide_one_and_runs_end_to_end():
    wide_dag("plain", mapped=False)
    # A first success enqueues the scheduler's nudge; the ones measured find it pending.
    statements_of_the_upstream_success("plain", returned=["x"])
    claimed("plain", 10)
    counts = {}
    for n in (5, 50):
        dag_id = f"wide{n}"
        wide_dag(dag_id, mapped=True)
        run, counts[n] = statements_of_the_upstream_success(dag_id, returned=list(range(n)))
        assert tis(run, "each") == [(i, "queued") for i in range(n)]
        mapped_tis = claimed(dag_id, 100)
        assert sorted(ti.map_index for ti in mapped_tis) == list(range(n))
        for ti in sorted(mapped_tis, key=lambda ti: ti.map_index):
            assert tis(run, "sum") == [(-1, "scheduled")]
            tries = start(ti)
            xcoms.push(
                dag_id=dag_id,
                run_id=run.run_id,
                task_id="each",
                key="return_value",
                value=ti.map_index * 10,
                map_index=ti.map_index,
            )
            success.succeed(**tries, end_date=timezone.now(), task_outlets=[], outlet_events=[])
        assert tis(run, "sum") == [(-1, "queued")]
        # What the downstream's lazy xcom_pull reads: every map index's value, in order.
        values = xcoms.value_slice(
            dag_id=dag_id,
            run_id=run.run_id,
            task_id="each",
            key="return_value",
            start=None,
            stop=None,
            step=None,
        )
        assert sum(values) == 10 * n * (n - 1) // 2
        (last,) = claimed(dag_id, 10)
        assert last.task_id == "sum"
        succeed(last, returned=sum(values))
        run.refresh_from_db()
        assert run.state == "success"
    # The same success of an unmapped upstream.
    _, unmapped = statements_of_the_upstream_success("plain", returned=["x"])
    # The expansion is in the evaluation's one statement: no statement more, whatever n.
    assert counts[5] == counts[50] == unmapped == 7, (unmapped, counts)


# --- mapped task groups -------------------------------------------------------------------------


def group_dag(expand: dict, *, rule: str = "all_success", dag_id: str = "g") -> dict:
    """`src >> [a >> b]` with [a >> b] a mapped group over `expand`, `after` downstream of b
    outside the group (Airflow: `@task_group def g(x): b(a(x))`, `after(g.expand(x=...))`)."""
    return {
        "dag_id": dag_id,
        "tasks": [
            {"task_id": "src"},
            {"task_id": "g.a", "upstream": ["src"], "map_group": "g", "expand": expand},
            {
                "task_id": "g.b",
                "upstream": ["g.a"],
                "map_group": "g",
                "expand": expand,
                "trigger_rule": rule,
            },
            {"task_id": "after", "upstream": ["g.b"]},
        ],
    }


def states(run: DagRun, task_id: str) -> list[str]:
    return [state for _, state in tis(run, task_id)]


def test_sync_stores_the_mapped_group_of_its_tasks():
    sync(group_dag({"x": {"xcom": "src"}}))
    assert dict(Task.objects.filter(dag_id="g").values_list("task_id", "map_group")) == {
        "src": "",
        "g.a": "g",
        "g.b": "g",
        "after": "",
    }
    assert mapped_over("g")["g.b"] == (None, "src")
    assert sync(group_dag({"x": {"xcom": "src"}})).tasks_unchanged == 4


@pytest.mark.parametrize(
    ("change", "path", "message"),
    [
        (
            lambda d: d["tasks"][2].update(expand={"x": [1, 2]}),
            "tasks[2].expand.x",
            "task 'g.b' of the mapped group 'g' expands over 2 literal values, task 'g.a' of "
            "the group over the return value of 'src': a group's tasks expand over one source",
        ),
        (
            lambda d: d["tasks"][2].pop("expand"),
            "tasks[2].map_group",
            "task 'g.b' is in the mapped group 'g' but has no expand",
        ),
        (
            lambda d: d["tasks"][1].update(upstream=[]),
            "tasks[1].upstream",
            "task 'g.a' is a root of the mapped group 'g' (no upstream in it), which expands "
            "over the return value of 'src': list it in upstream",
        ),
        (
            lambda d: d["tasks"][0].update(map_group="g", expand={"x": {"xcom": "src"}}),
            "tasks[0].expand.x.xcom",
            "the mapped group 'g' expands over the return value of its own task 'src'",
        ),
        (
            lambda d: d["tasks"][2].update(trigger_rule="always"),
            "tasks[2].trigger_rule",
            "cannot have the trigger rule 'always' (as in Airflow)",
        ),
        (
            lambda d: d["tasks"][2].update(map_group=""),
            "tasks[2].map_group",
            "must not be empty",
        ),
    ],
    ids=[
        "different_sources",
        "no_expand",
        "root_without_the_source_upstream",
        "source_inside_the_group",
        "always_over_a_return_value",
        "empty_group_id",
    ],
)
def test_a_mapped_group_that_cannot_run_is_refused_naming_the_path_and_writes_nothing(
    change, path, message
):
    dag = group_dag({"x": {"xcom": "src"}})
    change(dag)
    with pytest.raises(definitions.DefinitionError) as refused:
        sync(dag)
    assert refused.value.path == path
    assert message in refused.value.message
    assert not Dag.objects.exists()
    assert not Task.objects.exists()


def test_a_literal_group_runs_map_index_i_after_map_index_i_of_its_upstream_in_the_group():
    sync(group_dag({"x": [1, 2, 3, 4, 5]}))
    run = runs.trigger_dag(dag_id="g")
    assert states(run, "g.a") == ["scheduled"] * 5
    assert states(run, "g.b") == ["scheduled"] * 5
    succeed(one(run, "src"))
    assert states(run, "g.a") == ["queued"] * 5
    succeed(one(run, "g.a", 2), returned=2)
    assert states(run, "g.b") == ["scheduled", "scheduled", "queued", "scheduled", "scheduled"]
    # A[3] failed: B[3] upstream_failed, the others still run after their own A.
    fail(one(run, "g.a", 3))
    assert states(run, "g.b") == [
        "scheduled",
        "scheduled",
        "queued",
        "upstream_failed",
        "scheduled",
    ]
    succeed(one(run, "g.a", 0), returned=0)
    assert states(run, "g.b")[0] == "queued"
    # Outside the group, `after` waits for every map index of b (b[3] upstream_failed: it is
    # upstream_failed once that is known, as Airflow's flag_upstream_failed has it).
    assert states(run, "after") == ["upstream_failed"]


def test_a_group_over_a_return_value_expands_all_its_tasks_when_its_root_does():
    sync(group_dag({"x": {"xcom": "src"}}))
    run = runs.trigger_dag(dag_id="g")
    assert tis(run, "g.a") == [(-1, "scheduled")]
    assert tis(run, "g.b") == [(-1, "scheduled")]
    succeed(one(run, "src"), returned=list("abcde"), mapped_length=5)
    assert states(run, "g.a") == ["queued"] * 5
    # b expands in the same statement, each map index waiting for its own a: no try counted
    # yet (Airflow 3.3.2 counts one when its scheduler queues a TI).
    assert tis(run, "g.b") == [(i, "scheduled") for i in range(5)]
    assert {
        (ti.try_number, ti.max_tries, ti.dag_id, ti.run_id)
        for ti in TaskInstance.objects.filter(dag_run=run, task_id="g.b")
    } == {(0, 0, "g", run.run_id)}
    # A second evaluation (the sweep, a racing finish) expands nothing again.
    dependencies.evaluate(dag_run_id=run.pk, finished_task_ids=None)
    assert len(tis(run, "g.b")) == 5
    for i in (4, 1):
        succeed(one(run, "g.a", i), returned=i)
    assert states(run, "g.b") == ["scheduled", "queued", "scheduled", "scheduled", "queued"]
    fail(one(run, "g.a", 3))
    assert states(run, "g.b")[3] == "upstream_failed"
    succeed(one(run, "g.a", 0), returned=0)
    succeed(one(run, "g.a", 2), returned=2)
    assert states(run, "g.b") == ["queued", "queued", "queued", "upstream_failed", "queued"]
    tries = TaskInstance.objects.filter(dag_run=run, task_id="g.b").order_by("map_index")
    assert [ti.try_number for ti in tries] == [1, 1, 1, 0, 1]
    assert states(run, "after") == ["upstream_failed"]


def test_downstream_outside_the_group_waits_for_every_map_index():
    sync(group_dag({"x": {"xcom": "src"}}))
    run = runs.trigger_dag(dag_id="g")
    succeed(one(run, "src"), returned=[1, 2, 3], mapped_length=3)
    for i in range(3):
        succeed(one(run, "g.a", i), returned=i)
    for i in range(3):
        assert states(run, "after") == ["scheduled"]
        succeed(one(run, "g.b", i), returned=i)
    assert states(run, "after") == ["queued"]
    succeed(one(run, "after"))
    run.refresh_from_db()
    assert run.state == "success"


@pytest.mark.parametrize(
    "expand", [{"x": []}, {"x": {"xcom": "src"}}], ids=["empty_literal", "empty_return_value"]
)
def test_a_zero_length_group_skips_all_its_tasks(expand):
    sync(group_dag(expand, rule="all_done"))
    run = runs.trigger_dag(dag_id="g")
    succeed(one(run, "src"), returned=[], mapped_length=0)
    assert tis(run, "g.a") == [(-1, "skipped")]
    # b's rule (all_done) is met by a skipped a: it expands to nothing, skipped as well.
    assert tis(run, "g.b") == [(-1, "skipped")]
    assert tis(run, "after") == [(-1, "skipped")]


def test_a_one_success_task_of_a_group_waits_on_every_map_index_of_its_upstream_in_it():
    """Airflow 3.3.2 `TriggerRuleDep`: the fast-triggered rules (one_success, one_failed,
    one_done) inside a mapped group count every map index of an upstream in it."""
    sync(group_dag({"x": [1, 2, 3]}, rule="one_success"))
    run = runs.trigger_dag(dag_id="g")
    succeed(one(run, "src"))
    succeed(one(run, "g.a", 0), returned=0)
    assert states(run, "g.b") == ["queued"] * 3


def test_the_sqlite_expansion_spreads_to_the_other_tasks_of_the_group():
    """`mapping.expand` (SQLite's expansion, called as there on the root's ready -1 TI)."""
    sync(group_dag({"x": {"xcom": "src"}}))
    run = runs.trigger_dag(dag_id="g")
    TaskInstance.objects.filter(dag_run=run, task_id="src").update(state="success")
    xcoms.push(dag_id="g", run_id=run.run_id, task_id="src", key="return_value", value=[1, 2, 3, 4])
    now = timezone.now()
    with CaptureQueriesContext(connection) as queries:
        assert mapping.expand(dag_run_id=run.pk, task_ids=["g.a"], now=now) == [("g.a", "queued")]
    assert tis(run, "g.a") == [(i, "queued") for i in range(4)]
    assert tis(run, "g.b") == [(i, "scheduled") for i in range(4)]
    # Constant in the width: the run, the lengths, the UPDATE of the roots, the waiting -1 TIs
    # of the group's other tasks and their UPDATE, one INSERT.
    assert len(queries.captured_queries) == 6
    mapping.expand(dag_run_id=run.pk, task_ids=["g.a"], now=now)
    assert len(tis(run, "g.b")) == 4


@pytest.mark.django_db(transaction=True)
def test_a_50_wide_group_expands_with_the_statements_of_an_unmapped_success():
    wide_dag("plain", mapped=False)
    statements_of_the_upstream_success("plain", returned=["x"])
    claimed("plain", 10)
    counts = {}
    for n in (5, 50):
        dag_id = f"group{n}"
        dag = group_dag({"x": {"xcom": "src"}}, dag_id=dag_id)
        dag["tasks"][0]["task_id"] = "list_files"
        for task in dag["tasks"][1:2]:
            task["upstream"] = ["list_files"]
            task["expand"] = {"x": {"xcom": "list_files"}}
        dag["tasks"][2]["expand"] = {"x": {"xcom": "list_files"}}
        dag["max_active_tasks"] = 100  # every map index at once (Airflow's default: 16)
        sync(dag)
        run, counts[n] = statements_of_the_upstream_success(dag_id, returned=list(range(n)))
        assert tis(run, "g.a") == [(i, "queued") for i in range(n)]
        assert tis(run, "g.b") == [(i, "scheduled") for i in range(n)]
        assert len(claimed(dag_id, 100)) == n
    _, unmapped = statements_of_the_upstream_success("plain", returned=["x"])
    assert counts[5] == counts[50] == unmapped == 7, (unmapped, counts)


def test_mapped_groups_on_sqlite_follow_the_same_rules(tmp_path):
    """The SQLite path (its evaluation statement, `mapping.expand`'s spread), in a process of
    its own on a migrated SQLite file: `tests/data/sqlite_mapped_groups.py`."""
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "PYTHONPATH": str(ROOT),
    }
    python = sys.executable
    subprocess.run([python, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    done = subprocess.run(
        [python, str(ROOT / "tests/data/sqlite_mapped_groups.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    waiting, queued, failed = "scheduled", "queued", "upstream_failed"
    for dag_id in ("literal", "xcom"):
        assert seen[f"{dag_id}: expanded"] == [
            [[i, queued] for i in range(5)],
            [[i, waiting] for i in range(5)],
        ]
        assert [s for _, s in seen[f"{dag_id}: a[2] succeeded"]] == [
            waiting,
            waiting,
            queued,
            waiting,
            waiting,
        ]
        assert [s for _, s in seen[f"{dag_id}: a[3] failed"]] == [
            waiting,
            waiting,
            queued,
            failed,
            waiting,
        ]
        assert [s for _, s in seen[f"{dag_id}: a[0] succeeded"]] == [
            queued,
            waiting,
            queued,
            failed,
            waiting,
        ]
    assert seen["after waits"] == [[[-1, waiting]]] * 3 + [[[-1, queued]]]
    assert seen["zero length"] == [[[-1, "skipped"]]] * 3


@pytest.mark.parametrize(
    ("new_length", "a", "b"),
    [
        (
            2,
            ["queued", "queued", "removed"],
            ["scheduled", "scheduled", "removed"],
        ),
        (
            5,
            ["queued"] * 5,
            ["scheduled"] * 5,
        ),
    ],
    ids=["shrinks_beyond_are_removed", "grows_every_task_of_the_group"],
)
def test_a_cleared_group_revises_every_task_to_the_new_length(new_length, a, b):
    """Airflow 3.3.2's `_revise_map_indexes_if_mapped` for a group: the root's map index 0
    grows or removes, the group's other tasks follow (the added ones waiting for their a)."""
    sync(group_dag({"x": {"xcom": "src"}}))
    run = runs.trigger_dag(dag_id="g")
    succeed(one(run, "src"), returned=[1, 2, 3], mapped_length=3)
    for task_id in ("g.a", "g.b"):
        for i in range(3):
            succeed(one(run, task_id, i), returned=i)
    succeed(one(run, "after"))
    runs.clear_task_instances(dag_run_id=run.pk)
    succeed(one(run, "src"), returned=list(range(new_length)), mapped_length=new_length)
    assert states(run, "g.a") == a
    assert states(run, "g.b") == b
    for i in range(min(new_length, 3), new_length):
        assert one(run, "g.b", i).try_number == 0  # waiting for its a: no try yet
    for i in range(new_length):
        succeed(one(run, "g.a", i), returned=i)
        assert states(run, "g.b")[i] == "queued"
        assert one(run, "g.b", i).try_number == (1 if i >= 3 else 2)  # a cleared one: its next
    for i in range(new_length):
        assert states(run, "after") == ["scheduled"]
        succeed(one(run, "g.b", i), returned=i)
    assert states(run, "after") == ["queued"]


# --- second order: over a mapped task's output (issue 39) --------------------------------------

SECOND_ORDER = {
    "dag_id": "second_order",
    "tasks": [
        {"task_id": "first", "expand": {"x": [1, 2, 3, 4]}},
        {"task_id": "second", "upstream": ["first"], "expand": {"x": {"xcom": "first"}}},
        {
            "task_id": "eager",
            "upstream": ["first"],
            "trigger_rule": "one_success",
            "expand": {"x": {"xcom": "first"}},
        },
        {
            "task_id": "lenient",
            "upstream": ["first"],
            "trigger_rule": "none_failed",
            "expand": {"x": {"xcom": "first"}},
        },
    ],
}


def skip(ti: TaskInstance) -> None:
    finishing.finish(**start(ti), state=TIState.SKIPPED, end_date=timezone.now())


def test_sync_accepts_a_task_mapped_over_a_mapped_tasks_output():
    sync(SECOND_ORDER)
    assert mapped_over("second_order")["second"] == (None, "first")


def test_over_a_mapped_output_the_length_is_the_count_of_return_values_its_map_indexes_pushed():
    """Airflow 3.3.2's `get_task_map_length` over a mapped task: COUNT of its return-value
    XComs of map index >= 0, once none of its TIs is unfinished; a map index that returned None
    (the Task SDK pushes nothing) or was skipped counts for nothing."""
    sync(SECOND_ORDER)
    run = runs.trigger_dag(dag_id="second_order")
    succeed(one(run, "first", 0), returned=10)
    # one_success is met by the first map index; the others are unfinished: NotFullyPopulated,
    # the -1 TI is upstream_failed (TaskMap.expand_mapped_task).
    assert tis(run, "eager") == [(-1, "upstream_failed")]
    succeed(one(run, "first", 1), push=False)  # returned None
    succeed(one(run, "first", 2), returned=[3, 3])
    assert tis(run, "lenient") == [(-1, "scheduled")]
    skip(one(run, "first", 3))
    # all_success: a skipped map index skips it; none_failed: two values pushed, two map indexes.
    assert tis(run, "second") == [(-1, "skipped")]
    assert tis(run, "lenient") == [(0, "queued"), (1, "queued")]


def test_over_a_mapped_output_that_pushed_nothing_the_task_is_skipped():
    sync(SECOND_ORDER)
    run = runs.trigger_dag(dag_id="second_order")
    for map_index in range(4):
        succeed(one(run, "first", map_index), push=False)
    assert tis(run, "second") == [(-1, "skipped")]
    assert tis(run, "lenient") == [(-1, "skipped")]


def test_a_mapped_group_over_a_mapped_output_expands_to_the_count_of_its_pushed_values():
    """Airflow 3.3.2 counts a group's length as a task's (`get_mapped_ti_count` of the group:
    `get_task_map_length` of the mapped output), and the group's roots wait on every map index
    of the mapped task outside it (`_get_relevant_map_indexes`: no common mapped group)."""
    sync(
        {
            "dag_id": "g",
            "tasks": [
                {"task_id": "first", "expand": {"x": [1, 2, 3]}},
                {
                    "task_id": "g.a",
                    "upstream": ["first"],
                    "map_group": "g",
                    "trigger_rule": "none_failed",
                    "expand": {"x": {"xcom": "first"}},
                },
                {
                    "task_id": "g.b",
                    "upstream": ["g.a"],
                    "map_group": "g",
                    "expand": {"x": {"xcom": "first"}},
                },
            ],
        }
    )
    run = runs.trigger_dag(dag_id="g")
    succeed(one(run, "first", 0), returned="x")
    succeed(one(run, "first", 1), push=False)  # returned None
    assert tis(run, "g.a") == [(-1, "scheduled")]
    skip(one(run, "first", 2))
    assert tis(run, "g.a") == [(0, "queued")]
    assert tis(run, "g.b") == [(0, "scheduled")]
    succeed(one(run, "g.a", 0), returned=1)
    assert tis(run, "g.b") == [(0, "queued")]


def test_the_sqlite_expansion_counts_a_mapped_outputs_pushed_values_the_same_way():
    sync(SECOND_ORDER)
    run = runs.trigger_dag(dag_id="second_order")
    now = timezone.now()
    TaskInstance.objects.filter(dag_run=run, task_id="first", map_index__lt=3).update(
        state="success"
    )
    for map_index in (0, 2):
        xcoms.push(
            dag_id="second_order",
            run_id=run.run_id,
            task_id="first",
            key="return_value",
            value=map_index,
            map_index=map_index,
        )
    # Map index 3 still queued: nothing to map over yet (NotFullyPopulated).
    assert mapping.expand(dag_run_id=run.pk, task_ids=["eager"], now=now) == [
        ("eager", "upstream_failed")
    ]
    TaskInstance.objects.filter(dag_run=run, task_id="first", map_index=3).update(state="skipped")
    assert mapping.expand(dag_run_id=run.pk, task_ids=["lenient"], now=now) == [
        ("lenient", "queued")
    ]
    assert tis(run, "lenient") == [(0, "queued"), (1, "queued")]


# --- over several return values: zip and concat (issue 39) -----------------------------------


def xcoms_of(*task_ids: str) -> dict:
    return {"x": {"zip": [{"xcom": task_id} for task_id in task_ids]}}


COMBINED = {
    "dag_id": "combined",
    "tasks": [
        {"task_id": "a"},
        {"task_id": "b"},
        {"task_id": "first", "expand": {"x": [1, 2, 3]}},
        {"task_id": "zip", "upstream": ["a", "b"], "expand": xcoms_of("a", "b")},
        {
            "task_id": "zip_fill",
            "upstream": ["a", "b"],
            # null is a fillvalue too (Airflow's is_arg_set(None)): the longest counts.
            "expand": {"x": {"zip": [{"xcom": "a"}, {"xcom": "b"}], "fillvalue": None}},
        },
        {
            "task_id": "concat",
            "upstream": ["a", "b"],
            "expand": {"x": {"concat": [{"xcom": "a"}, {"xcom": "b"}, {"xcom": "a"}]}},
        },
        {
            "task_id": "zip_mapped",
            "upstream": ["a", "first"],
            "trigger_rule": "all_done",
            "expand": xcoms_of("first", "a"),
        },
        {
            "task_id": "concat_mapped",
            "upstream": ["a", "first"],
            "trigger_rule": "all_done",
            "expand": {"kwargs": {"concat": [{"xcom": "a"}, {"xcom": "first"}]}},
        },
    ],
}


def combined_run(*, a=None, b=None) -> DagRun:
    """A run of COMBINED with `a` and `b` succeeded, returning these lists (None: not run)."""
    sync(COMBINED)
    run = runs.trigger_dag(dag_id="combined")
    for task_id, returned in (("a", a), ("b", b)):
        if returned is not None:
            succeed(one(run, task_id), returned=returned, mapped_length=len(returned))
    return run


def test_sync_stores_how_several_return_values_combine_and_a_second_sync_changes_nothing():
    sync(COMBINED)
    stored = {
        task_id: (upstream, combine, sources)
        for task_id, upstream, combine, sources in Task.objects.filter(
            dag_id="combined", map_length__isnull=True
        ).values_list("task_id", "map_upstream", "map_combine", "map_sources")
    }
    assert stored == {
        "a": ("", "", []),
        "b": ("", "", []),
        "zip": ("a", "zip", ["a", "b"]),
        "zip_fill": ("a", "zip_longest", ["a", "b"]),
        "concat": ("a", "concat", ["a", "b", "a"]),
        "zip_mapped": ("first", "zip", ["first", "a"]),
        "concat_mapped": ("a", "concat", ["a", "first"]),
    }
    assert sync(COMBINED).tasks_unchanged == 8


def test_zip_is_the_shortest_with_a_fillvalue_the_longest_and_concat_the_sum():
    """Airflow 3.3.2's `get_task_map_length` of a ZipXComArg (min, max with a fillvalue) and a
    ConcatXComArg (sum), each source's length the one pushed with it (an object's keys too)."""
    run = combined_run(a=[1, 2, 3])
    # b not done yet: nothing expands.
    assert tis(run, "zip") == [(-1, "scheduled")]
    succeed(one(run, "b"), returned={"k": 1, "l": 2}, mapped_length=2)
    assert tis(run, "zip") == [(0, "queued"), (1, "queued")]
    assert tis(run, "zip_fill") == [(i, "queued") for i in range(3)]
    assert tis(run, "concat") == [(i, "queued") for i in range(8)]


def test_an_empty_source_makes_zip_skip_and_counts_nothing_in_concat_or_a_filled_zip():
    run = combined_run(a=[], b=["x", "y"])
    assert tis(run, "zip") == [(-1, "skipped")]
    assert tis(run, "zip_fill") == [(0, "queued"), (1, "queued")]
    assert tis(run, "concat") == [(0, "queued"), (1, "queued")]


def test_a_source_with_nothing_to_map_over_leaves_nothing_to_map_over():
    """One source without a value (its task failed, so nothing was pushed): Airflow's
    NotFullyPopulated, the -1 TI upstream_failed, whatever the others give."""
    run = combined_run(b=["x"])
    fail(one(run, "a"))
    for map_index in range(3):
        succeed(one(run, "first", map_index), returned=map_index)
    assert tis(run, "zip_mapped") == [(-1, "upstream_failed")]
    assert tis(run, "concat_mapped") == [(-1, "upstream_failed")]


def test_a_mapped_source_counts_the_values_its_map_indexes_pushed_once_all_are_done():
    run = combined_run(a=[1, 2, 3])
    succeed(one(run, "first", 0), returned=10)
    succeed(one(run, "first", 1), push=False)  # returned None: nothing pushed
    assert tis(run, "zip_mapped") == [(-1, "scheduled")]
    skip(one(run, "first", 2))
    # One value pushed: zip min(1, 3), concat 3 + 1.
    assert tis(run, "zip_mapped") == [(0, "queued")]
    assert tis(run, "concat_mapped") == [(i, "queued") for i in range(4)]


def test_the_sqlite_expansion_combines_the_sources_the_same_way():
    sync(COMBINED)
    run = runs.trigger_dag(dag_id="combined")
    now = timezone.now()
    TaskInstance.objects.filter(dag_run=run, task_id__in=["a", "b", "first"]).update(
        state="success"
    )
    for task_id, value, map_index in (("a", [1, 2, 3], -1), ("b", {"k": 1}, -1), ("first", 5, 1)):
        xcoms.push(
            dag_id="combined",
            run_id=run.run_id,
            task_id=task_id,
            key="return_value",
            value=value,
            map_index=map_index,
        )
    expanded = mapping.expand(
        dag_run_id=run.pk,
        task_ids=["zip", "zip_fill", "concat", "zip_mapped", "concat_mapped"],
        now=now,
    )
    assert {state for _, state in expanded} == {"queued"}
    assert {task_id: len(tis(run, task_id)) for task_id, _ in expanded} == {
        "zip": 1,
        "zip_fill": 3,
        "concat": 7,
        "zip_mapped": 1,
        "concat_mapped": 4,
    }


def test_a_group_over_a_zip_expands_all_its_tasks_to_the_zips_length():
    """A mapped group over `src.zip(other)`: its roots list both sources upstream; they expand
    (and spread to the group's other tasks) once both succeeded, to the shorter's length."""
    dag = group_dag({"x": {"zip": [{"xcom": "src"}, {"xcom": "other"}]}})
    dag["tasks"].insert(0, {"task_id": "other"})
    dag["tasks"][2]["upstream"] = ["other", "src"]
    sync(dag)
    run = runs.trigger_dag(dag_id="g")
    succeed(one(run, "src"), returned=list("abcde"), mapped_length=5)
    assert tis(run, "g.a") == [(-1, "scheduled")]
    succeed(one(run, "other"), returned=[1, 2, 3], mapped_length=3)
    assert states(run, "g.a") == ["queued"] * 3
    assert tis(run, "g.b") == [(i, "scheduled") for i in range(3)]


def test_a_group_root_must_list_every_source_of_its_zip_upstream():
    dag = group_dag({"x": {"zip": [{"xcom": "src"}, {"xcom": "other"}]}})
    dag["tasks"].insert(0, {"task_id": "other"})
    with pytest.raises(
        definitions.DefinitionError,
        match="which expands over the return value of 'other': list it in upstream",
    ):
        sync(dag)
