"""Which database errors mean "the database is full or away; retry later" (a 503, not a 500).

Kept apart from `api/errors.py` (which maps them to HTTP) because the logging configuration
imports `QuietDatabaseUnavailable` before the apps are loaded: this module imports only psycopg
and `django.db`.
"""

import logging

import psycopg
from django.db import Error as DjangoDatabaseError
from django.db import InterfaceError

# SQLSTATE classes / codes of a database that cannot take the request now (PostgreSQL
# appendix A): 08 connection exception, 53 insufficient resources (53300 too many connections,
# 53100 disk full), 57P01-57P03 shutting down, crashed, not accepting connections yet.
_BUSY_SQLSTATES = ("53300",)
_UNAVAILABLE_SQLSTATE_PREFIXES = ("08", "53", "57P01", "57P02", "57P03")


def database_unavailable_reason(exc: BaseException | None) -> str | None:
    """`database_busy` (no connection free in time, too many clients), `database_unavailable`
    (unreachable, shutting down, connection lost), or None for any other error."""
    if isinstance(exc, InterfaceError):  # "connection already closed"
        return "database_unavailable"
    if not isinstance(exc, DjangoDatabaseError):
        return None
    cause = exc.__cause__
    if not isinstance(cause, psycopg.OperationalError | psycopg.InterfaceError):
        return None
    if type(cause).__name__ == "PoolTimeout":  # psycopg_pool, imported only with a pool
        return "database_busy"
    sqlstate = cause.sqlstate
    if sqlstate is None:  # failed to connect, or the server closed the connection
        return "database_unavailable"
    if sqlstate in _BUSY_SQLSTATES:
        return "database_busy"
    if sqlstate.startswith(_UNAVAILABLE_SQLSTATE_PREFIXES):
        return "database_unavailable"
    return None


class QuietDatabaseUnavailable(logging.Filter):
    """On `django.request`: a request that failed because the database is full or away is logged
    as one WARNING line, without the traceback Django attaches to a 5xx."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and database_unavailable_reason(record.exc_info[1]):
            record.exc_info = None
            record.exc_text = None
            record.levelno = logging.WARNING
            record.levelname = "WARNING"
        return True
