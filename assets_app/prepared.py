"""Prepared statements for the few fixed statements every success runs (issue 14).

Django's PostgreSQL cursors bind parameters on the client: each statement goes to the server as
text with its values inlined, and PostgreSQL parses and plans it again every time. For the
statements of the success path (TI read, outbox INSERT, TI UPDATE, downstream evaluation, run
UPDATE, nudge read) the planning was most of the backend's CPU: 5.3 ms per 300-outlet success,
1.7 ms with these statements prepared (`bench/success_breakdown.py`; the downstream evaluation's
long CASE alone took about 2 ms to plan).

`cursor()` gives a Django cursor (query logging, execute wrappers and error translation as
usual) over a psycopg server-side-binding cursor: psycopg prepares a statement on its connection
after `prepare_threshold` executions of it (the connection's setting, DATABASE_PREPARE_THRESHOLD,
default 2) and then sends only its name and parameters. Only these statements use it: the others
keep Django's client-side binding, which has no 65,535-parameter limit (the drain and the
scheduler send statements with more parameters than that). DATABASE_PREPARED_STATEMENTS=False
turns it off (a transaction-pooling PgBouncer cannot keep prepared statements); on SQLite it is
the plain cursor.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper


class _LoggedCursor(CursorDebugWrapper):
    """Query logging (DEBUG, tests' query counts) of a prepared statement: psycopg sends it by
    name, so Django's "last executed query" is empty; log the statement's text instead."""

    def execute(self, sql, params=None):
        with self.debug_sql(sql, params):
            return CursorWrapper.execute(self, sql, params)


@contextmanager
def cursor() -> Iterator[CursorWrapper]:
    """A cursor whose statements psycopg prepares on the connection after a few executions."""
    if connection.vendor != "postgresql" or not settings.DATABASE_PREPARED_STATEMENTS:
        with connection.cursor() as plain:
            yield plain
        return
    from django.db.backends.postgresql import base

    # Typed as Any: django-stubs types this psycopg 3 cursor class without its constructor.
    server_binding_cursor: Any = base.ServerBindingCursor
    connection.ensure_connection()
    connection.validate_thread_sharing()
    raw = server_binding_cursor(connection.connection)
    wrapped = (
        _LoggedCursor(raw, connection) if connection.queries_logged else connection.make_cursor(raw)
    )
    with wrapped:
        yield wrapped
