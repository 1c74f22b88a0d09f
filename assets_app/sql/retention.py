"""Retention's statements (`retention`): the one-statement deletes of a clean's batches."""

from django.db.models import QuerySet


def delete_rows(queryset: QuerySet) -> int:
    """One `DELETE FROM <table> WHERE <the queryset's filter>`; the number of rows deleted.

    Not `QuerySet.delete()`: its collector loads the rows and every dependent row to cascade
    and send signals; retention deletes the dependent rows itself, children first, by key
    lists it already holds, so each table costs one statement (Django's own fast-delete path,
    `_raw_delete`, the same on PostgreSQL and SQLite)."""
    return int(queryset._raw_delete(queryset.db) or 0)
