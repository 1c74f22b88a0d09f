"""Issue 48, the console at a year of history: a TI id finds its TI by primary key, a plain list
of a big table shows an estimate instead of counting it (the exact count one click away), and
the Dag-id filters offer the Dag table's ids instead of a DISTINCT over the filtered table.

Each checks the SQL the page ran (captured), not a query plan: a plan depends on the table's
size and statistics, the statement does not."""

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from assets_app.admin.runs import DagRunAdmin
from assets_app.models import AssetEvent, DagRun, TaskInstance, TaskLogChunk, XCom
from assets_app.sql import estimates
from tests.factories import (
    AssetEventFactory,
    DagFactory,
    DagRunFactory,
    TaskInstanceFactory,
)

pytestmark = pytest.mark.django_db

TIS = reverse("admin:assets_app_taskinstance_changelist")
RUNS = reverse("admin:assets_app_dagrun_changelist")


def _page(client, path, params=None):
    with CaptureQueriesContext(connection) as captured:
        response = client.get(path, params or {})
    assert response.status_code == 200, response.status_code
    return response.content.decode(), [q["sql"] for q in captured.captured_queries]


def _shown_ids(client, params) -> set[uuid.UUID]:
    response = client.get(TIS, params)
    assert response.status_code == 200
    return {ti.id for ti in response.context["cl"].result_list}


def test_ti_search_by_id_matches_the_primary_key_exactly(staff_client):
    wanted, other = TaskInstanceFactory(), TaskInstanceFactory()
    for term in (str(wanted.id), f"  {str(wanted.id).upper()} ", wanted.id.hex):
        assert _shown_ids(staff_client, {"q": term}) == {wanted.id}
    _, sql = _page(staff_client, TIS, {"q": str(wanted.id)})
    searched = [s for s in sql if 'FROM "assets_app_taskinstance"' in s and "WHERE" in s]
    assert searched, sql
    for statement in searched:
        # The primary key compared with the UUID itself, never its text in upper case.
        assert f'"assets_app_taskinstance"."id" = \'{wanted.id.hex}\'' in statement or (
            f'"assets_app_taskinstance"."id" = \'{wanted.id}\'' in statement
        ), statement
        assert "UPPER(" not in statement and "LIKE" not in statement, statement
    # Any other term still searches the text columns, the Dag id among them.
    assert _shown_ids(staff_client, {"q": other.dag_id}) == {other.id}


def test_log_chunk_search_by_ti_id_is_exact_and_other_terms_find_nothing(staff_client):
    path = reverse("admin:assets_app_tasklogchunk_changelist")
    ti, other = TaskInstanceFactory(), TaskInstanceFactory()
    for each in (ti, other):
        TaskLogChunk.objects.create(ti=each, try_number=1, offset=0, size=3, content="hi\n")
    response = staff_client.get(path, {"q": str(ti.id).upper()})
    assert [chunk.ti_id for chunk in response.context["cl"].result_list] == [ti.id]
    _, sql = _page(staff_client, path, {"q": str(ti.id)})
    assert not [s for s in sql if "UPPER(" in s], sql
    response = staff_client.get(path, {"q": "not-an-id"})
    assert list(response.context["cl"].result_list) == []


def _analyze(model) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f'ANALYZE "{model._meta.db_table}"')


def _counts(sql, table) -> list[str]:
    return [s for s in sql if s.startswith("SELECT COUNT(*)") and f'"{table}"' in s]


def test_plain_list_past_the_threshold_shows_an_estimate_and_counts_on_request(
    staff_client, monkeypatch
):
    dag = DagFactory()
    DagFactory()  # Django drops a Dag filter offering one choice, and its parameter with it
    for _ in range(30):
        DagRunFactory(dag=dag)
    _analyze(DagRun)
    estimate = estimates.estimated_rows(DagRun)
    assert estimate is not None and estimate > 10
    monkeypatch.setattr(DagRunAdmin, "count_estimate_above", 10)

    html, sql = _page(staff_client, RUNS)
    assert f"about {estimate} dag runs (estimated)" in html
    assert "exact_count=1" in html
    assert not _counts(sql, "assets_app_dagrun"), sql

    html, sql = _page(staff_client, RUNS, {"exact_count": "1"})
    assert "(estimated)" not in html and "30 dag runs" in html
    assert _counts(sql, "assets_app_dagrun")

    # A filtered or searched list counts its own rows exactly, and never the whole table.
    html, sql = _page(staff_client, RUNS, {"dag__dag_id__exact": dag.dag_id})
    assert "(estimated)" not in html and "30 dag runs" in html
    assert all("WHERE" in s for s in _counts(sql, "assets_app_dagrun")), sql


def test_plain_list_below_the_threshold_counts_exactly(staff_client):
    for _ in range(3):
        DagRunFactory()
    _analyze(DagRun)
    html, sql = _page(staff_client, RUNS)
    assert "(estimated)" not in html and "3 dag runs" in html
    assert _counts(sql, "assets_app_dagrun")


@pytest.mark.parametrize(
    ("model", "table", "column"),
    [
        (TaskInstance, "assets_app_taskinstance", "dag_id"),
        (AssetEvent, "assets_app_assetevent", "source_dag_id"),
        (XCom, "assets_app_xcom", "dag_id"),
    ],
)
def test_dag_id_filter_offers_the_dag_table_not_a_distinct_over_the_rows(
    staff_client, model, table, column
):
    shown, hidden = DagFactory(dag_id="shown_dag"), DagFactory(dag_id="other_dag")
    for dag in (shown, hidden):
        run = DagRunFactory(dag=dag)
        TaskInstanceFactory(dag_run=run, task_id="t")
        AssetEventFactory(source_dag_id=dag.dag_id)
        XCom.objects.create(dag_id=dag.dag_id, run_id=run.run_id, task_id="t", key="k", value=1)
    path = reverse(f"admin:assets_app_{model._meta.model_name}_changelist")
    html, sql = _page(staff_client, path)
    assert not [s for s in sql if "DISTINCT" in s and f'"{table}"' in s], sql
    assert [s for s in sql if 'FROM "assets_app_dag"' in s and '"assets_app_dag"."dag_id"' in s]
    assert f"{column}__exact=shown_dag" in html and f"{column}__exact=other_dag" in html

    response = staff_client.get(path, {f"{column}__exact": "shown_dag"})
    rows = list(response.context["cl"].result_list)
    assert rows and {getattr(row, column) for row in rows} == {"shown_dag"}
