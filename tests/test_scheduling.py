import pytest

from assets_app import metrics, registration, scheduling
from assets_app.models import AssetDagRunQueue, AssetEvent, DagRun, DagRunState, DagRunType
from tests.asset_flow import alias_event, alias_outlet, asset_outlet, payload, scheduled_dag
from tests.factories import AssetFactory, DagRunFactory, TaskFactory

pytestmark = pytest.mark.django_db


def produce(*names: str) -> list[int]:
    """Register one event per named asset (creating the assets) and return the event ids."""
    assets = [AssetFactory(name=name, uri=name) for name in names]
    result = registration.register_payload(
        payload=payload(outlets=[asset_outlet(a) for a in assets])
    )
    return list(result.event_ids)


def produce_through_alias(alias: str, name: str) -> list[int]:
    result = registration.register_payload(
        payload=payload(
            outlets=[alias_outlet(alias)], outlet_events=[alias_event(alias, name, name)]
        )
    )
    return list(result.event_ids)


def runs_of(dag_id: str) -> list[list[int]]:
    """Consumed event ids of each run of the Dag, oldest run first."""
    return [
        sorted(run.consumed_events.values_list("id", flat=True))
        for run in DagRun.objects.filter(dag_id=dag_id).order_by("id")
    ]


def test_all_waits_for_every_asset_then_consumes_every_waiting_event():
    dag = scheduled_dag("d", {"all": ["a", "b"]})
    TaskFactory(dag=dag, task_id="t")
    first = produce("a")
    assert scheduling.schedule_dags().run_ids == ()
    assert AssetDagRunQueue.objects.count() == 1
    second = produce("a", "b")
    result = scheduling.schedule_dags()
    assert len(result.run_ids) == 1
    assert result.events_consumed == 3
    assert runs_of("d") == [sorted(first + second)]
    assert AssetDagRunQueue.objects.count() == 0
    run = DagRun.objects.get()
    assert (run.run_type, run.state) == (DagRunType.ASSET_TRIGGERED, DagRunState.QUEUED)
    newest = AssetEvent.objects.order_by("-timestamp").first()
    assert run.run_after == newest.timestamp
    assert list(run.task_instances.values_list("task_id", "state")) == [("t", "queued")]
    assert run.run_id.startswith("asset_triggered__")


def test_any_triggers_on_one_asset():
    scheduled_dag("d", {"any": ["a", "b"]})
    events = produce("b")
    scheduling.schedule_dags()
    assert runs_of("d") == [events]


def test_nested_condition():
    scheduled_dag("d", {"all": ["a", {"any": ["b", "c"]}]})
    a = produce("a")
    scheduling.schedule_dags()
    assert runs_of("d") == []
    c = produce("c")
    scheduling.schedule_dags()
    assert runs_of("d") == [sorted(a + c)]


def test_alias_condition_counts_linked_assets():
    scheduled_dag("on_alias", {"alias": "al"})
    scheduled_dag("mixed", {"all": [{"alias": "al"}, "b"]})
    via_alias = produce_through_alias("al", "x")
    scheduling.schedule_dags()
    assert runs_of("on_alias") == [via_alias]
    # "mixed" is scheduled on the alias too, so it got the event; it still waits for b.
    assert runs_of("mixed") == []
    b = produce("b")
    scheduling.schedule_dags()
    assert runs_of("mixed") == [sorted(via_alias + b)]


def test_paused_dag_keeps_its_events_and_unpausing_triggers_one_run():
    dag = scheduled_dag("d", "a", is_paused=True)
    events = produce("a") + produce("a")
    assert scheduling.schedule_dags().run_ids == ()
    assert AssetDagRunQueue.objects.filter(target_dag=dag).count() == 2
    dag.is_paused = False
    dag.save()
    scheduling.schedule_dags()
    assert runs_of("d") == [sorted(events)]


def test_max_active_runs_reached_then_freed():
    dag = scheduled_dag("d", "a", max_active_runs=1)
    active = DagRunFactory(dag=dag, state=DagRunState.RUNNING)
    events = produce("a")
    assert scheduling.schedule_dags().run_ids == ()
    assert scheduling.schedule_dag(dag_id="d") is None  # the re-check under the lock
    assert AssetDagRunQueue.objects.count() == 1
    active.state = DagRunState.SUCCESS
    active.save()
    scheduling.schedule_dags()
    assert runs_of("d")[1:] == [events]


def test_never_a_run_without_events_and_other_dags_untouched():
    scheduled_dag("d", "a")
    scheduled_dag("other", "z")
    assert scheduling.schedule_dag(dag_id="d") is None
    events = produce("a")
    result = scheduling.schedule_dags(dag_ids=["other"])
    assert (result.dags_checked, result.run_ids) == (0, ())
    scheduling.schedule_dags(dag_ids=["d"])
    assert runs_of("d") == [events]
    assert runs_of("other") == []
    assert scheduling.schedule_dags().run_ids == ()


def test_events_are_consumed_once_per_dag():
    scheduled_dag("d1", "a")
    scheduled_dag("d2", {"any": ["a", "b"]})
    events = produce("a")
    scheduling.schedule_dags()
    scheduling.schedule_dags()
    assert runs_of("d1") == [events]
    assert runs_of("d2") == [events]


@pytest.mark.django_db(transaction=True)
def test_a_dag_held_by_another_scheduler_is_skipped_without_waiting_and_reported():
    import threading

    from django.db import connections, transaction

    from assets_app import locks

    scheduled_dag("d", "a")
    events = produce("a")
    held, release = threading.Event(), threading.Event()

    def other_scheduler():
        try:
            with transaction.atomic():
                assert locks.claim_dag_for_scheduling("d") is not None
                held.set()
                release.wait(10)
        finally:
            connections.close_all()

    thread = threading.Thread(target=other_scheduler)
    thread.start()
    try:
        assert held.wait(10)
        result = scheduling.schedule_dags()
        assert (result.run_ids, result.dags_locked) == ((), ("d",))
    finally:
        release.set()
        thread.join(10)
    assert scheduling.schedule_dags().dags_locked == ()
    assert runs_of("d") == [events]


def test_a_pass_reads_tasks_ahead_in_batches_and_gives_each_run_its_own_dags_tasks(
    monkeypatch, django_assert_num_queries
):
    """Five Dags with different tasks, tasks read two candidates at a time: three task queries
    (plus the candidates and the heartbeat, and per Dag the statements of the pass pin above,
    less the TI insert for the two Dags without tasks), and every run gets exactly its Dag's
    tasks (with their retries)."""
    monkeypatch.setattr(scheduling, "TASKS_BATCH", 2)
    tasks = {"d0": [], "d1": [("x", 0)], "d2": [("a", 3), ("b", 0)], "d3": [("z", 1)], "d4": []}
    for dag_id, dag_tasks in tasks.items():
        dag = scheduled_dag(dag_id, "a")
        for task_id, retries in reversed(dag_tasks):
            TaskFactory(dag=dag, task_id=task_id, retries=retries)
    produce("a")
    with django_assert_num_queries(2 + 3 + 5 * (6 + 2) - 2):
        result = scheduling.schedule_dags()
    assert sorted(dag_id for dag_id, _ in result.run_ids) == sorted(tasks)
    for dag_id, dag_tasks in tasks.items():
        run = DagRun.objects.get(dag_id=dag_id)
        assert list(
            run.task_instances.order_by("task_id").values_list("task_id", "max_tries", "state")
        ) == [(task_id, retries, "queued") for task_id, retries in dag_tasks]


def test_a_pass_costs_six_statements_per_dag_and_counts_its_runs_once(
    django_assert_num_queries, django_capture_on_commit_callbacks
):
    """Per Dag: Dag lock, ADRQ lock with the active-run count, run, event links, TIs, ADRQ
    delete (and here the test transaction's savepoint pair around the Dag's own transaction).
    Per pass: the candidate query, the tasks of (up to TASKS_BATCH) candidates, the heartbeat,
    and one counter statement after commit for all its runs (not one per run: each would be a
    commit of its own)."""
    dag_ids = [f"d{i}" for i in range(3)]
    for dag_id in dag_ids:
        TaskFactory(dag=scheduled_dag(dag_id, "a"), task_id="t")
    events = produce("a")
    before = metrics.value(metrics.RUNS_TRIGGERED)
    with (
        django_capture_on_commit_callbacks(execute=True) as callbacks,
        django_assert_num_queries(3 + 3 * (6 + 2)),
    ):
        result = scheduling.schedule_dags()
    assert len(callbacks) == 1
    assert sorted(dag_id for dag_id, _ in result.run_ids) == dag_ids
    assert [runs_of(dag_id) for dag_id in dag_ids] == [[events]] * 3
    assert metrics.value(metrics.RUNS_TRIGGERED) == before + 3
