import contextlib
import threading
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from assets_app.models import (
    Asset,
    AssetDagRunQueue,
    AssetEvent,
    Dag,
    DagRun,
    DagRunState,
    DagRunType,
)
from assets_app.operations import metrics
from assets_app.registration import outlets as registration
from assets_app.scheduling import asset_runs as scheduling
from assets_app.sql import scheduling as scheduling_sql
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


@contextlib.contextmanager
def held_by_another_scheduler(dag_id: str):
    """While in the block, another thread's transaction holds `dag_id` as a scheduler pass does."""
    from django.db import connections

    from assets_app.sql import locks

    held, release = threading.Event(), threading.Event()

    def other_scheduler():
        try:
            with transaction.atomic():
                assert locks.claim_dag_for_scheduling(dag_id) is not None
                held.set()
                release.wait(10)
        finally:
            connections.close_all()

    thread = threading.Thread(target=other_scheduler)
    thread.start()
    try:
        assert held.wait(10)
        yield
    finally:
        release.set()
        thread.join(10)


@pytest.mark.django_db(transaction=True)
def test_a_dag_held_by_another_scheduler_is_skipped_without_waiting_and_reported():
    scheduled_dag("d", "a")
    events = produce("a")
    with held_by_another_scheduler("d"):
        result = scheduling.schedule_dags()
        assert (result.run_ids, result.dags_locked) == ((), ("d",))
    assert scheduling.schedule_dags().dags_locked == ()
    assert runs_of("d") == [events]


@pytest.mark.django_db(transaction=True)
def test_a_nudged_pass_that_finds_its_dag_held_nudges_again_for_it():
    """The held Dag's new events would otherwise wait for the minute's sweep: the other pass may
    have read its queue before they committed."""
    from django_q.models import OrmQ

    from assets_app import tasks
    from assets_app.cluster import nudges

    def scheduler_nudges() -> list[dict]:
        return [row.kwargs() for row in OrmQ.objects.all() if row.func() == nudges.SCHEDULE_FUNC]

    scheduled_dag("d", "a")
    scheduled_dag("free", "b")
    events = produce("a")
    produce("b")
    OrmQ.objects.all().delete()
    with held_by_another_scheduler("d"):
        tasks.schedule(dag_ids=["d", "free"])
        assert runs_of("d") == []
        assert len(runs_of("free")) == 1
        assert scheduler_nudges() == [{"dag_ids": ["d"]}]
    tasks.schedule(dag_ids=["d"])
    assert runs_of("d") == [events]
    assert scheduler_nudges() == [{"dag_ids": ["d"]}]


def test_a_pass_schedules_a_batch_per_transaction_and_gives_each_run_its_own_dags_tasks(
    monkeypatch, django_assert_num_queries
):
    """Five Dags with different tasks, two Dags per batch: three batches of the statements the
    pin below counts (the last without a TI insert: its Dag has no tasks), plus the candidates
    and the heartbeat, and every run gets exactly its Dag's tasks (with their retries)."""
    monkeypatch.setattr(scheduling, "BATCH", 2)
    tasks = {"d0": [], "d1": [("x", 0)], "d2": [("a", 3), ("b", 0)], "d3": [("z", 1)], "d4": []}
    for dag_id, dag_tasks in tasks.items():
        dag = scheduled_dag(dag_id, "a")
        for task_id, retries in reversed(dag_tasks):
            TaskFactory(dag=dag, task_id=task_id, retries=retries)
    produce("a")
    with django_assert_num_queries(2 + 3 * (8 + 2) - 1):
        result = scheduling.schedule_dags()
    assert [dag_id for dag_id, _ in result.run_ids] == sorted(tasks)
    for dag_id, dag_tasks in tasks.items():
        run = DagRun.objects.get(dag_id=dag_id)
        assert list(
            run.task_instances.order_by("task_id").values_list("task_id", "max_tries", "state")
        ) == [(task_id, retries, "queued") for task_id, retries in dag_tasks]


@pytest.mark.parametrize("dags", [1, 3, 40])
def test_a_pass_costs_the_same_statements_for_1_3_or_40_dags_and_counts_its_runs_once(
    django_assert_num_queries, django_capture_on_commit_callbacks, dags
):
    """Per batch of up to `scheduling.BATCH` Dags, whatever their number: Dag locks, active-run
    counts, ADRQ locks, tasks, runs, event links, TIs, ADRQ delete (and here the test
    transaction's savepoint pair around the batch's own transaction). Per pass: the candidate
    query, the heartbeat, and one counter statement after commit for all its runs (not one per
    run: each would be a commit of its own)."""
    dag_ids = sorted(f"d{i}" for i in range(dags))
    for dag_id in dag_ids:
        TaskFactory(dag=scheduled_dag(dag_id, "a"), task_id="t")
    events = produce("a")
    before = metrics.value(metrics.RUNS_TRIGGERED)
    with (
        django_capture_on_commit_callbacks(execute=True) as callbacks,
        django_assert_num_queries(2 + 8 + 2),
    ):
        result = scheduling.schedule_dags()
    assert len(callbacks) == 1
    assert [dag_id for dag_id, _ in result.run_ids] == dag_ids
    assert [runs_of(dag_id) for dag_id in dag_ids] == [[events]] * dags
    assert metrics.value(metrics.RUNS_TRIGGERED) == before + dags


def test_one_batch_keeps_paused_full_unmet_and_poison_dags_rows_and_runs_the_others(
    monkeypatch,
):
    """In one batch: a paused Dag, one at max_active_runs, one whose condition is not met and
    one whose evaluation raises keep their rows and get no run; the two others get one run
    each, consuming exactly their events."""
    scheduled_dag("ok1", "a")
    scheduled_dag("ok2", {"any": ["a", "b"]})
    scheduled_dag("paused", "a", is_paused=True)
    DagRunFactory(dag=scheduled_dag("full", "a", max_active_runs=1), state=DagRunState.RUNNING)
    scheduled_dag("unmet", {"all": ["a", "never"]})
    scheduled_dag("poison", {"all": ["a", "b"]})
    real = scheduling.conditions.evaluate

    poison = scheduling.conditions.parse({"all": ["a", "b"]})

    def evaluate(condition, **kwargs):
        if condition == poison:
            raise ValueError("an evaluation bug")
        return real(condition, **kwargs)

    monkeypatch.setattr(scheduling.conditions, "evaluate", evaluate)
    events = produce("a")
    result = scheduling.schedule_dags()
    assert [dag_id for dag_id, _ in result.run_ids] == ["ok1", "ok2"]
    assert result.dags_failed == ("poison",)
    assert runs_of("ok1") == runs_of("ok2") == [events]
    for dag_id in ("paused", "full", "unmet", "poison"):
        assert (
            list(
                AssetDagRunQueue.objects.filter(target_dag_id=dag_id).values_list(
                    "asset_event_id", flat=True
                )
            )
            == events
        ), dag_id
        assert DagRun.objects.filter(dag_id=dag_id).count() == (dag_id == "full")


def test_a_batch_whose_writes_fail_is_scheduled_dag_by_dag_and_only_the_faulty_dag_fails(
    monkeypatch,
):
    """An error of the batch's writes cannot be pinned on one Dag: the batch rolls back and
    each Dag is scheduled in its own transaction, so only the Dag at fault is recorded and
    keeps its rows; the others get their run."""
    for dag_id in ("a1", "bad", "z9"):
        scheduled_dag(dag_id, "a")
    real = scheduling.runs.create_asset_triggered_runs

    def create(*, planned):
        if any(item.dag_id == "bad" for item in planned):
            raise ValueError("a bug writing this Dag's run")
        return real(planned=planned)

    monkeypatch.setattr(scheduling.runs, "create_asset_triggered_runs", create)
    events = produce("a")
    result = scheduling.schedule_dags()
    assert [dag_id for dag_id, _ in result.run_ids] == ["a1", "z9"]
    assert result.dags_failed == ("bad",)
    assert runs_of("a1") == runs_of("z9") == [events]
    assert runs_of("bad") == []
    assert AssetDagRunQueue.objects.filter(target_dag_id="bad").count() == 1
    bad = Dag.objects.get(dag_id="bad")
    assert "ValueError: a bug writing this Dag's run" in bad.schedule_error


def test_the_queue_rows_a_pass_locks_come_back_grouped_by_dag_and_asset():
    """`scheduling_sql.lock_queue_groups`: one group per (Dag, asset name), sorted by both, with the
    newest event's timestamp and exactly the ids of the rows it locked."""
    early, late = timezone.now() - timedelta(minutes=5), timezone.now()
    dags = [scheduled_dag(f"d{i}", schedule={"any": ["a", "b"]}) for i in (2, 1)]
    events = {
        (asset.name, when): AssetEvent.objects.create(asset=asset, timestamp=when)
        for asset in Asset.objects.filter(name__in=["a", "b"])
        for when in (early, late)
    }
    rows = {}
    for dag in dags:
        for (name, when), event in events.items():
            if dag.dag_id == "d1" and name == "b" and when == late:
                continue
            rows[(dag.dag_id, name, event.id)] = AssetDagRunQueue.objects.create(
                target_dag=dag, asset_event=event, asset=event.asset
            ).id
    with transaction.atomic():
        groups = scheduling_sql.lock_queue_groups(["d1", "d2", "elsewhere"])
    assert [(g.dag_id, g.asset_name) for g in groups] == [
        ("d1", "a"),
        ("d1", "b"),
        ("d2", "a"),
        ("d2", "b"),
    ]
    latest = {(g.dag_id, g.asset_name): g.latest for g in groups}
    assert latest == {("d1", "a"): late, ("d1", "b"): early, ("d2", "a"): late, ("d2", "b"): late}
    for g in groups:
        mine = (g.dag_id, g.asset_name)
        expected = {(eid, rid) for (d, n, eid), rid in rows.items() if (d, n) == mine}
        assert set(zip(g.event_ids, g.row_ids, strict=True)) == expected
