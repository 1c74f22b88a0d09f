"""Issue 45: the grid at 1,000 tasks x 100 runs renders in under a second. Each task row is one
compact string (state, duration in ms from SQL, unfinished, try) that a small script draws as
cells; a cell's link names its run and task and lands on the TI (or, mapped, the run's TI
table); the run page lists its first TIs in task order and links to all of them."""

from datetime import UTC, datetime, timedelta

from django.urls import reverse
from django.utils import timezone

from assets_app.admin import runs as runs_admin
from tests.admin import grid_page
from tests.factories import DagFactory, DagRunFactory, TaskInstanceFactory


def test_a_cell_carries_its_state_duration_try_and_link(staff_client):
    dag = DagFactory(dag_id="cells")
    first = DagRunFactory(dag=dag, run_id="r1", state="success")
    second = DagRunFactory(dag=dag, run_id="r2", state="running")
    start = datetime(2026, 3, 1, 6, 0, tzinfo=UTC)
    done = TaskInstanceFactory(
        dag_run=first,
        task_id="load",
        state="success",
        try_number=2,
        start_date=start,
        end_date=start + timedelta(seconds=42, milliseconds=500),
    )
    TaskInstanceFactory(
        dag_run=second,
        task_id="load",
        state="running",
        start_date=timezone.now() - timedelta(minutes=3),
    )
    TaskInstanceFactory(dag_run=first, task_id="<b>later</b>", state="scheduled", try_number=0)
    page = staff_client.get(reverse("admin:assets_app_dag_grid", args=["cells"])).content.decode()
    rows = grid_page.rows(page)
    assert "<b>later</b>" not in page  # the removed task's id is shown escaped
    old, running = rows["load"]
    assert (old["state"], old["ms"], old["unfinished"], old["try"]) == ("success", 42500, False, 2)
    assert running["state"] == "running" and running["unfinished"]
    assert 180_000 <= running["ms"] < 240_000
    never, missing = rows["<b>later</b>"]
    assert (never["state"], never["ms"], never["try"]) == ("scheduled", None, 0) and missing is None
    # The link names the run and the task; it lands on the TI's page.
    landed = staff_client.get(old["url"])
    assert landed.status_code == 302
    assert landed.url == reverse("admin:assets_app_taskinstance_change", args=[done.pk])


def test_a_mapped_task_link_by_run_and_task_opens_the_run_table(staff_client):
    run = DagRunFactory(dag=DagFactory(dag_id="fan"), state="success")
    for i in range(2):
        TaskInstanceFactory(dag_run=run, task_id="each", map_index=i, state="success")
    url = reverse("admin:assets_app_dagrun_ti", args=[run.pk, "each"])
    landed = staff_client.get(url)
    page = reverse("admin:assets_app_dagrun_change", args=[run.pk])
    assert landed.url == f"{page}#run-task-instances"
    missing = reverse("admin:assets_app_dagrun_ti", args=[run.pk, "nope"])
    assert staff_client.get(missing).status_code == 404


def test_the_run_page_lists_its_first_tis_and_links_to_all(monkeypatch, staff_client):
    monkeypatch.setattr(runs_admin, "TI_TABLE_SHOWN", 2)
    run = DagRunFactory(dag=DagFactory(dag_id="many"), state="failed")
    for task_id in ("a", "b", "c"):
        TaskInstanceFactory(
            dag_run=run, task_id=task_id, state="failed" if task_id == "c" else "success"
        )
    other = TaskInstanceFactory(task_id="elsewhere", state="success")
    page = staff_client.get(reverse("admin:assets_app_dagrun_change", args=[run.pk]))
    page = page.content.decode()
    table = page[page.index('id="run-task-instances"') :]
    table = table[: table.index("</table>")]
    assert ">a</a>" in table and ">b</a>" in table and ">c</a>" not in table
    assert "The first 2 of 3 task instances in task order" in page
    # The failed-TI excerpt is still there for a TI beyond the table's first rows.
    assert "c" in page[page.index('id="run-failed"') :][:2000]
    listing = reverse("admin:assets_app_taskinstance_changelist") + f"?dag_run__id__exact={run.pk}"
    assert f'href="{listing}"' in page
    listed = staff_client.get(listing)
    assert listed.status_code == 200
    listed = listed.content.decode()
    assert all(f"many.{t}<br>" in listed for t in ("a", "b", "c"))
    assert other.task_id not in listed


def test_a_mapped_cell_with_an_index_still_running_says_so_far(staff_client):
    run = DagRunFactory(dag=DagFactory(dag_id="spread"), state="running")
    start = timezone.now() - timedelta(seconds=30)
    TaskInstanceFactory(
        dag_run=run,
        task_id="each",
        map_index=0,
        state="success",
        start_date=start,
        end_date=start + timedelta(seconds=5),
    )
    TaskInstanceFactory(dag_run=run, task_id="each", map_index=1, state="scheduled")
    page = staff_client.get(reverse("admin:assets_app_dag_grid", args=["spread"])).content
    assert "each (2 mapped) · 1 scheduled, 1 success · 30 s so far · " in page.decode()
