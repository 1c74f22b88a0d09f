"""Issue 30: the indexes retention's deletes and selections need exist in the migrated schema.

Every foreign key that points at a table retention deletes from (and so is checked, or
deleted by key, for each deleted row) has an index leading with the referencing column, and
every age column retention selects by leads an index. Read from PostgreSQL's catalog of the
migrated test database, so a missing migration fails here."""

import pytest
from django.db import connection

from assets_app import retention
from assets_app.models import AssetEvent, AuditEntry, DagRun, WebhookDelivery, XCom

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
    checked = []
    for model in retention.DELETED_MODELS:
        # Foreign keys and one-to-ones (a many-to-many is its through model's foreign keys).
        for relation in (r for r in model._meta.related_objects if not r.many_to_many):
            referencing = relation.related_model
            column = relation.field.column
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
