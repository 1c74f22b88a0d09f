"""Issue 30: the indexes retention's deletes and selections need exist in the migrated schema.

Every foreign key that points at a table retention deletes from (and so is checked, or
deleted by key, for each deleted row) has an index leading with the referencing column, and
every age column retention selects by leads an index. Read from PostgreSQL's catalog of the
migrated test database, so a missing migration fails here."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from assets_app.models import AssetEvent, AuditEntry, Dag, DagRun, WebhookDelivery, XCom
from assets_app.operations import retention

pytestmark = pytest.mark.django_db


def _leading_columns(table: str) -> set[tuple[str, ...]]:
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, table)
    return {
        tuple(c["columns"])
        for c in constraints.values()
        if (c["index"] or c["unique"] or c["primary_key"]) and c["columns"]
    }


def _indexed(table: str, columns: tuple[str, ...]) -> bool:
    return any(cols[: len(columns)] == columns for cols in _leading_columns(table))


def test_every_foreign_key_into_a_table_retention_deletes_is_indexed():
    checked: list[str] = []
    for model in retention.DELETED_MODELS:
        # Foreign keys and one-to-ones (a many-to-many is its through model's foreign keys).
        for relation in (r for r in model._meta.related_objects if not r.many_to_many):
            referencing = relation.related_model
            column = relation.field.column
            assert column is not None
            checked.append(f"{referencing._meta.db_table}.{column}")
            assert _indexed(referencing._meta.db_table, (column,)), (
                f"{referencing._meta.db_table}.{column} (-> {model._meta.db_table}) has no index"
            )
    assert len(checked) >= 8  # TIs, rendered fields, reschedules, links, alias links, targets...


@pytest.mark.parametrize(
    ("model", "columns"),
    [
        (AssetEvent, ("timestamp",)),
        (AuditEntry, ("at",)),
        (XCom, ("timestamp",)),
        (WebhookDelivery, ("created_at",)),
        (DagRun, ("dag_id", "id")),
    ],
)
def test_the_columns_retention_selects_by_lead_an_index(model, columns):
    assert _indexed(model._meta.db_table, columns), (model._meta.db_table, columns)


@pytest.mark.django_db(transaction=True)
def test_the_run_scan_finds_each_dags_last_runs_on_the_dag_id_id_index():
    """The keep-last-N floor is one probe of (dag_id, id) per candidate run, whatever the plan's
    estimates: with `dag_id = ...` ordered by id PostgreSQL walked the primary key backwards
    instead, filtering every newer run of every other Dag (46 ms per 100-run select in
    bench/retention.py at --scale 0.05). Many Dags, the newest runs another Dag's, as there.

    The run table starts from new files (TRUNCATE): the dead rows earlier tests left in it (the
    suite's flush deletes; a rolled-back test leaves its rows dead too) changed the plan's
    costs, and the walk of the primary key then went unseen (the mutant check, on a reused
    database, saw it survive)."""
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {DagRun._meta.db_table} CASCADE")
    now = timezone.now()
    dags = [Dag(dag_id=f"many_{i}") for i in range(50)] + [Dag(dag_id="busy")]
    Dag.objects.bulk_create(dags)
    old = now - timedelta(days=400)
    DagRun.objects.bulk_create(
        DagRun(
            dag_id=f"many_{i % 50}",
            run_id=f"r{i}",
            run_type="manual",
            state="success",
            run_after=old,
            end_date=old,
        )
        for i in range(10_000)
    )
    DagRun.objects.bulk_create(
        DagRun(dag_id="busy", run_id=f"b{i}", run_type="manual", state="running", run_after=now)
        for i in range(2_000)
    )
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {DagRun._meta.db_table}")
    plan = (
        retention.run_scan(cutoff=now - timedelta(days=90), keep=10)
        .filter(id__gt=0)
        .order_by("id")
        .values_list("id", flat=True)[:100]
        .explain()
    )
    subplan = plan[plan.index("SubPlan") :]
    assert "dag_run_by_dag_id" in subplan, plan
    assert "assets_app_dagrun_pkey" not in subplan, plan
