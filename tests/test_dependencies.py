"""Task dependencies against real PostgreSQL: definitions with upstream and trigger rules, the
initial TI states, every trigger rule (table-driven, Airflow's outcomes), propagation of
upstream_failed / skipped, the run's final state from its leaves, clears, and the sweep that
repairs a run a crash left waiting."""

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from assets_app.definitions import sync as definitions
from assets_app.models import (
    DagRun,
    DagRunState,
    Task,
    TaskInstance,
    TaskUpstream,
    TIState,
    TriggerRule,
)
from assets_app.scheduling import dependencies, runs
from assets_app.task_state import claims, finishing, repair, starting, success

pytestmark = pytest.mark.django_db


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


def states(run: DagRun) -> dict[str, str]:
    return dict(TaskInstance.objects.filter(dag_run=run).values_list("task_id", "state"))


def run_and_finish(ti: TaskInstance, state: str) -> None:
    """Start a queued TI and finish it through the worker-facing domain functions."""
    tries = {"ti_id": ti.id, "try_number": ti.try_number}
    starting.start(**tries, hostname="h", unixname="u", pid=1, start_date=timezone.now())
    if state == TIState.SUCCESS:
        success.succeed(**tries, end_date=timezone.now(), task_outlets=[], outlet_events=[])
    else:
        finishing.finish(**tries, state=state, end_date=timezone.now())


def ti(run: DagRun, task_id: str) -> TaskInstance:
    return TaskInstance.objects.get(dag_run=run, task_id=task_id)


ETL = {
    "dag_id": "etl",
    "tasks": [
        {"task_id": "extract"},
        {"task_id": "transform", "upstream": ["extract"]},
        {"task_id": "load", "upstream": ["transform"], "retry_delay_seconds": 30},
    ],
}


# --- definitions ------------------------------------------------------------------------------


def test_sync_stores_upstream_links_rules_and_retry_policy_and_a_second_sync_writes_nothing():
    dag = {
        "dag_id": "d",
        "tasks": [
            {"task_id": "a"},
            {"task_id": "b", "upstream": ["a"], "trigger_rule": "one_failed"},
            {
                "task_id": "c",
                "upstream": ["a", "b"],
                "retry_delay_seconds": 10,
                "retry_exponential_backoff": True,
                "max_retry_delay_seconds": 60,
            },
        ],
    }
    sync(dag)
    links = set(TaskUpstream.objects.values_list("upstream__task_id", "task__task_id"))
    assert links == {("a", "b"), ("a", "c"), ("b", "c")}
    c = Task.objects.get(task_id="c")
    assert (c.trigger_rule, c.retry_delay_seconds, c.retry_exponential_backoff) == (
        TriggerRule.ALL_SUCCESS,
        10.0,
        2.0,
    )
    assert c.max_retry_delay_seconds == 60.0
    assert Task.objects.get(task_id="b").trigger_rule == TriggerRule.ONE_FAILED

    with CaptureQueriesContext(connection) as queries:
        result = sync(dag)
    writes = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE"))
    ]
    assert writes == []
    assert not result.changed

    # Changing the links and the rule updates exactly them.
    dag["tasks"][2]["upstream"] = ["b"]
    dag["tasks"][1]["trigger_rule"] = "all_done"
    result = sync(dag)
    assert result.dags_updated == 1
    links = set(TaskUpstream.objects.values_list("upstream__task_id", "task__task_id"))
    assert links == {("a", "b"), ("b", "c")}
    assert Task.objects.get(task_id="b").trigger_rule == TriggerRule.ALL_DONE


# --- initial states ---------------------------------------------------------------------------


def test_a_new_run_queues_its_roots_and_the_rest_wait_unclaimable():
    sync(ETL)
    run = runs.trigger_dag(dag_id="etl")
    assert states(run) == {
        "extract": TIState.QUEUED,
        "transform": TIState.SCHEDULED,
        "load": TIState.SCHEDULED,
    }
    claimed = claims.claim_workloads(hostname="w", limit=10)
    assert [w.ti.task_id for w in claimed] == ["extract"]


def test_the_run_follows_extract_transform_load_to_success():
    sync(ETL)
    run = runs.trigger_dag(dag_id="etl")
    order = []
    for _ in range(3):
        claimed = claims.claim_workloads(hostname="w", limit=10)
        assert len(claimed) == 1
        order.append(claimed[0].ti.task_id)
        run_and_finish(claimed[0].ti, TIState.SUCCESS)
    assert order == ["extract", "transform", "load"]
    run.refresh_from_db()
    assert run.state == DagRunState.SUCCESS


def test_a_finish_costs_a_fixed_number_of_statements(django_assert_num_queries):
    """Evaluating the downstream is one statement; the run-finish check runs only when nothing
    was queued. Same count for 1 and 200 downstream tasks."""
    for width in (1, 200):
        dag_id = f"fan{width}"
        sync(
            {
                "dag_id": dag_id,
                "tasks": [
                    {"task_id": "root"},
                    *({"task_id": f"t{i}", "upstream": ["root"]} for i in range(width)),
                ],
            }
        )
        run = runs.trigger_dag(dag_id=dag_id)
        root = ti(run, "root")
        starting.start(
            ti_id=root.id,
            try_number=root.try_number,
            hostname="h",
            unixname="u",
            pid=1,
            start_date=timezone.now(),
        )
        # read, outbox insert, conditional update (and the test's savepoint pair); then the
        # evaluation, which queued every t: no run-finish statement
        with django_assert_num_queries(6):
            success.succeed(
                ti_id=root.id,
                try_number=root.try_number,
                end_date=timezone.now(),
                task_outlets=[],
                outlet_events=[],
            )
        assert set(states(run).values()) == {TIState.SUCCESS, TIState.QUEUED}


# --- every trigger rule -----------------------------------------------------------------------

S, F, K, U, X, R = (
    TIState.SUCCESS,
    TIState.FAILED,
    TIState.SKIPPED,
    TIState.UPSTREAM_FAILED,
    TIState.REMOVED,
    TIState.RUNNING,
)
WAITS = TIState.SCHEDULED
Q, SK, UF = TIState.QUEUED, TIState.SKIPPED, TIState.UPSTREAM_FAILED

# (rule, three upstream states, Airflow's outcome for the downstream TI), from
# airflow/ti_deps/deps/trigger_rule_dep.py (flag_upstream_failed, as the scheduler evaluates).
RULE_CASES = [
    ("all_success", (S, S, S), Q),
    ("all_success", (S, S, R), WAITS),
    ("all_success", (S, F, R), UF),
    ("all_success", (S, U, S), UF),
    ("all_success", (S, K, R), SK),
    ("all_success", (F, K, S), UF),
    ("all_success", (S, S, X), Q),
    ("all_failed", (F, F, F), Q),
    ("all_failed", (F, U, F), Q),
    ("all_failed", (F, F, X), Q),
    ("all_failed", (F, F, R), WAITS),
    ("all_failed", (F, S, R), SK),
    ("all_failed", (F, K, F), SK),
    ("all_done", (S, F, K), Q),
    ("all_done", (U, X, K), Q),
    ("all_done", (S, F, R), WAITS),
    ("all_skipped", (K, K, K), Q),
    ("all_skipped", (K, K, R), WAITS),
    ("all_skipped", (K, S, R), SK),
    ("all_skipped", (K, U, K), SK),
    ("one_success", (S, R, R), Q),
    ("one_success", (F, R, R), WAITS),
    ("one_success", (F, K, R), WAITS),
    ("one_success", (F, F, F), UF),
    ("one_success", (F, K, U), UF),
    ("one_success", (K, K, K), SK),
    ("one_failed", (F, R, R), Q),
    ("one_failed", (U, R, R), Q),
    ("one_failed", (S, R, R), WAITS),
    ("one_failed", (S, S, S), SK),
    ("one_failed", (S, K, S), SK),
    ("one_done", (S, R, R), Q),
    ("one_done", (F, R, R), Q),
    ("one_done", (U, R, R), WAITS),
    ("one_done", (K, K, R), WAITS),
    ("one_done", (K, U, K), SK),
    ("none_failed", (S, K, S), Q),
    ("none_failed", (K, K, K), Q),
    ("none_failed", (S, K, R), WAITS),
    ("none_failed", (S, F, R), UF),
    ("none_failed", (S, U, K), UF),
    ("none_failed_min_one_success", (S, K, K), Q),
    ("none_failed_min_one_success", (S, R, R), WAITS),
    ("none_failed_min_one_success", (K, K, R), WAITS),
    ("none_failed_min_one_success", (K, K, K), SK),
    ("none_failed_min_one_success", (K, F, R), UF),
    ("none_failed_min_one_success", (K, K, X), UF),
    ("none_skipped", (S, F, U), Q),
    ("none_skipped", (S, F, R), WAITS),
    ("none_skipped", (S, K, R), SK),
    ("always", (R, R, R), Q),
    ("always", (F, F, F), Q),
    # Without a setup upstream (issue 39; with setups: tests/test_setup_teardown.py), as all_done.
    ("all_done_setup_success", (S, F, U), Q),
    ("all_done_setup_success", (K, K, K), Q),
    ("all_done_setup_success", (S, F, R), WAITS),
]


def test_the_table_covers_every_rule():
    assert {rule for rule, _, _ in RULE_CASES} == set(TriggerRule.values)


@pytest.mark.parametrize("sweep", [False, True], ids=["after_finish", "sweep"])
def test_every_trigger_rule_decides_as_airflow(sweep):
    """One Dag per case: u0, u1, u2 >> d (with the rule); the upstream TIs are put in the
    case's states and d is evaluated, downstream of u0 (a finish) or by the sweep."""
    cases = {f"c{i}": case for i, case in enumerate(RULE_CASES)}
    sync(
        *(
            {
                "dag_id": dag_id,
                "tasks": [
                    {"task_id": "u0"},
                    {"task_id": "u1"},
                    {"task_id": "u2"},
                    {"task_id": "d", "upstream": ["u0", "u1", "u2"], "trigger_rule": rule},
                ],
            }
            for dag_id, (rule, _, _) in cases.items()
        )
    )
    run_of = {}
    for dag_id, (_, upstream, _) in cases.items():
        run = runs.trigger_dag(dag_id=dag_id)
        for i, state in enumerate(upstream):
            TaskInstance.objects.filter(dag_run=run, task_id=f"u{i}").update(state=state)
        run_of[dag_id] = run
    if sweep:
        repair.sweep_waiting_runs()
    else:
        for run in run_of.values():
            dependencies.evaluate(dag_run_id=run.pk, finished_task_ids=["u0"])
    outcome = {dag_id: ti(run, "d").state for dag_id, run in run_of.items()}
    expected = {dag_id: want for dag_id, (_, _, want) in cases.items()}
    wrong = {
        f"{cases[d][0]} {cases[d][1]}": (outcome[d], expected[d])
        for d in cases
        if outcome[d] != expected[d]
    }
    assert wrong == {}


def test_a_task_without_upstream_runs_whatever_its_rule():
    sync({"dag_id": "lone", "tasks": [{"task_id": "t", "trigger_rule": "all_failed"}]})
    run = runs.trigger_dag(dag_id="lone")
    assert states(run) == {"t": TIState.QUEUED}


# --- propagation and the run's state ----------------------------------------------------------


def test_a_failure_propagates_upstream_failed_down_the_chain_and_fails_the_run():
    sync(
        {
            "dag_id": "chain",
            "tasks": [
                {"task_id": "a"},
                {"task_id": "b", "upstream": ["a"]},
                {"task_id": "c", "upstream": ["b"]},
                {"task_id": "d", "upstream": ["c"]},
                {"task_id": "side"},
            ],
        }
    )
    run = runs.trigger_dag(dag_id="chain")
    run_and_finish(ti(run, "a"), TIState.FAILED)
    assert states(run) == {
        "a": F,
        "b": UF,
        "c": UF,
        "d": UF,
        "side": Q,
    }
    run.refresh_from_db()
    assert run.state == DagRunState.RUNNING  # `side` has not run yet
    run_and_finish(ti(run, "side"), TIState.SUCCESS)
    run.refresh_from_db()
    assert run.state == DagRunState.FAILED


def test_skips_propagate_and_a_run_of_skipped_leaves_succeeds():
    sync(
        {
            "dag_id": "skips",
            "tasks": [
                {"task_id": "a"},
                {"task_id": "b", "upstream": ["a"]},
                {"task_id": "c", "upstream": ["b"], "trigger_rule": "none_failed_min_one_success"},
                {"task_id": "d", "upstream": ["c"], "trigger_rule": "all_skipped"},
            ],
        }
    )
    run = runs.trigger_dag(dag_id="skips")
    run_and_finish(ti(run, "a"), TIState.SKIPPED)
    assert states(run) == {"a": K, "b": K, "c": K, "d": Q}
    run_and_finish(ti(run, "d"), TIState.SUCCESS)
    run.refresh_from_db()
    assert run.state == DagRunState.SUCCESS


def test_the_run_state_follows_its_leaves():
    """Airflow's rule: a failed task that is not a leaf does not fail the run when the leaf
    after it (all_done: a clean-up) succeeds."""
    sync(
        {
            "dag_id": "cleanup",
            "tasks": [
                {"task_id": "work"},
                {"task_id": "clean", "upstream": ["work"], "trigger_rule": "all_done"},
            ],
        }
    )
    run = runs.trigger_dag(dag_id="cleanup")
    run_and_finish(ti(run, "work"), TIState.FAILED)
    assert states(run)["clean"] == Q
    run_and_finish(ti(run, "clean"), TIState.SUCCESS)
    run.refresh_from_db()
    assert run.state == DagRunState.SUCCESS


# --- clears and the sweep ---------------------------------------------------------------------


def test_clearing_a_failed_task_requeues_it_and_its_upstream_failed_downstream_waits():
    sync(ETL)
    run = runs.trigger_dag(dag_id="etl")
    run_and_finish(ti(run, "extract"), TIState.SUCCESS)
    run_and_finish(ti(run, "transform"), TIState.FAILED)
    assert states(run)["load"] == UF
    runs.clear_task_instances(dag_run_id=run.pk, only_failed=True)
    # transform's upstream (extract) is done: it is queued again; load waits for it.
    assert states(run) == {"extract": S, "transform": Q, "load": WAITS}
    run_and_finish(ti(run, "transform"), TIState.SUCCESS)
    assert states(run)["load"] == Q


def test_clearing_a_task_whose_upstream_is_not_done_leaves_it_waiting():
    sync(ETL)
    run = runs.trigger_dag(dag_id="etl")
    run_and_finish(ti(run, "extract"), TIState.SUCCESS)
    run_and_finish(ti(run, "transform"), TIState.SUCCESS)
    run_and_finish(ti(run, "load"), TIState.SUCCESS)
    runs.clear_task_instances(dag_run_id=run.pk, ti_ids=[ti(run, "extract").id, ti(run, "load").id])
    assert states(run) == {"extract": Q, "transform": S, "load": Q}
    runs.clear_task_instances(dag_run_id=run.pk)
    assert states(run) == {"extract": Q, "transform": WAITS, "load": Q}


def test_the_sweep_queues_what_a_crash_between_commit_and_evaluation_left_waiting(monkeypatch):
    sync(ETL)
    run = runs.trigger_dag(dag_id="etl")
    # The process dies right after extract's commit: no evaluation ran.
    monkeypatch.setattr(success, "after_ti_finished", lambda ti: None)
    run_and_finish(ti(run, "extract"), TIState.SUCCESS)
    assert states(run)["transform"] == WAITS
    result = repair.sweep_waiting_runs()
    assert (result.runs_evaluated, result.tis_queued) == (1, 1)
    assert states(run)["transform"] == Q
    assert repair.sweep_waiting_runs().tis_queued == 0


def test_the_sweep_finishes_a_run_a_crash_left_with_every_ti_finished(monkeypatch):
    sync({"dag_id": "one", "tasks": [{"task_id": "t"}]})
    run = runs.trigger_dag(dag_id="one")
    monkeypatch.setattr(success, "after_ti_finished", lambda ti: None)
    run_and_finish(ti(run, "t"), TIState.SUCCESS)
    run.refresh_from_db()
    assert run.state == DagRunState.RUNNING
    assert repair.sweep_waiting_runs().runs_finished == 1
    run.refresh_from_db()
    assert run.state == DagRunState.SUCCESS


def test_the_unfinished_index_lists_every_unfinished_state():
    """`ti_unfinished` spells its states out; a new TI state must be added to it."""
    from assets_app.models.runs import TI_UNFINISHED_STATES

    index = next(i for i in TaskInstance._meta.indexes if i.name == "ti_unfinished")
    assert sorted(dict(index.condition.children)["state__in"]) == list(TI_UNFINISHED_STATES)
