"""The time scheduler (issue 24): definitions with a timetable sync their next run, a pass
creates exactly the due runs (catchup in order, under max_active_runs; without catchup at most
the latest), run ids and dates as Airflow's, a fixed number of statements per batch, and the
database refuses a second run of one logical date."""

from __future__ import annotations

import datetime as dt
import itertools

import pytest
from django.contrib.auth import get_user_model
from django.db import DataError, IntegrityError, connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from assets_app.api.public_auth import create_api_token
from assets_app.catalog import dags
from assets_app.definitions import next_runs, timetables
from assets_app.definitions import sync as definitions
from assets_app.guards import exceptions
from assets_app.models import Dag, DagRun, DagRunState, TaskInstance, TIState
from assets_app.scheduling import backfills, runs
from assets_app.scheduling import time_runs as time_scheduling
from tests.factories import DagRunFactory

pytestmark = pytest.mark.django_db

UTC = dt.UTC


def sync(**dag):
    document = {
        "dag_id": "timed",
        "is_paused": False,  # a sync pauses a new Dag unless it says so (issue 39)
        "tasks": [{"task_id": "a"}, {"task_id": "b", "upstream": ["a"]}],
    }
    document.update(dag)
    definitions.sync_definitions(dags=definitions.parse_document(document, file="t.json"))
    return Dag.objects.get(dag_id=document["dag_id"])


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.fixture
def clock(monkeypatch):
    """The service's wall clock as a sync and an unpause read it (`timezone.now`), set by the
    test; a pass gets its `now` passed."""

    class Clock:
        now = at("2026-01-01T00:00:00")

    monkeypatch.setattr(timezone, "now", lambda: Clock.now)
    return Clock


def scheduled(dag_id: str = "timed") -> list[tuple[str, dt.datetime, dt.datetime]]:
    return list(
        DagRun.objects.filter(dag_id=dag_id)
        .order_by("logical_date")
        .values_list("run_id", "logical_date", "run_after")
    )


def test_sync_stores_the_schedule_and_its_next_run():
    dag = sync(
        timetable="0 3 * * *",
        timezone="Europe/Zurich",
        start_date="2030-03-01T00:00:00",
        catchup=True,
    )
    assert dag.timetable == {
        "kind": "cron_trigger",
        "timezone": "Europe/Zurich",
        "cron": "0 3 * * *",
        "interval": 0.0,
        "run_immediately": False,
    }
    # 03:00 in Zurich (UTC+1 in March before the change) is 02:00 UTC.
    assert dag.start_date == at("2030-02-28T23:00:00")
    assert dag.next_dagrun == dag.next_dagrun_create_after == at("2030-03-01T02:00:00")
    assert dag.next_dagrun_data_interval_start == dag.next_dagrun_data_interval_end


def test_catchup_creates_every_missed_run_in_order_with_airflows_ids():
    sync(timetable="@daily", start_date="2026-01-01", catchup=True, max_active_runs=50)
    result = time_scheduling.create_due_runs(now=at("2026-01-05T12:00:00"))
    runs = list(DagRun.objects.order_by("logical_date"))
    assert [r.logical_date for r in runs] == [at(f"2026-01-0{d}T00:00:00") for d in (1, 2, 3, 4, 5)]
    assert runs[0].run_id == "scheduled__2026-01-01T00:00:00+00:00"
    assert {(r.run_type, r.triggered_by, r.state) for r in runs} == {
        ("scheduled", "timetable", DagRunState.QUEUED)
    }
    assert all(r.data_interval_start == r.data_interval_end == r.run_after for r in runs)
    assert len(result.run_ids) == 5
    # TIs as every run gets them: the root queued, the other waiting.
    states = sorted(TaskInstance.objects.filter(dag_run=runs[0]).values_list("task_id", "state"))
    assert states == [("a", TIState.QUEUED), ("b", TIState.SCHEDULED)]
    dag = Dag.objects.get(dag_id="timed")
    assert dag.next_dagrun_create_after == at("2026-01-06T00:00:00")
    # Nothing more is due: a second pass creates nothing.
    assert time_scheduling.create_due_runs(now=at("2026-01-05T12:00:00")).run_ids == ()


def test_catchup_respects_max_active_runs_and_resumes_when_runs_finish():
    sync(timetable="@hourly", start_date="2026-01-01", catchup=True, max_active_runs=2)
    now = at("2026-01-01T05:30:00")
    time_scheduling.create_due_runs(now=now)
    assert DagRun.objects.count() == 2
    DagRun.objects.update(state=DagRunState.SUCCESS)
    time_scheduling.create_due_runs(now=now)
    dates = list(DagRun.objects.order_by("logical_date").values_list("logical_date", flat=True))
    # No logical date skipped under max_active_runs (Airflow's max_active_runs=1 bug).
    assert dates == [at(f"2026-01-01T0{h}:00:00") for h in range(4)]


def test_data_interval_timetable_runs_at_the_end_of_each_interval():
    sync(
        timetable={"kind": "cron_data_interval", "cron": "@daily"},
        start_date="2026-01-01",
        catchup=True,
    )
    time_scheduling.create_due_runs(now=at("2026-01-03T00:00:00"))
    runs = list(DagRun.objects.order_by("logical_date"))
    assert [(r.logical_date, r.data_interval_end, r.run_after) for r in runs] == [
        (at("2026-01-01T00:00:00"), at("2026-01-02T00:00:00"), at("2026-01-02T00:00:00")),
        (at("2026-01-02T00:00:00"), at("2026-01-03T00:00:00"), at("2026-01-03T00:00:00")),
    ]
    # Airflow's run id carries run_after (the interval's end), not the logical date.
    assert runs[0].run_id == "scheduled__2026-01-02T00:00:00+00:00"


def test_unpause_without_catchup_creates_at_most_the_latest_due_run():
    # The sync computes the next run at the real time: the pass runs at it too.
    now = timezone.now()
    start = (now - dt.timedelta(days=3)).replace(tzinfo=None).isoformat()
    sync(timetable="@hourly", start_date=start, catchup=False, is_paused=True)
    assert time_scheduling.create_due_runs(now=now).run_ids == ()
    Dag.objects.filter(dag_id="timed").update(is_paused=False)
    # Paused since its start three days ago: only the latest due tick gets a run.
    time_scheduling.create_due_runs(now=now)
    latest = now.replace(minute=0, second=0, microsecond=0)
    assert list(DagRun.objects.values_list("logical_date", flat=True)) == [latest]
    time_scheduling.create_due_runs(now=now + dt.timedelta(seconds=1))
    assert DagRun.objects.count() == 1


def test_unpause_with_catchup_creates_exactly_the_missed_runs():
    sync(timetable="@hourly", start_date="2026-01-01", catchup=True, max_active_runs=100)
    time_scheduling.create_due_runs(now=at("2026-01-01T02:10:00"))
    assert DagRun.objects.count() == 3
    Dag.objects.filter(dag_id="timed").update(is_paused=True)
    assert time_scheduling.create_due_runs(now=at("2026-01-01T09:10:00")).run_ids == ()
    Dag.objects.filter(dag_id="timed").update(is_paused=False)
    time_scheduling.create_due_runs(now=at("2026-01-01T09:10:00"))
    dates = list(DagRun.objects.order_by("logical_date").values_list("logical_date", flat=True))
    assert dates == [at(f"2026-01-01T0{h}:00:00") for h in range(10)]


def test_a_logical_date_taken_by_a_manual_run_is_skipped_not_doubled():
    dag = sync(timetable="@daily", start_date="2026-01-01", catchup=True)
    DagRunFactory(dag=dag, run_id="manual_one", logical_date=at("2026-01-02T00:00:00"))
    time_scheduling.create_due_runs(now=at("2026-01-03T01:00:00"))
    pairs = sorted(DagRun.objects.values_list("logical_date", "run_type"))
    assert pairs == [
        (at("2026-01-01T00:00:00"), "scheduled"),
        (at("2026-01-02T00:00:00"), "manual"),
        (at("2026-01-03T00:00:00"), "scheduled"),
    ]


def test_the_database_refuses_a_second_run_of_one_logical_date():
    dag = sync(timetable="@daily", start_date="2026-01-01")
    DagRunFactory(dag=dag, run_id="one", logical_date=at("2026-01-02T00:00:00"))
    with pytest.raises(IntegrityError), transaction.atomic():
        DagRunFactory(dag=dag, run_id="two", logical_date=at("2026-01-02T00:00:00"))
    # Runs without a logical date (asset-triggered, manual) are not concerned.
    DagRunFactory(dag=dag, run_id="three", logical_date=None)
    DagRunFactory(dag=dag, run_id="four", logical_date=None)


def test_end_date_stops_the_schedule():
    sync(timetable="@daily", start_date="2026-01-01", end_date="2026-01-02", catchup=True)
    time_scheduling.create_due_runs(now=at("2026-01-09T00:00:00"))
    assert DagRun.objects.count() == 2
    dag = Dag.objects.get(dag_id="timed")
    assert dag.next_dagrun is None and dag.next_dagrun_create_after is None


@pytest.mark.parametrize("dags", [1, 40])
def test_statements_per_batch_are_constant(dags, settings):
    settings.TIME_SCHEDULER_BATCH_SIZE = 100
    documents = [
        {
            "dag_id": f"d{i}",
            "timetable": "* * * * *",
            "start_date": "2026-01-01",
            "catchup": True,
            "is_paused": False,
            "tasks": [{"task_id": "t"}],
        }
        for i in range(dags)
    ]
    definitions.sync_definitions(
        dags=[d for doc in documents for d in definitions.parse_document(doc, file="x")]
    )
    with CaptureQueriesContext(connection) as queries:
        result = time_scheduling.create_due_runs(now=at("2026-01-01T00:02:30"))
    assert len(result.run_ids) == 3 * dags
    # claim, active counts, dates held by runs, tasks, runs, TIs, next-run update, plus
    # the transaction's savepoint/commit statements: the same for 1 Dag as for 40.
    assert len(queries) == 9, [q["sql"][:80] for q in queries]


def test_a_manual_run_on_a_taken_logical_date_is_a_conflict_not_a_500():
    dag = sync(timetable="@daily", start_date="2026-01-01", catchup=True)
    time_scheduling.create_due_runs(now=at("2026-01-01T00:30:00"))
    with pytest.raises(exceptions.Conflict) as caught:
        runs.trigger_dag(dag_id=dag.dag_id, logical_date=at("2026-01-01T00:00:00"))
    assert caught.value.reason == "dag_run_exists"
    assert "logical_date 2026-01-01T00:00:00+00:00" in str(caught.value)
    assert DagRun.objects.count() == 1


def test_the_public_api_gives_airflows_schedule_fields():
    get_user_model().objects.create_user("ops", password="pw", is_staff=True, is_superuser=True)
    _, key = create_api_token(username="ops", name="test")
    api = Client(headers={"Authorization": f"Bearer {key}"})
    sync(timetable="@daily", timezone="Europe/Zurich", start_date="2099-01-01", catchup=True)
    body = api.get("/api/v2/dags/timed").json()
    assert body["timetable_summary"] == "0 0 * * *"
    assert body["timetable_periodic"] is True
    # Midnight in Zurich, 23:00 UTC the day before.
    assert body["next_dagrun_logical_date"] == "2098-12-31T23:00:00Z"
    assert body["next_dagrun_run_after"] == "2098-12-31T23:00:00Z"
    details = api.get("/api/v2/dags/timed/details").json()
    assert (details["catchup"], details["timezone"]) == (True, "Europe/Zurich")
    assert details["start_date"] == "2098-12-31T23:00:00Z"
    listed = api.get("/api/v2/dags").json()["dags"]
    assert listed[0]["next_dagrun_data_interval_start"] == "2098-12-31T23:00:00Z"


# --- issue 40: Airflow's stored next run ------------------------------------------------------


def test_events_timetable_without_catchup_runs_every_event_even_when_passes_land_late(clock):
    # Airflow creates the run its stored next run names, whatever instant the pass lands on
    # (was: the next run recomputed at the pass, so an event only counted when a pass landed
    # on its exact instant: 0 runs and the next run became none).
    clock.now = at("2026-01-01T00:00:00")
    events = ["2026-01-01T00:01:30", "2026-01-01T00:02:30", "2026-01-01T00:03:30"]
    sync(timetable={"kind": "events", "event_dates": events})
    for pass_at in ("00:01:30.400", "00:02:31", "00:03:32"):
        time_scheduling.create_due_runs(now=at(f"2026-01-01T{pass_at}"))
    dates = [at(e) for e in events]
    assert scheduled() == [(f"scheduled__{d.isoformat()}", d, d) for d in dates]
    dag = Dag.objects.get(dag_id="timed")
    assert dag.next_dagrun is None and dag.next_dagrun_create_after is None


def test_delta_timetable_without_catchup_does_not_drift(clock):
    # Airflow: the next run is the previous one plus the delta, not the pass's clock plus it
    # (was: 06:00:01 and 12:00:02 for passes one and two seconds late).
    clock.now = at("2026-01-01T00:00:00")
    sync(timetable={"kind": "delta_trigger", "delta": 6 * 3600}, start_date="2025-12-31")
    for pass_at in ("00:00:00", "06:00:01", "12:00:02"):
        time_scheduling.create_due_runs(now=at(f"2026-01-01T{pass_at}"))
    assert [run_after for _, _, run_after in scheduled()] == [
        at("2026-01-01T00:00:00"),
        at("2026-01-01T06:00:00"),
        at("2026-01-01T12:00:00"),
    ]
    assert Dag.objects.get(dag_id="timed").next_dagrun_create_after == at("2026-01-01T18:00:00")


def test_run_immediately_first_run_is_the_one_stored_at_sync_even_for_a_late_pass(clock):
    # No start date, run_immediately False: synced at 10:20 the first run is 11:00; a pass at
    # 11:00:20 creates it, as Airflow's scheduler creates its stored next run (was: recomputed
    # at the pass, past the tick is beyond the 10% rule: 12:00, no run).
    clock.now = at("2026-01-01T10:20:00")
    sync(timetable="@hourly")
    assert Dag.objects.get(dag_id="timed").next_dagrun_create_after == at("2026-01-01T11:00:00")
    time_scheduling.create_due_runs(now=at("2026-01-01T11:00:20"))
    assert [date for _, date, _ in scheduled()] == [at("2026-01-01T11:00:00")]
    assert Dag.objects.get(dag_id="timed").next_dagrun_create_after == at("2026-01-01T12:00:00")


def test_run_immediately_first_run_missed_past_a_parse_is_the_parses(clock):
    # The same Dag with no pass until 11:10: Airflow's Dag processor has parsed it since 11:00
    # (every 30 s), each parse storing the next run from no run at its clock: 12:00.
    clock.now = at("2026-01-01T10:20:00")
    sync(timetable="@hourly")
    time_scheduling.create_due_runs(now=at("2026-01-01T11:10:00"))
    assert scheduled() == []
    dag = Dag.objects.get(dag_id="timed")
    assert dag.next_dagrun_create_after == at("2026-01-01T12:00:00")
    assert dag.next_dagrun_computed_at == at("2026-01-01T11:09:30")


def test_unpause_stores_the_next_run_of_that_instant(clock):
    # Paused since 10:20 without catchup: the stored next run (10:00) is refreshed at the
    # unpause (15:30), as Airflow's Dag processor refreshes it while the Dag is paused; the
    # pass creates the latest tick only.
    clock.now = at("2026-01-01T10:20:00")
    sync(timetable="@hourly", start_date="2026-01-01", is_paused=True)
    assert Dag.objects.get(dag_id="timed").next_dagrun == at("2026-01-01T10:00:00")
    clock.now = at("2026-01-01T15:30:00")
    dags.set_paused(dag_id="timed", is_paused=False)
    assert Dag.objects.get(dag_id="timed").next_dagrun == at("2026-01-01T15:00:00")
    time_scheduling.create_due_runs(now=clock.now)
    assert [date for _, date, _ in scheduled()] == [at("2026-01-01T15:00:00")]


def test_the_stored_next_run_records_the_instant_it_was_computed_at(clock):
    clock.now = at("2026-01-01T10:20:00")
    sync(timetable="@hourly", start_date="2026-01-01", is_paused=True)
    assert Dag.objects.get(dag_id="timed").next_dagrun_computed_at == clock.now
    clock.now = at("2026-01-01T10:40:00")
    dags.set_paused(dag_id="timed", is_paused=False)
    assert Dag.objects.get(dag_id="timed").next_dagrun_computed_at == clock.now
    time_scheduling.create_due_runs(now=at("2026-01-01T11:00:01"))
    dag = Dag.objects.get(dag_id="timed")
    assert (dag.next_dagrun, dag.next_dagrun_computed_at) == (
        at("2026-01-01T12:00:00"),
        at("2026-01-01T11:00:01"),
    )


def test_a_dag_at_max_active_runs_keeps_its_stored_next_run(clock):
    clock.now = at("2026-01-01T00:00:00")
    sync(timetable="@hourly", start_date="2026-01-01", catchup=True, max_active_runs=1)
    time_scheduling.create_due_runs(now=at("2026-01-01T02:30:00"))
    assert [date for _, date, _ in scheduled()] == [at("2026-01-01T00:00:00")]
    dag = Dag.objects.get(dag_id="timed")
    assert dag.next_dagrun == at("2026-01-01T01:00:00")
    time_scheduling.create_due_runs(now=at("2026-01-01T03:30:00"))
    assert Dag.objects.get(dag_id="timed").next_dagrun == at("2026-01-01T01:00:00")


# --- issue 40: the Dag processor's parses (every 30 s in Airflow) ------------------------------
# A deployed Airflow parses every Dag file again every `min_file_process_interval` and each
# parse stores the next run again (`calculate_dagrun_date_fields` from the latest automated run,
# at its clock). A run due for longer than that is the one the last parse stored.


def finish_runs(dag_id: str = "timed") -> None:
    DagRun.objects.filter(dag_id=dag_id).update(state=DagRunState.SUCCESS)


def test_a_dag_blocked_past_parses_without_catchup_gets_the_latest_tick(clock):
    # At max_active_runs from 06:00 to 08:20: Airflow's parses have stored 08:00 by then (was:
    # the 06:00 stored at 05:30, created at 08:20).
    clock.now = at("2026-01-01T05:30:00")
    sync(timetable="@hourly", start_date="2026-01-01", max_active_runs=1)
    time_scheduling.create_due_runs(now=clock.now)
    time_scheduling.create_due_runs(now=at("2026-01-01T07:20:00"))
    # Still at its limit: the next run the parse stored is stored (Airflow's fields).
    dag = Dag.objects.get(dag_id="timed")
    assert dag.next_dagrun == at("2026-01-01T07:00:00")
    assert dag.next_dagrun_computed_at == at("2026-01-01T07:19:30")
    finish_runs()
    time_scheduling.create_due_runs(now=at("2026-01-01T08:20:00"))
    assert [date for _, date, _ in scheduled()] == [
        at("2026-01-01T05:00:00"),
        at("2026-01-01T08:00:00"),
    ]
    assert Dag.objects.get(dag_id="timed").next_dagrun == at("2026-01-01T09:00:00")


def test_a_run_due_for_less_than_the_parse_interval_is_created_as_stored(clock, settings):
    # The same Dag unblocked 29 s after its stored tick: no parse is taken to have come since.
    clock.now = at("2026-01-01T05:30:00")
    sync(timetable="*/10 * * * *", start_date="2026-01-01", max_active_runs=1)
    time_scheduling.create_due_runs(now=clock.now)
    finish_runs()
    time_scheduling.create_due_runs(now=at("2026-01-01T05:40:29"))
    assert scheduled()[-1][1] == at("2026-01-01T05:40:00")
    # With a parse interval of 10 minutes (the setting), 9 minutes late is still on time.
    settings.TIME_SCHEDULER_PARSE_INTERVAL_SECONDS = 600
    finish_runs()
    time_scheduling.create_due_runs(now=at("2026-01-01T05:59:00"))
    assert scheduled()[-1][1] == at("2026-01-01T05:50:00")


def test_a_delta_blocked_past_parses_runs_from_the_parse(clock):
    # Airflow's `max(now, last + delta)` at the parse 30 s before the pass; the next from it.
    clock.now = at("2026-01-01T00:00:00")
    sync(
        timetable={"kind": "delta_trigger", "delta": 3600},
        start_date="2025-12-31",
        max_active_runs=1,
    )
    time_scheduling.create_due_runs(now=clock.now)
    finish_runs()
    time_scheduling.create_due_runs(now=at("2026-01-01T03:00:00"))
    assert [run_after for _, _, run_after in scheduled()] == [
        at("2026-01-01T00:00:00"),
        at("2026-01-01T02:59:30"),
    ]
    assert Dag.objects.get(dag_id="timed").next_dagrun_create_after == at("2026-01-01T03:59:30")


def test_events_blocked_past_parses_skip_the_events_past_at_the_parse(clock):
    clock.now = at("2026-01-01T00:00:00")
    events = ["00:01:00", "00:02:00", "00:04:10", "00:05:00"]
    sync(
        timetable={"kind": "events", "event_dates": [f"2026-01-01T{e}" for e in events]},
        max_active_runs=1,
    )
    time_scheduling.create_due_runs(now=at("2026-01-01T00:01:00.500"))
    finish_runs()
    time_scheduling.create_due_runs(now=at("2026-01-01T00:04:30"))
    assert [date for _, date, _ in scheduled()] == [
        at("2026-01-01T00:01:00"),
        at("2026-01-01T00:04:10"),
    ]


def test_catchup_blocked_past_parses_goes_on_from_the_latest_automated_run(clock):
    # With catchup the parse stores the run after the latest automated run: the missed hours
    # go on in order; a backfill's later dates (seen by a parse) move it past them.
    clock.now = at("2026-01-03T12:00:00")
    sync(timetable="@hourly", start_date="2026-01-03", catchup=True, max_active_runs=1)
    sync(
        dag_id="daily",
        timetable="@daily",
        start_date="2026-01-01",
        catchup=True,
        max_active_runs=1,
    )
    time_scheduling.create_due_runs(now=clock.now)
    clock.now = at("2026-01-03T12:30:00")
    backfills.create_backfill(
        dag_id="daily", from_date=at("2026-01-03T00:00:00"), to_date=at("2026-01-03T00:00:00")
    )
    finish_runs()
    finish_runs("daily")
    time_scheduling.create_due_runs(now=at("2026-01-04T00:00:00"))
    assert [date for _, date, _ in scheduled()] == [
        at("2026-01-03T00:00:00"),
        at("2026-01-03T01:00:00"),
    ]
    daily = DagRun.objects.filter(dag_id="daily", run_type="scheduled").order_by("logical_date")
    assert list(daily.values_list("logical_date", flat=True)) == [
        at("2026-01-01T00:00:00"),
        at("2026-01-04T00:00:00"),
    ]


def test_a_backfill_created_after_the_parse_is_not_seen_by_it(clock):
    # Synced at 11:00 with catchup from 01-01 and no pass until 12:00:10 (its stored run long
    # due); backfilled over December at 12:00. The parse taken at 11:59:40 did not see the
    # backfill: the pass goes on from 01-01 (one seeing it stores 12-03, the day after the
    # backfill's latest date, as Airflow's next parse would).
    clock.now = at("2026-01-03T11:00:00")
    sync(timetable="@daily", start_date="2026-01-01", catchup=True, max_active_runs=2)
    clock.now = at("2026-01-03T12:00:00")
    backfills.create_backfill(
        dag_id="timed", from_date=at("2025-12-01T00:00:00"), to_date=at("2025-12-02T00:00:00")
    )
    time_scheduling.create_due_runs(now=at("2026-01-03T12:00:10"))
    assert list(
        DagRun.objects.filter(run_type="scheduled")
        .order_by("logical_date")
        .values_list("logical_date", flat=True)
    ) == [at("2026-01-01T00:00:00"), at("2026-01-02T00:00:00")]


def test_a_next_run_stored_after_the_parse_stands(clock):
    # Paused, backfilled over its first two days, unpaused a second later: the unpause stores
    # the next run after the backfill (Airflow's parse of the unpaused Dag sees it); the pass
    # right after keeps it, computed later than the parse it plays.
    clock.now = at("2026-01-03T12:00:00")
    sync(timetable="@daily", start_date="2026-01-01", catchup=True, is_paused=True)
    clock.now = at("2026-01-03T12:00:02")
    backfills.create_backfill(
        dag_id="timed", from_date=at("2026-01-01T00:00:00"), to_date=at("2026-01-02T00:00:00")
    )
    clock.now = at("2026-01-03T12:00:03")
    dags.set_paused(dag_id="timed", is_paused=False)
    dag = Dag.objects.get(dag_id="timed")
    assert dag.next_dagrun == at("2026-01-03T00:00:00")
    assert next_runs.reparse([dag], now=at("2026-01-03T12:00:04")) == []
    time_scheduling.create_due_runs(now=at("2026-01-03T12:00:04"))
    assert list(
        DagRun.objects.filter(run_type="scheduled").values_list("logical_date", flat=True)
    ) == [at("2026-01-03T00:00:00")]


@pytest.mark.parametrize("dags", [1, 40])
def test_statements_per_batch_with_parses_to_play_are_constant(dags, clock, settings):
    # The Dags' stored runs due since before the last parse: one statement more (their latest
    # automated runs), the same for 1 Dag as for 40.
    settings.TIME_SCHEDULER_BATCH_SIZE = 100
    clock.now = at("2026-01-01T00:00:00")
    documents = [
        {
            "dag_id": f"d{i}",
            "timetable": "* * * * *",
            "start_date": "2026-01-01",
            "catchup": True,
            "is_paused": False,
            "tasks": [{"task_id": "t"}],
        }
        for i in range(dags)
    ]
    definitions.sync_definitions(
        dags=[d for doc in documents for d in definitions.parse_document(doc, file="x")]
    )
    with CaptureQueriesContext(connection) as queries:
        result = time_scheduling.create_due_runs(now=at("2026-01-01T00:02:30"))
    assert len(result.run_ids) == 3 * dags
    assert len(queries) == 10, [q["sql"][:80] for q in queries]


# --- issue 40: six-field crons, as Airflow 3.3.2 reads them -----------------------------------
# Airflow hands the expression to croniter (7.0.0), which reads a sixth field as seconds, LAST:
# `*/30 * * * * *` is every second of minutes 0 and 30. The expected ticks below are the
# answers of Airflow's CronTriggerTimetable / CronDataIntervalTimetable with catchup from
# 2024-01-01 (and tests/compat/test_scheduler_differential.py compares runs with Airflow live).


def series(spec, count: int) -> list[tuple[dt.datetime | None, dt.datetime]]:
    timetable = timetables.Timetable.from_spec(spec)
    restriction = timetables.Restriction(
        earliest=at("2024-01-01T00:00:00"), latest=None, catchup=True
    )
    out, last = [], None
    for _ in range(count):
        last = timetable.next_run(last=last, restriction=restriction, now=at("2024-06-01T00:00:00"))
        out.append((last.data_interval_start, last.run_after))
    return out


@pytest.mark.parametrize(
    ("cron", "ticks"),
    [
        ("*/30 * * * * *", ["00:00:00", "00:00:01", "00:00:02", "00:00:03"]),
        ("0 0 * * * 30", ["00:00:30", "01-02T00:00:30", "01-03T00:00:30", "01-04T00:00:30"]),
        ("* * * * * 15", ["00:00:15", "00:01:15", "00:02:15", "00:03:15"]),
        ("0 12 * * * */20", ["12:00:00", "12:00:20", "12:00:40", "01-02T12:00:00"]),
    ],
)
def test_six_field_crons_tick_as_airflows(cron, ticks):
    expected = [at(f"2024-{t}" if "T" in t else f"2024-01-01T{t}") for t in ticks]
    assert series(cron, 4) == [(t, t) for t in expected]
    intervals = series({"kind": "cron_data_interval", "cron": cron}, 3)
    assert intervals == list(itertools.pairwise(expected))
    # Airflow describes no cron of more than 5 fields: its summary is the expression.
    timetable = timetables.Timetable.from_spec(cron)
    assert (timetable.description, timetable.summary) == ("", cron)


def test_a_six_field_cron_schedules_runs(clock):
    clock.now = at("2026-01-01T00:00:00")
    sync(timetable="*/30 * * * * *", start_date="2026-01-01", catchup=True, max_active_runs=10)
    time_scheduling.create_due_runs(now=at("2026-01-01T00:00:02.500"))
    assert [run_id for run_id, _, _ in scheduled()] == [
        f"scheduled__2026-01-01T00:00:0{s}+00:00" for s in range(3)
    ]


@pytest.mark.parametrize(
    ("cron", "named"),
    [
        ("0 0 * * * 61", "field 6 (second) '61'"),
        ("0 0 * * * x", "field 6 (second) 'x'"),
        ("0 25 * * * 0", "field 2 (hour) '25'"),
        ("* * * *", "must have 5 or 6 fields"),
        ("0 0 * * * 0 2030", "must have 5 or 6 fields"),
    ],
)
def test_a_cron_airflow_refuses_is_refused_naming_the_field(cron, named):
    with pytest.raises(definitions.DefinitionError) as caught:
        sync(timetable=cron)
    assert named in str(caught.value)


def test_a_cron_that_never_ticks_has_no_next_run_and_breaks_no_pass(clock):
    # Airflow accepts `0 0 31 2 *` (croniter parses it) and its scheduler logs the error and
    # stores no next run; here it raised out of croniter and failed the whole batch.
    with pytest.raises(timetables.TimetableError):
        timetables.Timetable.from_spec("0 0 31 2 *").next_run(
            last=None, restriction=timetables.Restriction(None, None, False), now=clock.now
        )
    never = sync(dag_id="never", timetable="0 0 31 2 *")
    assert never.next_dagrun is None and never.next_dagrun_create_after is None
    sync(timetable="@hourly", start_date="2026-01-01", catchup=True)
    Dag.objects.filter(dag_id="never").update(
        next_dagrun=clock.now,
        next_dagrun_data_interval_start=clock.now,
        next_dagrun_data_interval_end=clock.now,
        next_dagrun_create_after=clock.now,
    )
    # Within the parse interval of its stored run (a parse since would store none, as here
    # after the run).
    time_scheduling.create_due_runs(now=at("2026-01-01T00:00:20"))
    assert [date for _, date, _ in scheduled()] == [at("2026-01-01T00:00:00")]
    assert DagRun.objects.filter(dag_id="never").count() == 1  # its stored run, then none
    assert Dag.objects.get(dag_id="never").next_dagrun_create_after is None


def test_the_set_based_update_writes_every_stored_next_run_field():
    """`scheduling_sql.update_next_runs` (issue 41: the ORM's bulk_update was half of a pass over
    1,000 due Dags) names the same columns as `next_runs.FIELDS`."""
    from assets_app.definitions import next_runs
    from assets_app.sql import scheduling as scheduling_sql

    assert set(scheduling_sql.NEXT_RUN_COLUMNS) == set(next_runs.FIELDS)


def test_insert_rows_writes_every_field_as_bulk_create_would_and_refuses_a_nul_whole():
    """The time scheduler's INSERT from one JSON document (`scheduling_sql.insert_rows`): each
    value comes back as set (a JSON conf with nested text, aware datetimes, NULLs, a UUID
    primary key), ids are read back in the instances' order, and a value its column refuses
    (a NUL in text) raises with nothing written."""
    from assets_app.sql import scheduling as scheduling_sql

    dag = Dag.objects.create(dag_id="insert_rows")
    when = at("2026-03-04T05:06:07.123456+00:00")
    made = [
        DagRun(
            dag_id=dag.dag_id,
            run_id=f"scheduled__{i}",
            run_type="scheduled",
            state=DagRunState.QUEUED,
            run_after=when + dt.timedelta(minutes=i),
            logical_date=None if i == 1 else when + dt.timedelta(days=i),
            conf={"nested": ['é\n"q"', {"n": i}]},
        )
        for i in range(3)
    ]
    scheduling_sql.insert_rows(DagRun, made)
    assert [r.pk for r in made] == sorted(r.pk for r in made)
    for run in made:
        stored = DagRun.objects.get(pk=run.pk)
        assert (stored.run_id, stored.run_after, stored.logical_date, stored.conf) == (
            run.run_id,
            run.run_after,
            run.logical_date,
            run.conf,
        )
    tis = [
        TaskInstance(
            dag_run_id=made[0].pk,
            dag_id=dag.dag_id,
            run_id=made[0].run_id,
            task_id=f"t{i}",
            map_index=i - 1,
            try_number=1,
            max_tries=2,
            state=TIState.SCHEDULED,
            queued_at=when,
        )
        for i in range(2)
    ]
    scheduling_sql.insert_rows(TaskInstance, tis)
    assert {
        (str(ti.id), ti.task_id, ti.map_index, ti.max_tries, ti.queued_at)
        for ti in TaskInstance.objects.filter(dag_run_id=made[0].pk)
    } == {(str(ti.id), ti.task_id, ti.map_index, 2, when) for ti in tis}
    bad = DagRun(dag_id=dag.dag_id, run_id="nul\x00", run_type="manual", run_after=when)
    before = DagRun.objects.count()
    with pytest.raises(DataError, match="cannot be converted to text"), transaction.atomic():
        scheduling_sql.insert_rows(DagRun, [bad])
    assert DagRun.objects.count() == before
