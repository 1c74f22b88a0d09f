"""Setup and teardown tasks (issue 39) as Airflow 3.3.2 runs them, one test per rule of its
`TriggerRuleDep` and `DagRun.update_state`, through the sync of a JSON definition and the
service's dependency evaluation (`sql/dependencies`) on real PostgreSQL. The same Dags run on
stock Airflow in `tests/compat/differential_dags/setup_teardown.py`."""

import json

import pytest

from assets_app.definitions import setup_teardown as st
from assets_app.definitions import sync as definitions
from assets_app.models import DagRun, DagRunState, SetupLinkKind, Task, TaskSetupLink, TIState
from assets_app.models import TaskInstance as TI
from assets_app.scheduling import dependencies, runs

pytestmark = pytest.mark.django_db

S, F, K = TIState.SUCCESS, TIState.FAILED, TIState.SKIPPED
Q, W, UF = TIState.QUEUED, TIState.SCHEDULED, TIState.UPSTREAM_FAILED


def sync(dag: dict) -> None:
    text = json.dumps({"is_paused": False, **dag})
    definitions.sync_definitions(dags=definitions.parse_text(text, file="t.json"))


def setup(task_id: str, **more) -> dict:
    return {"task_id": task_id, "is_setup": True, **more}


def teardown(task_id: str, upstream: list[str], **more) -> dict:
    return {
        "task_id": task_id,
        "upstream": upstream,
        "is_teardown": True,
        "trigger_rule": "all_done_setup_success",
        **more,
    }


def finish(run: DagRun, task_id: str, state: str) -> None:
    """`task_id`'s TI of `run` finished in `state`, then what follows a finish."""
    TI.objects.filter(dag_run=run, task_id=task_id).update(state=state)
    dependencies.follow_finishes(dag_run_id=run.pk, dag_id=run.dag_id, finished_task_ids=[task_id])


def state(run: DagRun, task_id: str) -> str:
    return TI.objects.get(dag_run=run, task_id=task_id).state


@pytest.mark.parametrize(
    ("setup_state", "want"), [(F, UF), (K, K), (S, Q)], ids=["failed", "skipped", "success"]
)
def test_all_done_setup_success_runs_a_teardown_after_a_failure_unless_no_setup_succeeded(
    setup_state, want
):
    """`ALL_DONE_SETUP_SUCCESS`: every upstream done; all setups skipped: skipped; none
    succeeded: upstream_failed; else it runs, even after the work failed."""
    sync(
        {
            "dag_id": "d",
            "tasks": [
                setup("s"),
                {"task_id": "work", "upstream": ["s"], "trigger_rule": "all_done"},
                teardown("t", ["s", "work"]),
            ],
        }
    )
    run = runs.trigger_dag(dag_id="d")
    finish(run, "s", setup_state)
    assert state(run, "t") == W  # work is not done yet
    finish(run, "work", F)
    assert state(run, "t") == want


def test_an_indirect_setup_that_failed_fails_a_task_its_own_rule_would_run():
    """`_evaluate_setup_constraint`: w2's relevant setup s (its teardown t is downstream of
    w2) is not its direct upstream; s failed, so w2 is upstream_failed though its direct
    upstream w1 (all_done) succeeded."""
    sync(
        {
            "dag_id": "d",
            "tasks": [
                setup("s"),
                {"task_id": "w1", "upstream": ["s"], "trigger_rule": "all_done"},
                {"task_id": "w2", "upstream": ["w1"]},
                teardown("t", ["s", "w2"]),
            ],
        }
    )
    run = runs.trigger_dag(dag_id="d")
    finish(run, "s", F)
    assert state(run, "w1") == Q
    finish(run, "w1", S)
    assert state(run, "w2") == UF


def test_a_task_waits_for_its_indirect_setup_and_runs_once_it_succeeds():
    """The setup constraint holds back a TI whose direct rule is met (w1 ran on x alone,
    one_success) until its indirect setup s succeeded; s's finish wakes it though s is not its
    direct upstream (the `setup` link)."""
    sync(
        {
            "dag_id": "d",
            "tasks": [
                setup("s"),
                {"task_id": "x"},
                {"task_id": "w1", "upstream": ["s", "x"], "trigger_rule": "one_success"},
                {"task_id": "w2", "upstream": ["w1"]},
                teardown("t", ["s", "w2"]),
            ],
        }
    )
    assert set(
        TaskSetupLink.objects.filter(task__task_id="w2").values_list("other__task_id", "kind")
    ) == {("s", SetupLinkKind.SETUP)}
    run = runs.trigger_dag(dag_id="d")
    TI.objects.filter(dag_run=run, task_id="s").update(state=TIState.RUNNING)
    finish(run, "x", S)
    finish(run, "w1", S)
    assert state(run, "w2") == W
    finish(run, "s", S)
    assert state(run, "w2") == Q


def test_a_teardown_waits_for_the_tasks_between_its_setup_and_itself():
    """`_evaluate_teardown_scope`: t's direct upstream (s, b) are done but a, between s and t,
    is not: t waits, and a's finish (not t's direct upstream) queues it."""
    sync(
        {
            "dag_id": "d",
            "tasks": [
                setup("s"),
                {"task_id": "a", "upstream": ["s"]},
                {"task_id": "c"},
                {"task_id": "b", "upstream": ["a", "c"], "trigger_rule": "one_success"},
                teardown("t", ["s", "b"]),
            ],
        }
    )
    run = runs.trigger_dag(dag_id="d")
    finish(run, "s", S)
    finish(run, "c", S)
    finish(run, "b", S)
    assert state(run, "a") == Q
    assert state(run, "t") == W
    finish(run, "a", S)
    assert state(run, "t") == Q


@pytest.mark.parametrize(
    ("work", "teardown_state", "fail_dagrun", "want"),
    [
        (F, S, False, DagRunState.FAILED),
        (S, F, False, DagRunState.SUCCESS),
        (S, F, True, DagRunState.FAILED),
    ],
    ids=["work_failed", "teardown_failed_ignored", "on_failure_fail_dagrun"],
)
def test_the_run_state_ignores_a_teardown_unless_on_failure_fail_dagrun(
    work, teardown_state, fail_dagrun, want
):
    """`DagRun._tis_for_dagrun_state`: the work before an ignorable teardown is the leaf."""
    sync(
        {
            "dag_id": "d",
            "tasks": [
                setup("s"),
                {"task_id": "work", "upstream": ["s"]},
                teardown("t", ["s", "work"], on_failure_fail_dagrun=fail_dagrun),
            ],
        }
    )
    assert dict(Task.objects.values_list("task_id", "run_state_leaf")) == {
        "s": False,
        "work": not fail_dagrun,
        "t": fail_dagrun,
    }
    run = runs.trigger_dag(dag_id="d")
    finish(run, "s", S)
    finish(run, "work", work)
    finish(run, "t", teardown_state)
    run.refresh_from_db()
    assert run.state == want


def test_on_failure_fail_dagrun_only_on_a_teardown_and_no_mapped_setup():
    with pytest.raises(definitions.DefinitionError, match="not a teardown task"):
        sync({"dag_id": "d", "tasks": [{"task_id": "a", "on_failure_fail_dagrun": True}]})
    with pytest.raises(definitions.DefinitionError, match=r"attribute 'is_setup'.*mapped"):
        sync({"dag_id": "d", "tasks": [setup("a", expand={"x": [1, 2]})]})


def test_clearing_a_task_clears_its_setup_and_teardown_with_it():
    """Airflow's clear of chosen tasks (`partial_subset`, without upstream or downstream):
    the work's relevant setup and that setup's teardown come along; a setup brings its
    teardowns; an unrelated task stays."""
    sync(
        {
            "dag_id": "d",
            "tasks": [
                setup("s"),
                {"task_id": "work", "upstream": ["s"]},
                {"task_id": "other"},
                teardown("t", ["s", "work"]),
            ],
        }
    )
    run = runs.trigger_dag(dag_id="d")
    TI.objects.filter(dag_run=run).update(state=S, try_number=1)
    work = TI.objects.get(dag_run=run, task_id="work")
    result = runs.clear_task_instances(dag_run_id=run.pk, ti_ids=[work.id])
    assert result.cleared == ("s", "t", "work")
    assert state(run, "other") == S
    nodes = [
        st.Node("s", (), is_setup=True),
        st.Node("w", ("s",)),
        st.Node("t", ("s", "w"), is_teardown=True),
        st.Node("x", ()),
    ]
    assert st.cleared_with(nodes, {"s"}) == {"t"}
    assert st.cleared_with(nodes, {"t"}) == set()
    assert st.cleared_with(nodes, {"x"}) == set()


def test_a_second_sync_writes_nothing_and_a_changed_dag_drops_its_stale_links():
    dag = {
        "dag_id": "d",
        "tasks": [
            setup("s"),
            {"task_id": "w1", "upstream": ["s"]},
            {"task_id": "w2", "upstream": ["w1"]},
            teardown("t", ["s", "w2"]),
        ],
    }
    sync(dag)
    links = set(TaskSetupLink.objects.values_list("task__task_id", "other__task_id", "kind"))
    assert links == {("w2", "s", "setup"), ("t", "w1", "scope")}
    again = definitions.sync_definitions(
        dags=definitions.parse_text(json.dumps({"is_paused": False, **dag}), file="t.json")
    )
    assert not again.changed
    sync({**dag, "tasks": [{**task, "is_setup": False} for task in dag["tasks"][:3]]})
    assert not TaskSetupLink.objects.exists()
    assert dict(Task.objects.values_list("task_id", "run_state_leaf")) == {
        "s": False,
        "w1": False,
        "w2": True,
    }
