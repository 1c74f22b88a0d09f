"""How many queued events one asset-triggered run consumes (issue 28): `batch` (every event
queued when the condition is met, the default), `per_event` (one run per event, in event
order, as many at once as `max_active_runs` allows) and `max_events: N` (runs of at most N
events, oldest first): the definition field, its checks, and the scheduler."""

import json

import pytest

from assets_app.definitions import sync as definitions
from assets_app.models import AssetDagRunQueue, Dag, DagRun, DagRunState
from assets_app.registration import outlets as registration
from assets_app.scheduling import asset_runs as scheduling
from tests.asset_flow import alias_event, alias_outlet, asset_outlet, payload, scheduled_dag
from tests.factories import AssetFactory, DagRunFactory, TaskFactory

pytestmark = pytest.mark.django_db


def produce(*names: str) -> list[int]:
    """One event per named asset, in one registration (creating the assets): their ids."""
    assets = [AssetFactory(name=name, uri=name) for name in names]
    result = registration.register_payload(
        payload=payload(outlets=[asset_outlet(a) for a in assets])
    )
    return list(result.event_ids)


def runs_of(dag_id: str) -> list[list[int]]:
    """Consumed event ids of each run of the Dag, oldest run first."""
    return [
        sorted(run.consumed_events.values_list("id", flat=True))
        for run in DagRun.objects.filter(dag_id=dag_id).order_by("id")
    ]


def finish_runs(dag_id: str) -> None:
    DagRun.objects.filter(dag_id=dag_id).update(state=DagRunState.SUCCESS)


def bounded_dag(dag_id: str, schedule, *, max_events: int, **fields) -> Dag:
    dag = scheduled_dag(dag_id, schedule, max_events_per_run=max_events, **fields)
    TaskFactory(dag=dag, task_id="t")
    return dag


# --- the definition field ------------------------------------------------------------------


def sync(tmp_path, document) -> definitions.SyncResult:
    path = tmp_path / "dags.json"
    path.write_text(json.dumps(document))
    return definitions.sync_dags(paths=[path])


def test_the_consumption_field_sets_how_many_events_a_run_consumes(tmp_path):
    sync(
        tmp_path,
        [
            {"dag_id": "default", "schedule": "a"},
            {"dag_id": "batch", "schedule": "a", "consumption": "batch"},
            {"dag_id": "one", "schedule": {"any": ["a", "b"]}, "consumption": "per_event"},
            {"dag_id": "fifty", "schedule": "a", "consumption": {"max_events": 50}},
        ],
    )
    assert dict(Dag.objects.values_list("dag_id", "max_events_per_run")) == {
        "default": None,
        "batch": None,
        "one": 1,
        "fifty": 50,
    }
    # A changed consumption is an update; the same file again writes nothing.
    result = sync(tmp_path, {"dag_id": "fifty", "schedule": "a", "consumption": "batch"})
    assert result.dags_updated == 1
    assert Dag.objects.get(dag_id="fifty").max_events_per_run is None
    again = sync(tmp_path, {"dag_id": "fifty", "schedule": "a", "consumption": "batch"})
    assert (again.dags_updated, again.dags_unchanged) == (0, 1)


@pytest.mark.parametrize(
    ("dag", "message"),
    [
        (
            {"schedule": {"all": ["a", "b"]}, "consumption": "per_event"},
            "consumption 'per_event' needs a schedule that one event meets alone",
        ),
        (
            {"schedule": {"any": ["a", {"all": ["b", "c"]}]}, "consumption": {"max_events": 5}},
            "consumption 'max_events' needs a schedule that one event meets alone",
        ),
        ({"consumption": "per_event"}, "consumption 'per_event' needs a schedule"),
        (
            {
                "schedule": "a",
                "timetable": "@daily",
                "schedule_mode": "asset_and_time",
                "consumption": "per_event",
            },
            "cannot be used with schedule_mode 'asset_and_time'",
        ),
        ({"schedule": "a", "consumption": {"max_events": 0}}, "must be at least 1, got 0"),
        ({"schedule": "a", "consumption": {"max_events": 10**7}}, "less than or equal to 1000000"),
        ({"schedule": "a", "consumption": "each"}, "consumption must be 'batch', 'per_event' or"),
        ({"schedule": "a", "consumption": 5}, "consumption must be"),
        ({"schedule": "a", "consumption": {"max_events": 2, "x": 1}}, "unknown key 'x'"),
    ],
    ids=[
        "all",
        "nested_all",
        "no_schedule",
        "asset_and_time",
        "zero",
        "huge",
        "word",
        "number",
        "key",
    ],
)
def test_a_consumption_that_cannot_work_is_refused_naming_it_and_nothing_is_written(
    tmp_path, dag, message
):
    sync(tmp_path, {"dag_id": "d", "schedule": "a"})
    with pytest.raises(definitions.DefinitionError) as refused:
        sync(tmp_path, {"dag_id": "d", **dag})
    assert refused.value.path == "consumption" or refused.value.path.startswith("consumption")
    assert message in refused.value.message
    assert Dag.objects.get(dag_id="d").max_events_per_run is None


def test_a_schedule_one_event_meets_alone():
    from assets_app.definitions import conditions

    def alone(raw) -> bool:
        return conditions.met_by_any_one_event(conditions.parse(raw))

    assert alone("a")
    assert alone({"alias": "x"})
    assert alone({"any": ["a", {"alias": "x"}, {"any": ["b"]}]})
    assert alone({"all": ["a"]})
    assert not alone({"all": ["a", "b"]})
    assert not alone({"any": ["a", {"all": ["b", {"alias": "x"}]}]})


# --- the scheduler -------------------------------------------------------------------------


def test_per_event_with_one_active_run_makes_one_run_per_event_in_event_order():
    bounded_dag("d", "a", max_events=1, max_active_runs=1)
    events = produce("a") + produce("a") + produce("a")
    for i in range(3):
        result = scheduling.schedule_dags()
        assert result.events_consumed == 1
        # The run is active: nothing more until it finishes.
        assert scheduling.schedule_dags().run_ids == ()
        assert AssetDagRunQueue.objects.filter(target_dag_id="d").count() == 2 - i
        finish_runs("d")
    assert runs_of("d") == [[e] for e in events]
    after = list(DagRun.objects.filter(dag_id="d").order_by("id").values_list("run_after"))
    assert after == sorted(after)


def test_per_event_fills_the_free_active_run_slots_in_one_pass():
    dag = bounded_dag("d", {"any": ["a", "b"]}, max_events=1, max_active_runs=4)
    DagRunFactory(dag=dag, state=DagRunState.RUNNING)  # one slot taken
    events = produce("a", "b") + produce("b") + produce("a", "a")
    result = scheduling.schedule_dags()
    assert result.events_consumed == 3 and len(result.run_ids) == 3
    assert runs_of("d")[1:] == [[e] for e in events[:3]]
    assert (
        sorted(
            AssetDagRunQueue.objects.filter(target_dag_id="d").values_list(
                "asset_event_id", flat=True
            )
        )
        == events[3:]
    )
    finish_runs("d")
    scheduling.schedule_dags()
    assert runs_of("d")[4:] == [[e] for e in events[3:]]
    assert not AssetDagRunQueue.objects.exists()


def test_max_events_makes_runs_of_at_most_n_events_oldest_first():
    bounded_dag("d", "a", max_events=2, max_active_runs=16)
    events = [e for _ in range(5) for e in produce("a")]
    result = scheduling.schedule_dags()
    assert (len(result.run_ids), result.events_consumed) == (3, 5)
    assert runs_of("d") == [events[0:2], events[2:4], events[4:5]]


def test_max_events_bounded_by_active_runs_leaves_the_newest_events_queued():
    bounded_dag("d", "a", max_events=3, max_active_runs=2)
    events = [e for _ in range(8) for e in produce("a")]
    scheduling.schedule_dags()
    assert runs_of("d") == [events[0:3], events[3:6]]
    assert sorted(AssetDagRunQueue.objects.values_list("asset_event_id", flat=True)) == events[6:]


def test_a_batch_dag_beside_a_per_event_dag_still_consumes_everything_in_one_run():
    bounded_dag("one", "a", max_events=1, max_active_runs=16)
    TaskFactory(dag=scheduled_dag("all", "a"), task_id="t")
    events = [e for _ in range(3) for e in produce("a")]
    scheduling.schedule_dags()
    assert runs_of("all") == [events]
    assert runs_of("one") == [[e] for e in events]


def test_per_event_through_an_alias_consumes_each_event_of_its_assets():
    bounded_dag("d", {"alias": "cleaned"}, max_events=1)
    first = registration.register_payload(
        payload=payload(
            outlets=[alias_outlet("cleaned")],
            outlet_events=[alias_event("cleaned", "x", "x"), alias_event("cleaned", "y", "y")],
        )
    ).event_ids
    scheduling.schedule_dags()
    assert runs_of("d") == [[e] for e in sorted(first)]


def test_an_event_of_an_asset_left_out_of_the_schedule_waits_and_blocks_no_other():
    dag = bounded_dag("d", {"any": ["a", "old"]}, max_events=1)
    stale = produce("old")
    # The schedule loses `old` (as a sync would leave its queued row waiting).
    dag.schedule = {"asset": {"name": "a", "uri": "a"}}
    dag.save(update_fields=["schedule"])
    fresh = produce("a") + produce("a")
    scheduling.schedule_dags()
    assert runs_of("d") == [[e] for e in fresh]
    assert list(AssetDagRunQueue.objects.values_list("asset_event_id", flat=True)) == stale


def test_a_bounded_pass_costs_two_statements_more_than_a_batch_pass_whatever_its_runs(
    django_assert_num_queries,
):
    """The batch's statements (see test_scheduling's count) plus the read of the consumed
    events' timestamps and the registration fences' try (invariant 16), for 1 run or 10."""
    for dag_id, runs in (("one", 1), ("ten", 10)):
        bounded_dag(dag_id, dag_id, max_events=1, max_active_runs=runs)
        for _ in range(runs):
            produce(dag_id)
        with django_assert_num_queries(2 + 8 + 2 + 1 + 1):
            result = scheduling.schedule_dags(dag_ids=[dag_id])
        assert len(result.run_ids) == runs


def test_schedule_dag_returns_the_first_of_the_runs_it_created():
    bounded_dag("d", "a", max_events=1, max_active_runs=3)
    events = produce("a") + produce("a")
    triggered = scheduling.schedule_dag(dag_id="d")
    assert triggered is not None and triggered.event_count == 1
    assert list(triggered.run.consumed_events.values_list("id", flat=True)) == events[:1]
    assert runs_of("d") == [[e] for e in events]
