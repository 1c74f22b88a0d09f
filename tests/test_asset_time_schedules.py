"""Assets and time together (issue 24): a Dag with an asset `schedule` and a `timetable`.

`asset_or_time` is Airflow 3.3.2's AssetOrTimeSchedule: a scheduled run on every tick (run id
`scheduled__<run_after>`, a logical date) and an asset-triggered run whenever the condition is
met (`asset_triggered__<run_after>_<random>`, no logical date), as Airflow's scheduler creates
them. `asset_and_time` is the service's own: a tick runs only when the condition was met by the
events queued up to it, and that run consumes exactly them; an unmet tick creates nothing and
moves the Dag's next run on; the asset scheduler leaves such a Dag's events to its ticks."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from assets_app.definitions import sync as definitions
from assets_app.definitions.sync import DefinitionError
from assets_app.models import (
    Asset,
    AssetDagRunQueue,
    AssetEvent,
    Dag,
    DagRun,
    DagRunAssetEvent,
    DagRunState,
    ScheduleMode,
)
from assets_app.scheduling import asset_runs as scheduling
from assets_app.scheduling import time_runs as time_scheduling

pytestmark = pytest.mark.django_db

UTC = dt.UTC


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC)


def sync(**dag):
    document = {
        "dag_id": "both",
        "is_paused": False,  # a sync pauses a new Dag unless it says so (issue 39)
        "schedule": {"all": ["a", "b"]},
        "timetable": "@hourly",
        "start_date": "2099-01-01",
        "tasks": [{"task_id": "t"}],
    }
    document.update(dag)
    definitions.sync_definitions(dags=definitions.parse_document(document, file="both.json"))
    return Dag.objects.get(dag_id=document["dag_id"])


def queue_event(dag_id: str, asset_name: str, timestamp: dt.datetime) -> AssetEvent:
    """An event of `asset_name` at `timestamp` queued for `dag_id` (what the drain writes)."""
    asset = Asset.objects.get(name=asset_name)
    event = AssetEvent.objects.create(asset=asset, timestamp=timestamp, extra={})
    AssetDagRunQueue.objects.create(target_dag_id=dag_id, asset=asset, asset_event=event)
    return event


def consumed(run: DagRun) -> set[int]:
    return set(
        DagRunAssetEvent.objects.filter(dag_run=run).values_list("asset_event_id", flat=True)
    )


# --- the definition format ------------------------------------------------------------------


def test_a_schedule_and_a_timetable_sync_as_asset_or_time_by_default():
    dag = sync()
    assert dag.schedule_mode == ScheduleMode.ASSET_OR_TIME
    assert dag.schedule == {
        "all": [{"asset": {"name": "a", "uri": "a"}}, {"asset": {"name": "b", "uri": "b"}}]
    }
    assert dag.timetable["cron"] == "@hourly"
    assert dag.next_dagrun == at("2099-01-01T00:00:00")
    assert set(dag.schedule_asset_refs.values_list("asset__name", flat=True)) == {"a", "b"}


def test_asset_and_time_is_stored_and_a_change_of_mode_is_synced():
    assert sync(schedule_mode="asset_and_time").schedule_mode == ScheduleMode.ASSET_AND_TIME
    assert sync().schedule_mode == ScheduleMode.ASSET_OR_TIME


@pytest.mark.parametrize("missing", ["schedule", "timetable"])
def test_asset_and_time_without_both_halves_is_refused_naming_the_path(missing):
    document = {
        "dag_id": "half",
        "schedule": "a",
        "timetable": "@daily",
        "schedule_mode": "asset_and_time",
        missing: None,
    }
    with pytest.raises(DefinitionError) as caught:
        definitions.parse_document(document, file="half.json")
    assert "half.json" in str(caught.value) and "schedule_mode" in str(caught.value)
    assert "needs both a schedule and a timetable" in str(caught.value)


def test_an_unknown_schedule_mode_is_refused():
    with pytest.raises(DefinitionError) as caught:
        definitions.parse_document(
            {"dag_id": "x", "schedule": "a", "timetable": "@daily", "schedule_mode": "xor"},
            file="x.json",
        )
    assert "schedule_mode" in str(caught.value)


# --- asset or time (Airflow's AssetOrTimeSchedule) -------------------------------------------


def test_asset_or_time_runs_on_each_tick_and_on_the_condition_with_airflows_run_ids():
    sync(catchup=True, max_active_runs=10)
    e1 = queue_event("both", "a", at("2099-01-01T00:10:00"))
    e2 = queue_event("both", "b", at("2099-01-01T00:20:00"))
    timed = time_scheduling.create_due_runs(now=at("2099-01-01T01:30:00"))
    assert [run_id for _, run_id in timed.run_ids] == [
        "scheduled__2099-01-01T00:00:00+00:00",
        "scheduled__2099-01-01T01:00:00+00:00",
    ]
    # The ticks consume nothing: the events are the asset scheduler's.
    assert AssetDagRunQueue.objects.count() == 2
    assert not DagRunAssetEvent.objects.exists()
    triggered = scheduling.schedule_dags()
    ((_, run_id),) = triggered.run_ids
    assert re.fullmatch(r"asset_triggered__2099-01-01T00:20:00\+00:00_[a-z0-9]{8}", run_id)
    run = DagRun.objects.get(run_id=run_id)
    assert (run.run_type, run.logical_date, run.data_interval_start) == (
        "asset_triggered",
        None,
        None,
    )
    assert consumed(run) == {e1.id, e2.id}
    scheduled = DagRun.objects.filter(run_type="scheduled").order_by("logical_date")
    assert [r.logical_date for r in scheduled] == [
        at("2099-01-01T00:00:00"),
        at("2099-01-01T01:00:00"),
    ]
    assert all(r.triggered_by == "timetable" for r in scheduled)


def test_asset_or_time_counts_both_kinds_of_runs_against_max_active_runs():
    sync(catchup=True, max_active_runs=2)
    queue_event("both", "a", at("2099-01-01T00:10:00"))
    queue_event("both", "b", at("2099-01-01T00:20:00"))
    assert len(scheduling.schedule_dags().run_ids) == 1
    assert len(time_scheduling.create_due_runs(now=at("2099-01-01T05:30:00")).run_ids) == 1
    assert DagRun.objects.filter(state__in=[DagRunState.QUEUED, DagRunState.RUNNING]).count() == 2


# --- asset and time (the service's own) ------------------------------------------------------


def test_asset_and_time_a_tick_without_the_condition_creates_no_run_and_moves_on():
    sync(schedule_mode="asset_and_time")
    queue_event("both", "a", at("2099-01-01T00:10:00"))  # b never came
    result = time_scheduling.create_due_runs(now=at("2099-01-01T01:00:30"))
    assert result.run_ids == ()
    dag = Dag.objects.get(dag_id="both")
    assert dag.next_dagrun == dag.next_dagrun_create_after == at("2099-01-01T02:00:00")
    assert AssetDagRunQueue.objects.count() == 1  # the event waits for a later tick
    # The tick is done: another pass in the same hour does not look at it again.
    assert time_scheduling.create_due_runs(now=at("2099-01-01T01:59:00")).run_ids == ()


def test_asset_and_time_a_met_tick_runs_and_consumes_exactly_the_events_up_to_it():
    sync(schedule_mode="asset_and_time")
    e1 = queue_event("both", "a", at("2099-01-01T00:10:00"))
    e2 = queue_event("both", "b", at("2099-01-01T00:50:00"))
    late = queue_event("both", "a", at("2099-01-01T01:00:10"))  # after the tick
    result = time_scheduling.create_due_runs(now=at("2099-01-01T01:00:30"))
    assert [run_id for _, run_id in result.run_ids] == ["scheduled__2099-01-01T01:00:00+00:00"]
    run = DagRun.objects.get()
    assert (run.run_type, run.logical_date, run.triggered_by) == (
        "scheduled",
        at("2099-01-01T01:00:00"),
        "timetable",
    )
    assert consumed(run) == {e1.id, e2.id}
    assert list(AssetDagRunQueue.objects.values_list("asset_event_id", flat=True)) == [late.id]
    assert run.task_instances.count() == 1


def test_asset_and_time_events_are_never_consumed_by_the_asset_scheduler():
    sync(schedule_mode="asset_and_time")
    queue_event("both", "a", at("2099-01-01T00:10:00"))
    queue_event("both", "b", at("2099-01-01T00:20:00"))
    assert scheduling.candidate_dag_ids() == []
    assert scheduling.schedule_dags().run_ids == ()
    assert scheduling.schedule_dag(dag_id="both") is None  # even when named
    assert AssetDagRunQueue.objects.count() == 2 and not DagRun.objects.exists()


def test_asset_and_time_with_catchup_evaluates_each_missed_tick_in_order():
    sync(schedule_mode="asset_and_time", catchup=True, max_active_runs=10)
    a1 = queue_event("both", "a", at("2099-01-01T00:30:00"))  # tick 01:00: a only, unmet
    b1 = queue_event("both", "b", at("2099-01-01T01:30:00"))  # tick 02:00: a and b, met
    a2 = queue_event("both", "a", at("2099-01-01T02:10:00"))  # tick 03:00: a only, unmet
    b2 = queue_event("both", "b", at("2099-01-01T03:10:00"))  # tick 04:00: met
    result = time_scheduling.create_due_runs(now=at("2099-01-01T04:30:00"))
    assert [run_id for _, run_id in result.run_ids] == [
        "scheduled__2099-01-01T02:00:00+00:00",
        "scheduled__2099-01-01T04:00:00+00:00",
    ]
    first, second = DagRun.objects.order_by("logical_date")
    assert consumed(first) == {a1.id, b1.id}
    assert consumed(second) == {a2.id, b2.id}
    assert not AssetDagRunQueue.objects.exists()
    assert Dag.objects.get(dag_id="both").next_dagrun == at("2099-01-01T05:00:00")


def test_asset_and_time_without_catchup_looks_only_at_the_latest_tick():
    sync(schedule_mode="asset_and_time")
    a = queue_event("both", "a", at("2099-01-01T00:30:00"))
    b = queue_event("both", "b", at("2099-01-01T02:30:00"))
    result = time_scheduling.create_due_runs(now=at("2099-01-01T05:10:00"))
    assert [run_id for _, run_id in result.run_ids] == ["scheduled__2099-01-01T05:00:00+00:00"]
    assert consumed(DagRun.objects.get()) == {a.id, b.id}


def test_asset_and_time_a_tick_waits_while_the_dag_is_at_max_active_runs():
    sync(schedule_mode="asset_and_time", catchup=True, max_active_runs=1)
    queue_event("both", "a", at("2099-01-01T00:30:00"))
    queue_event("both", "b", at("2099-01-01T00:40:00"))
    queue_event("both", "a", at("2099-01-01T01:30:00"))
    queue_event("both", "b", at("2099-01-01T01:40:00"))
    result = time_scheduling.create_due_runs(now=at("2099-01-01T02:30:00"))
    assert [run_id for _, run_id in result.run_ids] == ["scheduled__2099-01-01T01:00:00+00:00"]
    dag = Dag.objects.get(dag_id="both")
    assert dag.next_dagrun == at("2099-01-01T02:00:00")  # waits, not skipped
    assert AssetDagRunQueue.objects.count() == 2
    DagRun.objects.update(state=DagRunState.SUCCESS)
    result = time_scheduling.create_due_runs(now=at("2099-01-01T02:30:00"))
    assert [run_id for _, run_id in result.run_ids] == ["scheduled__2099-01-01T02:00:00+00:00"]
    assert not AssetDagRunQueue.objects.exists()


def test_asset_and_time_with_an_alias_counts_the_assets_it_resolves_to():
    from assets_app.models import AssetAlias, AssetAliasAsset

    sync(schedule_mode="asset_and_time", schedule={"alias": "cleaned"})
    asset = Asset.objects.create(name="c", uri="c")
    AssetAliasAsset.objects.create(alias=AssetAlias.objects.get(name="cleaned"), asset=asset)
    event = queue_event("both", "c", at("2099-01-01T00:30:00"))
    result = time_scheduling.create_due_runs(now=at("2099-01-01T01:00:30"))
    assert len(result.run_ids) == 1
    assert consumed(DagRun.objects.get()) == {event.id}


@pytest.mark.django_db(transaction=True)
def test_asset_and_time_a_row_another_session_holds_is_skipped_not_waited_for():
    """The tick locks the Dag's queued events FOR UPDATE SKIP LOCKED after the Dag row (the
    global order): a row another session holds (a clear, another pass) is neither waited for
    nor consumed, and the tick consumes exactly the rows it locked."""
    from tests.test_invariant_guards import lock_timeout, other_connection

    sync(schedule_mode="asset_and_time", schedule={"any": ["a", "b"]})
    mine = queue_event("both", "a", at("2099-01-01T00:10:00"))
    held = queue_event("both", "b", at("2099-01-01T00:20:00"))
    with other_connection() as other:
        other.execute(
            "SELECT id FROM assets_app_assetdagrunqueue WHERE asset_event_id = %s FOR UPDATE",
            [held.id],
        )
        with lock_timeout():
            result = time_scheduling.create_due_runs(now=at("2099-01-01T01:00:30"))
    assert len(result.run_ids) == 1
    assert consumed(DagRun.objects.get()) == {mine.id}
    assert list(AssetDagRunQueue.objects.values_list("asset_event_id", flat=True)) == [held.id]


# --- the public API -------------------------------------------------------------------------


@pytest.fixture
def api():
    from django.contrib.auth import get_user_model
    from django.test import Client

    from assets_app.api.public_auth import create_api_token

    get_user_model().objects.create_user("ops", password="pw", is_staff=True, is_superuser=True)
    _, key = create_api_token(username="ops", name="test")
    return Client(headers={"Authorization": f"Bearer {key}"})


def test_the_public_api_gives_airflows_asset_or_time_fields(api):
    sync(timetable="0 3 * * *", timezone="Europe/Zurich", start_date="2099-01-01")
    body = api.get("/api/v2/dags/both").json()
    # What Airflow 3.3.2 answers for AssetOrTimeSchedule(CronTriggerTimetable("0 3 * * *")).
    assert body["timetable_summary"] == "Asset or 0 3 * * *"
    assert body["timetable_description"] == "Triggered by assets or At 03:00"
    assert body["timetable_periodic"] is True
    # 03:00 in Zurich on 2099-01-01 is 02:00 UTC: a tick, its logical date and interval.
    assert body["next_dagrun_logical_date"] == "2099-01-01T02:00:00Z"
    assert body["next_dagrun_data_interval_start"] == "2099-01-01T02:00:00Z"
    assert body["next_dagrun_data_interval_end"] == "2099-01-01T02:00:00Z"
    assert body["next_dagrun_run_after"] == "2099-01-01T02:00:00Z"
    details = api.get("/api/v2/dags/both/details").json()
    assert details["asset_expression"] is not None and details["timezone"] == "Europe/Zurich"


def test_the_public_api_names_asset_and_time(api):
    sync(schedule_mode="asset_and_time", timetable="@daily")
    body = api.get("/api/v2/dags/both").json()
    assert body["timetable_summary"] == "Asset and 0 0 * * *"
    assert body["timetable_description"] == "At 00:00, when triggered by assets"


def test_the_public_api_gives_a_cron_dags_description_as_airflow(api):
    sync(schedule=None, timetable="*/15 9-17 * * 1-5")
    body = api.get("/api/v2/dags/both").json()
    assert body["timetable_summary"] == "*/15 9-17 * * 1-5"
    assert body["timetable_description"] == (
        "Every 15 minutes, between 09:00 and 17:59, Monday through Friday"
    )


def test_the_dag_list_filters_by_airflows_timetable_type_and_orders_by_next_run(api):
    sync(dag_id="or_dag", timetable="0 3 * * *", start_date="2099-01-02")
    sync(dag_id="and_dag", schedule_mode="asset_and_time", start_date="2099-01-03")
    sync(dag_id="cron", schedule=None, timetable="@daily", start_date="2099-01-01")
    sync(dag_id="assets", timetable=None, start_date=None)
    sync(dag_id="manual", schedule=None, timetable=None, start_date=None)

    def listed(**params):
        return [d["dag_id"] for d in api.get("/api/v2/dags", params).json()["dags"]]

    assert listed(timetable_type="CronTriggerTimetable") == ["cron"]
    assert listed(timetable_type="AssetOrTimeSchedule") == ["or_dag"]
    assert listed(timetable_type="AssetAndTimeSchedule") == ["and_dag"]
    assert listed(timetable_type="AssetTriggeredTimetable") == ["assets"]
    assert listed(timetable_type="NullTimetable") == ["manual"]
    assert listed(
        order_by="next_dagrun",
        timetable_type=["CronTriggerTimetable", "AssetOrTimeSchedule", "AssetAndTimeSchedule"],
    ) == ["cron", "or_dag", "and_dag"]


@pytest.mark.parametrize("dags", [1, 30])
def test_asset_and_time_statements_per_batch_are_constant(dags, settings):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    settings.TIME_SCHEDULER_BATCH_SIZE = 100
    for i in range(dags):
        sync(dag_id=f"d{i}", schedule_mode="asset_and_time", catchup=True, max_active_runs=10)
        queue_event(f"d{i}", "a", at("2099-01-01T00:10:00"))
        queue_event(f"d{i}", "b", at("2099-01-01T01:10:00"))
    with CaptureQueriesContext(connection) as queries:
        result = time_scheduling.create_due_runs(now=at("2099-01-01T02:30:00"))
    # Ticks 00:00 (nothing), 01:00 (a only), 02:00 (a and b): one run per Dag.
    assert len(result.run_ids) == dags
    assert DagRunAssetEvent.objects.count() == 2 * dags
    # claim, active counts, dates held by runs, tasks, ADRQ lock, runs, links, TIs, ADRQ
    # delete, next-run update, savepoint/commit: the same for 1 Dag as for 30.
    assert len(queries) == 12, [q["sql"][:80] for q in queries]


def test_asset_and_time_a_schedule_that_cannot_evaluate_is_recorded_and_waits():
    dag = sync(schedule_mode="asset_and_time")
    queue_event("both", "a", at("2099-01-01T00:10:00"))
    Dag.objects.filter(pk=dag.pk).update(schedule={"all": "not a list"})
    assert time_scheduling.create_due_runs(now=at("2099-01-01T01:00:30")).run_ids == ()
    dag.refresh_from_db()
    assert dag.schedule_error.startswith("schedule cannot be evaluated")
    assert dag.next_dagrun == at("2099-01-01T00:00:00")  # unchanged: its ticks wait
    assert AssetDagRunQueue.objects.count() == 1
    # Evaluable again (a stored schedule repaired): the error clears and the tick is examined.
    Dag.objects.filter(pk=dag.pk).update(schedule={"any": [{"asset": {"name": "a", "uri": "a"}}]})
    assert len(time_scheduling.create_due_runs(now=at("2099-01-01T01:00:30")).run_ids) == 1
    dag.refresh_from_db()
    assert dag.schedule_error == ""
