"""Retention's statements (`retention`): the one-statement deletes of a clean's batches and the
batch transaction's commit mode."""

from django.db import connection
from django.db.models import QuerySet


def delete_rows(queryset: QuerySet) -> int:
    """One `DELETE FROM <table> WHERE <the queryset's filter>`; the number of rows deleted.

    Not `QuerySet.delete()`: its collector loads the rows and every dependent row to cascade
    and send signals; retention deletes the dependent rows itself, children first, by key
    lists it already holds, so each table costs one statement (Django's own fast-delete path,
    `_raw_delete`, the same on PostgreSQL and SQLite)."""
    return int(queryset._raw_delete(queryset.db) or 0)


def commit_without_waiting_for_flush() -> None:
    """`SET LOCAL synchronous_commit TO OFF`, in the caller's transaction (a clean's batch): its
    COMMIT returns without waiting for its WAL to reach the disk; PostgreSQL's WAL writer
    flushes it within 3 x wal_writer_delay (0.6 s by default). Nothing on SQLite.

    Raw because it is a PostgreSQL setting the ORM does not wrap. Why: a clean commits a batch
    every few tens of milliseconds, and each synchronous commit is one more flush its own
    transaction waits for and the success path's commits queue behind. What it risks: a crash
    of PostgreSQL or of the machine (not of the clean) can lose the batches committed in that
    last window; the database stays consistent (those rows are simply not deleted yet) and the
    next clean deletes them again (exporting them again, when exporting). Nothing else waits on
    a deletion being durable."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit TO OFF")
