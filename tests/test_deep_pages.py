"""Issue 48: an offset page from DEFERRED_JOIN_FROM on picks its primary keys first (only the
order's columns read, so the skipped rows are never fetched whole), then loads those rows: the
same rows in the same order as the one-query page, for every order, including one on a joined
column and a computed one."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from assets_app.catalog import listing, run_reads
from tests.factories import DagFactory, DagRunFactory, TaskInstanceFactory

pytestmark = pytest.mark.django_db


def _pages(order_by, monkeypatch, deferred_from):
    monkeypatch.setattr(listing, "DEFERRED_JOIN_FROM", deferred_from)
    filters = run_reads.TIFilters()
    pages = []
    for offset in range(0, 26, 4):
        with CaptureQueriesContext(connection) as captured:
            page = run_reads.list_task_instances(
                dag_id="~", run_id="~", filters=filters, order_by=order_by, limit=4, offset=offset
            )
        pages.append(([ti.id for ti in page.rows], page.total_entries))
    return pages, [q["sql"] for q in captured.captured_queries]


@pytest.mark.parametrize(
    "order_by", [None, ["-map_index"], ["-run_after", "state"], ["duration"], ["-start_date"]]
)
def test_deep_offset_pages_give_the_same_rows_in_the_same_order(order_by, monkeypatch):
    now = timezone.now()
    for d in range(3):
        dag = DagFactory()
        for r in range(3):
            run = DagRunFactory(dag=dag, run_after=now - timezone.timedelta(hours=r * 3 + d))
            for t in range(3):
                TaskInstanceFactory(
                    dag_run=run,
                    task_id=f"t{t}",
                    map_index=(t + r) % 2 - 1,
                    state="success" if t else "failed",
                    start_date=now - timezone.timedelta(minutes=t + r) if t != 1 else None,
                    end_date=now,
                )
    one_query, _ = _pages(order_by, monkeypatch, deferred_from=10**9)
    deferred, sql = _pages(order_by, monkeypatch, deferred_from=0)
    assert deferred == one_query
    assert sum(len(ids) for ids, _ in deferred) == 27
    # The keys query selects the primary key alone.
    keys = [s for s in sql if s.startswith('SELECT "assets_app_taskinstance"."id" AS "pk"')]
    assert len(keys) == 1 and "OFFSET 24" in keys[0], sql
