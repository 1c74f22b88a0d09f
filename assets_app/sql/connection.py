"""The database connection's own statements and questions: dialect questions, the prepared
cursor (the success path's fixed statements), the health check, the metrics counter upsert, the
advisory lock and the broker's LISTEN / NOTIFY.

Every other module of this package builds on `prepared_cursor` and the dialect questions here.
Like the whole package it imports Django, psycopg (for the LISTEN connection) and the models,
never a domain module.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper

from ..models import MetricCounter

# --- dialect questions ----------------------------------------------------------------------


def supports_listen(using: str = DEFAULT_DB_ALIAS) -> bool:
    """Whether the database `using` has LISTEN/NOTIFY (`notify`, `open_listener`): PostgreSQL
    does; SQLite has nothing like it, so its callers poll."""
    return connections[using].vendor == "postgresql"


def ilike_operator(db: BaseDatabaseWrapper) -> str:
    """The case-insensitive LIKE of `db`, for a lookup's `as_sql`: PostgreSQL's ILIKE; SQLite's
    LIKE is case-insensitive for ASCII already (and has no ILIKE)."""
    return "ILIKE" if db.vendor == "postgresql" else "LIKE"


# --- prepared statements (the success path's fixed statements) ---------------------------------
#
# Django's PostgreSQL cursors bind parameters on the client: each statement goes to the server as
# text with its values inlined, and PostgreSQL parses and plans it again every time. For the
# statements of the success path (TI read, outbox INSERT, TI UPDATE, downstream evaluation, run
# UPDATE, nudge read) the planning was most of the backend's CPU: 5.3 ms per 300-outlet success,
# 1.7 ms with these statements prepared (`bench/success_breakdown.py`; the downstream evaluation's
# long CASE alone took about 2 ms to plan; issue 14).
#
# `prepared_cursor()` gives a Django cursor (query logging, execute wrappers and error translation
# as usual) over a psycopg server-side-binding cursor: psycopg prepares a statement on its
# connection after `prepare_threshold` executions of it (the connection's setting,
# DATABASE_PREPARE_THRESHOLD, default 2) and then sends only its name and parameters. Only these
# statements use it: the others keep Django's client-side binding, which has no 65,535-parameter
# limit (the drain and the scheduler send statements with more parameters than that).
# DATABASE_PREPARED_STATEMENTS=False turns it off (a transaction-pooling PgBouncer cannot keep
# prepared statements); on SQLite it is the plain cursor.


class _LoggedCursor(CursorDebugWrapper):
    """Query logging (DEBUG, tests' query counts) of a prepared statement: psycopg sends it by
    name, so Django's "last executed query" is empty; log the statement's text instead."""

    def execute(self, sql, params=None):
        with self.debug_sql(sql, params):
            return CursorWrapper.execute(self, sql, params)


@contextmanager
def prepared_cursor() -> Iterator[CursorWrapper]:
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


# --- health -----------------------------------------------------------------------------------


def select_one() -> bool:
    """`SELECT 1` on the default database: whether it answers (raises when it cannot be reached).

    Raw because it must not touch a table: /healthz asks whether the server answers, before any
    question about the schema."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        return cursor.fetchone() == (1,)


# --- counters (metrics) -----------------------------------------------------------------------


def add_to_counter(*, name: str, shard: int, amount: int) -> None:
    """Add `amount` to one counter shard, creating the row at its first increment: one statement,
    autocommit or in the caller's transaction.

    Raw because the ORM has no upsert with an increment: `update_or_create` is a savepoint, a
    locking SELECT and an UPDATE or INSERT, and two processes creating the same shard race into
    an IntegrityError. `INSERT ... ON CONFLICT DO UPDATE` is one statement on
    PostgreSQL and on SQLite (3.24+) alike."""
    table = MetricCounter._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (name, shard, value) VALUES (%s, %s, %s) "
            f"ON CONFLICT (name, shard) DO UPDATE SET value = {table}.value + excluded.value",
            [name, shard, amount],
        )


# --- locks ------------------------------------------------------------------------------------


def advisory_xact_lock(key: int) -> None:
    """Take PostgreSQL's transaction-scoped advisory lock `key`, waiting for its holder; in the
    caller's transaction (released by its commit or rollback).

    Raw because advisory locks are a PostgreSQL function the ORM does not wrap. SQLite: nothing,
    since it serializes writers itself (IMMEDIATE transactions)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])


# --- broker wake-ups (LISTEN / NOTIFY) ----------------------------------------------------------


def notify(channel: str, *, using: str) -> None:
    """NOTIFY `channel` on the database `using`, delivered when the current transaction commits
    (at once in autocommit). PostgreSQL only (`is_postgresql`): there is no ORM form of it."""
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, '')", [channel])


def open_listener(*channels: str, using: str) -> Any:
    """A new psycopg connection (autocommit, Django's settings for the database `using`) that
    LISTENs on `channels`. PostgreSQL only; psycopg's own connection, never Django's, because
    Django's is closed and reopened between a broker's calls, which would drop the LISTEN."""
    import psycopg

    params = connections[using].get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    conn = psycopg.connect(**params, autocommit=True)
    for channel in channels:
        conn.execute(f'LISTEN "{channel}"')
    return conn


def broker_row_waiting(*, table: str, row_id: int, now: datetime) -> bool:
    """Is the broker row `row_id` of django-q2's ORM broker table `table` still waiting for a
    cluster (its lock time passed, not taken)? One primary-key read, autocommit.

    Raw, with the table name given by the caller: this module does not import django_q (the
    caller does), and the ORM's `filter().exists()` cost a query build on every success."""
    with prepared_cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {table} WHERE id = %s AND lock <= %s", [row_id, now])
        return cursor.fetchone() is not None
