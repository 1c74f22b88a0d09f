"""The console's row estimates (issue 48): how many rows a big table holds, not counted."""

from django.db import DEFAULT_DB_ALIAS, connections, router
from django.db.models import Model


def estimated_rows(model: type[Model]) -> int | None:
    """The planner's estimate of the rows in `model`'s table; None on SQLite, or while the table
    was never analyzed (`reltuples` -1).

    Raw because `pg_class` is PostgreSQL's catalog, which the ORM does not map. The estimate is
    the planner's own: `reltuples` (from the last ANALYZE or autovacuum) scaled by the table's
    pages now over its pages then, so rows added since then are counted too. Why: a plain list
    page counted 3 M TIs with COUNT(*) on every load (a sequential scan, ~0.5 s) for a number an
    operator reads as "about 3 M".

    Read where the model's rows are read (`router.db_for_read`): on the standby when the
    request reads there (issue 46), as the page's own queries do."""
    connection = connections[router.db_for_read(model) or DEFAULT_DB_ALIAS]
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT CASE WHEN c.reltuples < 0 THEN NULL WHEN c.relpages > 0 "
            "THEN c.reltuples / c.relpages "
            "* (pg_relation_size(c.oid) / current_setting('block_size')::int) "
            "ELSE c.reltuples END FROM pg_class c WHERE c.oid = %s::regclass",
            [model._meta.db_table],
        )
        row = cursor.fetchone()
    if row is None or row[0] is None:
        return None
    return int(row[0])
