"""The console shows a Dag's time schedule (issue 24): the schedule as words ("At 03:00,
Europe/Zurich", assets and time together) and the next run, in the Dag list and on the Dag
page; the runs grid orders runs by logical date (a run without one by its run_after)."""

import datetime as dt
import re

import pytest
from django.urls import reverse

from assets_app.definitions import sync as definitions
from assets_app.models import Dag, DagRun, DagRunType
from tests.factories import DagFactory

pytestmark = pytest.mark.django_db

UTC = dt.UTC
CHANGELIST = reverse("admin:assets_app_dag_changelist")


def sync(**dag):
    document = {"tasks": [{"task_id": "t"}], **dag}
    definitions.sync_definitions(dags=definitions.parse_document(document, file="x.json"))
    return Dag.objects.get(dag_id=dag["dag_id"])


def row_of(page: str, dag_id: str) -> str:
    match = re.search(rf"<tr[^>]*>(?:(?!</tr>).)*>{dag_id}</a>(?:(?!</tr>).)*</tr>", page, re.S)
    assert match, f"no row for {dag_id}"
    return match.group(0)


def test_the_dag_list_shows_the_schedule_as_text_and_the_next_run(staff_client):
    sync(dag_id="nightly", timetable="0 3 * * *", timezone="Europe/Zurich", start_date="2099-01-01")
    sync(dag_id="hourly", timetable="@hourly", start_date="2099-01-01")
    sync(dag_id="either", timetable="5 * * * *", schedule="orders", start_date="2099-01-01")
    sync(
        dag_id="both",
        timetable="@daily",
        schedule="orders",
        schedule_mode="asset_and_time",
        start_date="2099-01-01",
    )
    sync(dag_id="six", timetable={"kind": "delta_trigger", "delta": 21600}, start_date="2099-01-01")
    sync(dag_id="manual")
    page = staff_client.get(CHANGELIST).content.decode()
    nightly = row_of(page, "nightly")
    assert "At 03:00, Europe/Zurich" in nightly
    # 03:00 in Zurich is 02:00 UTC in January (the console's zone is UTC here).
    assert "2099-01-01 02:00 UTC" in nightly
    assert "Every hour" in row_of(page, "hourly")
    assert "At 5 minutes past the hour, or on orders" in row_of(page, "either")
    assert "At 00:00, when orders had events since the tick before" in row_of(page, "both")
    assert "Every 6 hours" in row_of(page, "six")
    assert "manual only" in row_of(page, "manual")


def test_the_dag_list_filters_time_schedules(staff_client):
    sync(dag_id="nightly", timetable="0 3 * * *", start_date="2099-01-01")
    sync(dag_id="either", timetable="@daily", schedule="orders", start_date="2099-01-01")
    sync(dag_id="assets", schedule="orders")
    sync(dag_id="manual")

    def listed(value):
        page = staff_client.get(CHANGELIST, {"scheduled": value}).content.decode()
        return {d for d in ("nightly", "either", "assets", "manual") if f">{d}</a>" in page}

    assert listed("time") == {"nightly", "either"}
    assert listed("both") == {"either"}
    assert listed("manual") == {"manual"}


def test_the_dag_page_shows_the_schedule_next_run_and_bounds(staff_client):
    dag = sync(
        dag_id="interval",
        timetable={"kind": "cron_data_interval", "cron": "0 3 * * *"},
        timezone="Europe/Zurich",
        start_date="2099-01-01",
        catchup=True,
    )
    page = staff_client.get(reverse("admin:assets_app_dag_change", args=[dag.pk])).content.decode()
    assert "At 03:00, Europe/Zurich" in page
    # A data-interval run is due at the end of its interval; its logical date is the start.
    assert "2099-01-02 02:00 UTC" in page and "(logical date 2099-01-01 02:00 UTC)" in page
    assert "Europe/Zurich; from 2098-12-31 23:00 UTC to none; catchup on" in page


def test_the_grid_orders_runs_by_logical_date_and_asset_runs_by_run_after(staff_client):
    dag = DagFactory(dag_id="mixed")

    def run(run_id, run_type, *, logical, run_after):
        return DagRun.objects.create(
            dag=dag,
            run_id=run_id,
            run_type=run_type,
            state="success",
            logical_date=logical,
            run_after=run_after,
        )

    day = dt.datetime(2099, 1, 1, tzinfo=UTC)
    # Created out of order: a catchup's later run first, an asset run between the ticks.
    run(
        "scheduled__3",
        DagRunType.SCHEDULED,
        logical=day + dt.timedelta(days=2),
        run_after=day + dt.timedelta(days=2),
    )
    run(
        "asset_triggered__x",
        DagRunType.ASSET_TRIGGERED,
        logical=None,
        run_after=day + dt.timedelta(days=1, hours=12),
    )
    run("scheduled__1", DagRunType.SCHEDULED, logical=day, run_after=day)
    run(
        "scheduled__2",
        DagRunType.SCHEDULED,
        logical=day + dt.timedelta(days=1),
        run_after=day + dt.timedelta(days=1),
    )
    page = staff_client.get(reverse("admin:assets_app_dag_grid", args=[dag.pk])).content.decode()
    # Each run's column head (its bar's title starts with the run id; the label row under it
    # repeats the id as its own title).
    order = re.findall(r'title="((?:scheduled|asset_triggered)__\w+) ·', page)
    assert order == ["scheduled__1", "scheduled__2", "asset_triggered__x", "scheduled__3"]


@pytest.mark.parametrize(
    ("consumption", "shown"),
    [
        ("batch", "batch: a run consumes every event queued when its condition is met"),
        ("per_event", "per_event: one run per event, in event order"),
        ({"max_events": 50}, "max_events 50: runs of at most that many events, oldest first"),
    ],
)
def test_the_dag_page_says_how_many_events_a_run_consumes(staff_client, consumption, shown):
    dag = sync(dag_id="consumer", schedule="orders", consumption=consumption)
    page = staff_client.get(reverse("admin:assets_app_dag_change", args=[dag.pk])).content.decode()
    assert "Events per run" in page and shown in page
