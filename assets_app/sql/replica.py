"""The read replica (issue 46): which reads may go to the `replica` alias, and whether it may
take them now.

A read goes to the replica only inside `reads()` (the replica middleware opens it for the
console's list pages, the lineage, the grid and the public API's GETs), never inside a
transaction, never after a write of the same request (`note_write`), never for a session that
wrote within DATABASE_REPLICA_PIN_SECONDS (the pin cookie), and only while the standby answers
with a lag at most DATABASE_REPLICA_MAX_LAG_SECONDS. Everything else (the worker API, the drain,
the schedulers, commands, every lock) never opens the scope, so it reads the primary. A standby
that fails is marked down for DATABASE_REPLICA_RETRY_SECONDS: one error, then the primary.
"""

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

from django.conf import settings
from django.db import DatabaseError, connections

logger = logging.getLogger(__name__)

PRIMARY = "default"
REPLICA = "replica"
# Set on the answer to a write (the console's forms, the public API's POST/PATCH/DELETE): the
# epoch second until which this client's reads stay on the primary (read-your-writes).
PIN_COOKIE = "ae_primary_until"

# Read on the primary even in a replica scope: who is asking and what they may do (a revoked
# token or permission takes effect at once; a session just logged in exists at once).
PRIMARY_ONLY_APPS = frozenset({"auth", "sessions", "contenttypes", "admin"})
PRIMARY_ONLY_MODELS = frozenset({"assets_app.ApiToken", "assets_app.RevokedToken"})

# On the standby: seconds since the last replayed commit, 0 when everything received is
# replayed while the WAL receiver runs (an idle primary is not "lag"); NULL when nothing was
# replayed yet. Not a standby (pg_is_in_recovery() false): 0.
LAG_SQL = """
SELECT CASE
    WHEN NOT pg_is_in_recovery() THEN 0
    WHEN EXISTS (SELECT 1 FROM pg_stat_wal_receiver)
         AND pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0
    ELSE EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp())
END
"""

T = TypeVar("T")


@dataclass
class _Scope:
    pinned: bool = False
    used: bool = False


_scope: ContextVar[_Scope | None] = ContextVar("replica_scope", default=None)


@dataclass(frozen=True)
class Status:
    """The replica as this process last saw it."""

    configured: bool
    reachable: bool
    lag_seconds: float | None
    max_lag_seconds: float
    error: str = ""

    @property
    def usable(self) -> bool:
        return (
            self.configured
            and self.reachable
            and self.lag_seconds is not None
            and self.lag_seconds <= self.max_lag_seconds
        )

    @property
    def state(self) -> str:
        """`off`, `ok`, `lagging` (reads on the primary) or `unreachable` (the same)."""
        if not self.configured:
            return "off"
        if not self.reachable:
            return "unreachable"
        return "ok" if self.usable else "lagging"


# Per process: (monotonic time checked, Status). A down standby is looked at again only after
# DATABASE_REPLICA_RETRY_SECONDS, a working one after DATABASE_REPLICA_CHECK_SECONDS.
_checked: tuple[float, Status] | None = None


def configured() -> bool:
    return REPLICA in connections.settings


def read_alias(model: Any) -> str | None:
    """The router's `db_for_read`: the replica inside a usable, unpinned scope, outside any
    transaction, for a model that may be read late; else None (the primary)."""
    scope = _scope.get()
    if scope is None or scope.pinned or _primary_only(model):
        return None
    if connections[PRIMARY].in_atomic_block:
        return None
    scope.used = True
    return REPLICA


def note_write(model: Any) -> None:
    """The router's `db_for_write`: the rest of this request reads the primary. Not for a write
    of who is asking (a token's last use, a session), which is always read on the primary."""
    scope = _scope.get()
    if scope is not None and not _primary_only(model):
        scope.pinned = True


def _primary_only(model: Any) -> bool:
    meta = model._meta
    return meta.app_label in PRIMARY_ONLY_APPS or meta.label in PRIMARY_ONLY_MODELS


def pinned_by_cookie(value: str | None, *, now: float | None = None) -> bool:
    """True while the pin cookie's time is in the future (a bad value pins nothing)."""
    try:
        until = float(value) if value else 0.0
    except ValueError:
        return False
    return until > (time.time() if now is None else now)


def pin_cookie_value(*, now: float | None = None) -> tuple[str, int]:
    """The pin cookie after a write: (value, max_age seconds)."""
    seconds = settings.DATABASE_REPLICA_PIN_SECONDS
    until = (time.time() if now is None else now) + seconds
    return f"{until:.3f}", max(int(seconds + 0.999), 1)


def status(*, refresh: bool = False) -> Status:
    """The replica's lag as this process knows it; asks the standby (one statement) when the
    last look is older than its interval. Never raises: a failure is `unreachable`."""
    global _checked
    max_lag = settings.DATABASE_REPLICA_MAX_LAG_SECONDS
    if not configured():
        return Status(configured=False, reachable=False, lag_seconds=None, max_lag_seconds=max_lag)
    now = time.monotonic()
    if _checked is not None and not refresh:
        at, seen = _checked
        interval = (
            settings.DATABASE_REPLICA_CHECK_SECONDS
            if seen.reachable
            else settings.DATABASE_REPLICA_RETRY_SECONDS
        )
        if now - at < interval:
            return Status(
                configured=True,
                reachable=seen.reachable,
                lag_seconds=seen.lag_seconds,
                max_lag_seconds=max_lag,
                error=seen.error,
            )
    try:
        with connections[REPLICA].cursor() as cursor:
            cursor.execute(LAG_SQL)
            (lag,) = cursor.fetchone()
        seen = Status(
            configured=True,
            reachable=True,
            lag_seconds=None if lag is None else max(float(lag), 0.0),
            max_lag_seconds=max_lag,
        )
    except DatabaseError as exc:
        seen = _down(exc)
        _close_replica()
    _checked = (time.monotonic(), seen)
    return seen


def mark_down(exc: BaseException) -> None:
    """The standby failed a statement: reads go to the primary until the retry interval ends."""
    global _checked
    _checked = (time.monotonic(), _down(exc))


def forget() -> None:
    """Forget the last look (tests; a replica added or removed at run time)."""
    global _checked
    _checked = None


def _down(exc: BaseException) -> Status:
    logger.warning("read replica unreachable, reads on the primary: %s", exc)
    return Status(
        configured=True,
        reachable=False,
        lag_seconds=None,
        max_lag_seconds=settings.DATABASE_REPLICA_MAX_LAG_SECONDS,
        error=str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
    )


def run_reads(call: Callable[[], T], *, pinned: bool) -> T:
    """Runs `call` (a read-only view and its rendering) with its reads on the replica when the
    replica is usable and the client is not pinned. If the replica fails during it (connecting
    or a statement: Django's `errors_occurred` on the alias, whether the view raised or turned
    the error into a 503), marks it down and runs `call` again on the primary: a read-only call
    is safe to repeat."""
    if pinned or not configured() or not status().usable:
        return call()
    connection = connections[REPLICA]
    connection.errors_occurred = False
    error: BaseException | None = None
    with _reads() as scope:
        try:
            result = call()
        except Exception as exc:
            if not (scope.used and connection.errors_occurred):
                raise
            error = exc
        else:
            if not (scope.used and connection.errors_occurred):
                return result
    mark_down(error or DatabaseError("a statement failed on the read replica"))
    _close_replica()
    return call()


def _close_replica() -> None:
    with suppress(DatabaseError):
        connections[REPLICA].close()


@contextmanager
def _reads() -> Iterator[_Scope]:
    scope = _Scope()
    token = _scope.set(scope)
    try:
        yield scope
    finally:
        _scope.reset(token)
