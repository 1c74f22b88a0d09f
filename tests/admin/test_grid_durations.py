"""Issue 45: the grid's runs are labelled by date under their bars, a bar is as tall as its
run's duration, and every cell (a mapped one too) says its duration on hover."""

import re
from datetime import UTC, datetime, timedelta

from django.urls import reverse

from assets_app.admin import runs as runs_admin
from tests.factories import DagFactory, DagRunFactory, TaskInstanceFactory


def test_run_bars_grow_with_duration_and_columns_carry_dates(staff_client):
    dag = DagFactory(dag_id="timed")
    day = datetime(2026, 3, 1, 6, 0, tzinfo=UTC)
    for i, minutes in enumerate((10, 40, 20)):
        start = day + timedelta(days=i)
        DagRunFactory(
            dag=dag,
            run_id=f"scheduled__{i}",
            state="success",
            logical_date=start,
            run_after=start,
            start_date=start,
            end_date=start + timedelta(minutes=minutes),
        )
    page = staff_client.get(reverse("admin:assets_app_dag_grid", args=["timed"])).content.decode()
    heights = [int(h) for h in re.findall(r'aes-run-cell"[^>]*height:(\d+)px', page)]
    low, high = runs_admin.GRID_BAR_MIN, runs_admin.GRID_BAR_MAX
    assert heights == [round(low + (high - low) * m / 40) for m in (10, 40, 20)]
    labels = re.findall(r'<span class="aes-run-label" title="([^"]+)">([^<]+)</span>', page)
    assert labels == [
        ("scheduled__0", "03-01 06:00"),
        ("scheduled__1", "03-02 06:00"),
        ("scheduled__2", "03-03 06:00"),
    ]


def test_a_mapped_cell_says_its_duration(staff_client):
    run = DagRunFactory(dag=DagFactory(dag_id="fan"), state="success")
    start = datetime(2026, 3, 1, 6, 0, tzinfo=UTC)
    for i in range(3):
        TaskInstanceFactory(
            dag_run=run,
            task_id="each",
            map_index=i,
            state="success",
            start_date=start + timedelta(seconds=i),
            end_date=start + timedelta(seconds=10 + 5 * i),
        )
    page = staff_client.get(reverse("admin:assets_app_dag_grid", args=["fan"])).content.decode()
    # From the first map index's start to the last one's end.
    assert f"each (3 mapped) · 3 success · 20 s · {run.run_id}" in page
