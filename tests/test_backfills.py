"""Backfills (issue 24): a backfill plans Airflow's dates for the range, starts at most
max_active_runs runs of type `backfill` with Airflow's run ids, starts the next as earlier ones
finish, resumes after a crash, reprocesses as asked, and is paused, unpaused and cancelled from
the command line and Airflow's `/api/v2/backfills` routes, audited."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from assets_app.api.public_auth import create_api_token
from assets_app.definitions import sync as definitions
from assets_app.definitions import timetables
from assets_app.guards import exceptions
from assets_app.models import (
    AuditEntry,
    Backfill,
    BackfillDagRun,
    Dag,
    DagRun,
    DagRunState,
    TaskInstance,
    TIState,
)
from assets_app.scheduling import backfills, runs
from tests.factories import DagRunFactory

pytestmark = pytest.mark.django_db

UTC = dt.UTC


def sync(**dag):
    document = {
        "dag_id": "filled",
        "is_paused": False,  # a sync pauses a new Dag unless it says so (issue 39)
        "timetable": "@daily",
        "start_date": "2026-01-01",
        "tasks": [{"task_id": "a"}, {"task_id": "b", "upstream": ["a"]}],
    }
    document.update(dag)
    definitions.sync_definitions(dags=definitions.parse_document(document, file="t.json"))
    return Dag.objects.get(dag_id=document["dag_id"])


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC)


def day(n: int) -> dt.datetime:
    return at(f"2026-01-{n:02d}T00:00:00")


def dates(**filters) -> list[dt.datetime]:
    return list(
        DagRun.objects.filter(run_type="backfill", **filters)
        .order_by("logical_date")
        .values_list("logical_date", flat=True)
    )


def finish(state=DagRunState.SUCCESS) -> None:
    DagRun.objects.filter(run_type="backfill", state=DagRunState.QUEUED).update(state=state)


def test_a_backfill_starts_max_active_runs_then_the_next_as_they_finish_and_completes():
    sync()
    backfill = backfills.create_backfill(
        dag_id="filled", from_date=day(1), to_date=day(5), max_active_runs=2
    )
    assert backfill.completed_at is None
    assert dates() == [day(1), day(2)]
    run = DagRun.objects.get(logical_date=day(1))
    assert (run.run_id, run.run_type, run.triggered_by, run.state) == (
        "backfill__2026-01-01T00:00:00+00:00",
        "backfill",
        "backfill",
        DagRunState.QUEUED,
    )
    assert run.data_interval_start == run.data_interval_end == run.run_after == day(1)
    states = sorted(TaskInstance.objects.filter(dag_run=run).values_list("task_id", "state"))
    assert states == [("a", TIState.QUEUED), ("b", TIState.SCHEDULED)]
    # Nothing finished: a pass starts nothing (the limit is the backfill's).
    assert backfills.start_runs().run_ids == ()
    DagRun.objects.filter(logical_date=day(1)).update(state=DagRunState.SUCCESS)
    assert [d for _, d in backfills.start_runs().run_ids] == ["backfill__2026-01-03T00:00:00+00:00"]
    finish()
    backfills.start_runs()
    assert dates() == [day(n) for n in range(1, 6)]
    finish(DagRunState.FAILED)
    result = backfills.start_runs()
    assert result.completed == (backfill.pk,)
    assert Backfill.objects.get().completed_at is not None
    assert BackfillDagRun.objects.filter(started_at__isnull=True).count() == 0


def test_run_backwards_starts_from_the_latest_date():
    sync()
    backfills.create_backfill(
        dag_id="filled", from_date=day(1), to_date=day(4), max_active_runs=1, run_backwards=True
    )
    assert dates() == [day(4)]
    finish()
    backfills.start_runs()
    assert dates() == [day(3), day(4)]


def test_dates_follow_the_timetable_in_its_zone_and_only_past_intervals():
    sync(timetable={"kind": "cron_data_interval", "cron": "0 3 * * *"}, timezone="Europe/Zurich")
    planned = backfills.plan_backfill(
        dag_id="filled",
        from_date=at("2026-03-28T00:00:00"),
        to_date=at("2026-03-30T12:00:00"),
        now=at("2026-03-30T12:00:00"),
    )
    # 03:00 Zurich: 02:00 UTC before the change of 29 March, 01:00 UTC after; the interval
    # starting on the 30th has not ended at "now", so it is not planned.
    assert [p.logical_date for p in planned] == [
        at("2026-03-28T02:00:00"),
        at("2026-03-29T01:00:00"),
    ]
    assert [p.info.data_interval_end for p in planned] == [
        at("2026-03-29T01:00:00"),
        at("2026-03-30T01:00:00"),
    ]


@pytest.mark.parametrize(
    ("behavior", "cleared"),
    [("none", []), ("failed", ["failed"]), ("completed", ["failed", "success"])],
)
def test_reprocess_behavior_decides_which_existing_runs_run_again(behavior, cleared):
    dag = sync()
    existing = {}
    for n, state in ((1, DagRunState.SUCCESS), (2, DagRunState.FAILED), (3, DagRunState.RUNNING)):
        run = DagRunFactory(dag=dag, run_id=f"scheduled__{n}", logical_date=day(n), state=state)
        TaskInstance.objects.create(
            dag_run=run,
            dag_id="filled",
            run_id=run.run_id,
            task_id="a",
            state=state if state != DagRunState.RUNNING else TIState.RUNNING,
        )
        existing[state] = run
    backfill = backfills.create_backfill(
        dag_id="filled", from_date=day(1), to_date=day(4), reprocess_behavior=behavior
    )
    reasons = dict(
        BackfillDagRun.objects.filter(backfill=backfill).values_list(
            "logical_date", "exception_reason"
        )
    )
    assert reasons[day(3)] == "in flight"
    assert reasons[day(4)] is None
    rerun = sorted(
        state for state, run in existing.items() if DagRun.objects.get(pk=run.pk).state == "queued"
    )
    assert rerun == cleared
    for state in cleared:
        run = DagRun.objects.get(pk=existing[state].pk)
        assert run.run_type == "backfill"
        assert TaskInstance.objects.get(dag_run=run).try_number == 2
    # Never a second run of a date: one run per logical date.
    assert DagRun.objects.filter(logical_date=day(1)).count() == 1
    assert DagRun.objects.get(logical_date=day(4)).run_type == "backfill"


def test_a_crash_in_a_pass_rolls_back_and_the_next_pass_resumes_exactly(monkeypatch):
    sync()
    backfill = backfills.create_backfill(
        dag_id="filled", from_date=day(1), to_date=day(6), max_active_runs=2
    )
    finish()
    real = runs.create_scheduled_runs

    def crash(**kwargs):
        real(**kwargs)
        raise RuntimeError("killed before commit")

    monkeypatch.setattr(runs, "create_scheduled_runs", crash)
    with pytest.raises(RuntimeError):
        backfills.start_runs()
    assert dates() == [day(1), day(2)]
    assert BackfillDagRun.objects.filter(backfill=backfill, started_at__isnull=True).count() == 4
    monkeypatch.setattr(runs, "create_scheduled_runs", real)
    backfills.start_runs()
    assert dates() == [day(n) for n in range(1, 5)]


@pytest.mark.django_db(transaction=True)
def test_concurrent_passes_start_each_date_once_and_never_beyond_the_limit():
    sync()
    backfill = backfills.create_backfill(
        dag_id="filled", from_date=day(1), to_date=day(30), max_active_runs=3
    )
    errors, most = [], []

    def passes():
        try:
            for _ in range(200):
                backfills.start_runs()
                active = DagRun.objects.filter(run_type="backfill", state=DagRunState.QUEUED)
                most.append(active.count())
                # Finish what is active, as workers would, between passes.
                active.update(state=DagRunState.SUCCESS)
                if Backfill.objects.filter(completed_at__isnull=False).exists():
                    return
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=passes) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert max(most) <= 3
    assert Backfill.objects.get().completed_at is not None
    assert dates() == [day(n) for n in range(1, 31)]
    assert (
        BackfillDagRun.objects.filter(backfill=backfill, dag_run__isnull=False)
        .values("dag_run")
        .distinct()
        .count()
        == 30
    )


def test_one_unfinished_backfill_per_dag_and_bad_ranges_are_refused():
    sync()
    backfills.create_backfill(dag_id="filled", from_date=day(1), to_date=day(2))
    with pytest.raises(exceptions.Conflict):
        backfills.create_backfill(dag_id="filled", from_date=day(3), to_date=day(4))
    with pytest.raises(exceptions.InvalidInput, match="must not be after"):
        backfills.plan_backfill(dag_id="filled", from_date=day(4), to_date=day(3))
    with pytest.raises(exceptions.InvalidInput, match="future"):
        backfills.plan_backfill(
            dag_id="filled", from_date=at("2099-01-01T00:00:00"), to_date=at("2099-02-01T00:00:00")
        )
    with pytest.raises(exceptions.NotFound):
        backfills.plan_backfill(dag_id="nope", from_date=day(1), to_date=day(2))
    sync(dag_id="assets", timetable=None, schedule={"any": ["x"]})
    with pytest.raises(exceptions.InvalidInput, match="non-periodic"):
        backfills.plan_backfill(dag_id="assets", from_date=day(1), to_date=day(2))


def test_pause_unpause_and_cancel_are_airflows_and_audited():
    sync()
    backfill = backfills.create_backfill(
        dag_id="filled", from_date=day(1), to_date=day(6), max_active_runs=2
    )
    backfills.set_paused(backfill_id=backfill.pk, is_paused=True)
    finish()
    assert backfills.start_runs().run_ids == ()
    backfills.set_paused(backfill_id=backfill.pk, is_paused=False)
    assert dates() == [day(n) for n in range(1, 5)]
    running = DagRun.objects.get(logical_date=day(3))
    DagRun.objects.filter(pk=running.pk).update(state=DagRunState.RUNNING)
    TaskInstance.objects.filter(dag_run=running, task_id="a").update(state=TIState.RUNNING)
    cancelled = backfills.cancel(backfill_id=backfill.pk)
    assert cancelled.completed_at is not None and cancelled.is_paused
    # Queued runs fail and their TIs cannot be claimed any more; running ones go on.
    queued = DagRun.objects.get(logical_date=day(4))
    assert queued.state == DagRunState.FAILED
    assert set(TaskInstance.objects.filter(dag_run=queued).values_list("state", flat=True)) == {
        TIState.SKIPPED
    }
    assert DagRun.objects.get(pk=running.pk).state == DagRunState.RUNNING
    assert TaskInstance.objects.get(dag_run=running, task_id="a").state == TIState.RUNNING
    assert backfills.start_runs().run_ids == ()
    for change in (
        lambda: backfills.cancel(backfill_id=backfill.pk),
        lambda: backfills.set_paused(backfill_id=backfill.pk, is_paused=True),
    ):
        with pytest.raises(exceptions.InvalidState, match="already completed"):
            change()
    audited = AuditEntry.objects.filter(action__startswith="backfill.").order_by("id")
    assert list(audited.values_list("action", flat=True)) == [
        "backfill.create",
        "backfill.pause",
        "backfill.unpause",
        "backfill.cancel",
    ]


@pytest.mark.parametrize("backfill_count", [1, 6])
def test_a_pass_takes_a_fixed_number_of_statements(backfill_count):
    for n in range(backfill_count):
        sync(dag_id=f"filled{n}")
        backfills.create_backfill(
            dag_id=f"filled{n}", from_date=day(1), to_date=day(9), max_active_runs=2
        )
    finish()
    with CaptureQueriesContext(connection) as queries:
        result = backfills.start_runs()
    assert len(result.run_ids) == 2 * backfill_count
    # savepoint-free: claim, active counts, pending, taken, tasks, runs, TIs, plan rows, and
    # the transaction's BEGIN/COMMIT.
    assert len(queries) == 10, [q["sql"][:80] for q in queries]


def test_the_command_plans_dry_runs_and_creates():
    sync()
    DagRunFactory(dag=Dag.objects.get(), run_id="x", logical_date=day(2), state=DagRunState.SUCCESS)
    call_command("backfill", "filled", "--from", "2026-01-01", "--to", "2026-01-03", "--dry-run")
    assert Backfill.objects.count() == 0
    call_command(
        "backfill",
        "filled",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-03",
        "--max-active-runs",
        "1",
        "--reprocess-behavior",
        "none",
    )
    backfill = Backfill.objects.get()
    assert (backfill.max_active_runs, backfill.reprocess_behavior) == (1, "none")
    assert dates() == [day(1)]
    assert backfills.summary(backfill) == {"pending": 1, "created": 1, "active": 1, "skipped": 1}
    assert AuditEntry.objects.get(action="backfill.create").actor_name.startswith("os:")
    with pytest.raises(CommandError, match="already a running backfill"):
        call_command("backfill", "filled", "--from", "2026-01-01", "--to", "2026-01-02")


def test_the_public_api_routes_answer_airflows_shapes():
    sync()
    get_user_model().objects.create_user("ops", password="pw", is_staff=True, is_superuser=True)
    _, key = create_api_token(username="ops", name="test")
    api = Client(headers={"Authorization": f"Bearer {key}"})
    body = {
        "dag_id": "filled",
        "from_date": "2026-01-01T00:00:00",
        "to_date": "2026-01-04T00:00:00Z",
        "max_active_runs": 2,
    }
    dry = api.post("/api/v2/backfills/dry_run", body, content_type="application/json")
    assert dry.status_code == 200, dry.content
    assert dry.json()["total_entries"] == 4
    assert dry.json()["backfills"][0] == {
        "logical_date": "2026-01-01T00:00:00Z",
        "partition_key": None,
        "partition_date": None,
    }
    created = api.post("/api/v2/backfills", body, content_type="application/json")
    assert created.status_code == 200, created.content
    answer = created.json()
    assert set(answer) == {
        "id",
        "dag_id",
        "from_date",
        "to_date",
        "dag_run_conf",
        "is_paused",
        "reprocess_behavior",
        "max_active_runs",
        "created_at",
        "completed_at",
        "updated_at",
        "dag_display_name",
    }
    assert (answer["dag_id"], answer["reprocess_behavior"], answer["is_paused"]) == (
        "filled",
        "none",
        False,
    )
    again = api.post("/api/v2/backfills", body, content_type="application/json")
    assert again.status_code == 409
    bid = answer["id"]
    listed = api.get("/api/v2/backfills", {"dag_id": "filled"}).json()
    assert listed["total_entries"] == 1 and listed["backfills"][0]["id"] == bid
    assert api.get(f"/api/v2/backfills/{bid}").json()["id"] == bid
    assert api.get("/api/v2/backfills/999999").status_code == 404
    assert api.put(f"/api/v2/backfills/{bid}/pause").json()["is_paused"] is True
    assert api.put(f"/api/v2/backfills/{bid}/unpause").json()["is_paused"] is False
    done = api.put(f"/api/v2/backfills/{bid}/cancel").json()
    assert done["completed_at"] is not None
    assert api.put(f"/api/v2/backfills/{bid}/pause").status_code == 409
    bad = api.post("/api/v2/backfills", {**body, "surprise": 1}, content_type="application/json")
    assert bad.status_code == 422
    audited = AuditEntry.objects.filter(action__startswith="backfill.").order_by("id")
    assert list(audited.values_list("action", "actor_name")) == [
        ("backfill.create", "ops"),
        ("backfill.pause", "ops"),
        ("backfill.unpause", "ops"),
        ("backfill.cancel", "ops"),
    ]


def test_a_range_far_into_the_future_walks_only_up_to_now(monkeypatch):
    """Issue 38: a minute schedule to a year ahead used to walk 525,600 future ticks (only past
    ones count toward the run limit) and held a web worker past gunicorn's timeout. The walk
    stops at now: the ticks it computes are the past ones, plus the one that ends the walk."""
    sync(timetable="* * * * *", start_date="2026-01-01")
    walked = []
    real = timetables.Timetable.next_run

    def counting(self, *args, **kwargs):
        walked.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(timetables.Timetable, "next_run", counting)
    now = at("2026-03-01T12:00:00")
    planned = backfills.plan_backfill(
        dag_id="filled",
        from_date=at("2026-03-01T10:00:00"),
        to_date=at("2027-03-01T10:00:00"),
        now=now,
    )
    assert len(planned) == 120  # 10:00 .. 11:59, each interval ended by 12:00
    assert planned[-1].info.data_interval_end <= now
    assert len(walked) <= len(planned) + 2
    # The same bound for a dry run through the command.
    walked.clear()
    with pytest.raises(exceptions.InvalidInput, match="at most"):
        backfills.plan_backfill(
            dag_id="filled",
            from_date=at("2026-01-01T00:00:00"),
            to_date=at("2030-01-01T00:00:00"),
            now=now,
        )
    assert len(walked) <= backfills.MAX_PLANNED_RUNS + 2


def test_backfill_runs_do_not_count_against_the_dags_max_active_runs():
    # Airflow 3.3.2 counts active runs with `exclude_backfill=True` ("their concurrency is
    # separate"): 2 queued backfill runs leave a Dag with max_active_runs=2 both its slots
    # (was: 0 scheduled runs).
    from assets_app.scheduling import time_runs

    sync(catchup=True, max_active_runs=2)
    backfills.create_backfill(
        dag_id="filled", from_date=at("2025-12-01"), to_date=at("2025-12-02"), now=day(5)
    )
    assert DagRun.objects.filter(run_type="backfill", state=DagRunState.QUEUED).count() == 2
    time_runs.create_due_runs(now=at("2026-01-03T12:00:00"))
    scheduled = DagRun.objects.filter(run_type="scheduled").order_by("logical_date")
    assert [run.logical_date for run in scheduled] == [day(1), day(2)]
    # ... and the scheduled runs count: the third waits for a slot.
    assert Dag.objects.get(dag_id="filled").next_dagrun == day(3)


def test_a_backfills_planned_dates_are_held_before_their_runs_exist():
    # Airflow creates all the runs of a backfill at once, so the scheduler never takes one of
    # its dates. Here they are created as their turn comes: the dates still pending are held
    # the same (was: the time scheduler took them and the backfill recorded "in flight").
    from assets_app.scheduling import time_runs

    sync(catchup=True, max_active_runs=16)
    backfills.create_backfill(
        dag_id="filled", from_date=day(1), to_date=day(3), max_active_runs=1, now=day(4)
    )
    assert dates() == [day(1)]
    time_runs.create_due_runs(now=at("2026-01-04T12:00:00"))
    assert list(
        DagRun.objects.filter(run_type="scheduled").values_list("logical_date", flat=True)
    ) == [day(4)]
    for _ in range(3):
        finish()
        backfills.start_runs(now=day(5))
    assert dates() == [day(1), day(2), day(3)]
    assert not BackfillDagRun.objects.filter(exception_reason__isnull=False).exists()


def test_an_unpause_stores_the_next_run_after_a_waiting_backfills_dates():
    # A paused Dag's backfill waits (its runs are created once the Dag is unpaused); Airflow's
    # runs of it exist already, and its Dag processor stores the next run after the latest.
    from assets_app.catalog import dags
    from assets_app.scheduling import time_runs

    sync(catchup=True, is_paused=True)
    backfills.create_backfill(dag_id="filled", from_date=day(1), to_date=day(3), now=day(4))
    assert dates() == []
    dags.set_paused(dag_id="filled", is_paused=False)
    assert Dag.objects.get(dag_id="filled").next_dagrun == day(4)
    time_runs.create_due_runs(now=at("2026-01-04T12:00:00"))
    backfills.start_runs(now=at("2026-01-04T12:00:00"))
    assert dates() == [day(1), day(2), day(3)]
    assert list(
        DagRun.objects.filter(run_type="scheduled").values_list("logical_date", flat=True)
    ) == [day(4)]
