"""Wake-ups of the timers process (issue 41): the PostgreSQL NOTIFY channels its loops LISTEN on,
and the statements that send them.

A timer (`assets_app/timers/`) sleeps until its next due time, which it reads from the database;
what can make something due sooner than that is written by another process, which then wakes it
on one of these channels. NOTIFY is transactional: sent by a transaction, it is delivered when
that transaction commits (never if it rolls back), so a woken timer always sees the rows that
woke it. Several notifications of one channel in one transaction are delivered once.

- `TIME`: a Dag's timetable or pause changed (a sync, a pause or unpause), a run of a Dag with a
  timetable (or of a backfill) finished and freed a `max_active_runs` slot, a backfill changed;
- `WEBHOOKS`: webhook messages were written, or made due again (a replay, an endpoint resumed);
- `FRESHNESS`: a freshness policy was set or removed, or an event was registered for an asset
  whose policy is late (it may be fresh again);
- `TIMEOUTS`: a run of a Dag with a `dagrun_timeout` started, or a sync changed a Dag's
  `dagrun_timeout` (issue 39);
- `TRIGGERS`: a TI deferred with a trigger timeout, or a deferred TI resumed (its trigger is
  unused: the trigger timer deletes it) (issue 42).

SQLite (the demo): no NOTIFY; the timers poll there.
"""

from django.db import connection

from ..models import FreshnessPolicy, FreshnessState

TIME = "asset_events_time"
WEBHOOKS = "asset_events_webhooks"
FRESHNESS = "asset_events_freshness"
TIMEOUTS = "asset_events_timeouts"
TRIGGERS = "asset_events_triggers"
CHANNELS = (TIME, WEBHOOKS, FRESHNESS, TIMEOUTS, TRIGGERS)


def supported() -> bool:
    return connection.vendor == "postgresql"


def wake(*channels: str) -> None:
    """NOTIFY each of `channels`, delivered when the caller's transaction commits (at once in
    autocommit). 1 statement; nothing on SQLite."""
    if supported() and channels:
        notify = ", ".join(["pg_notify(%s, '')"] * len(channels))
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {notify}", list(channels))


def wake_sql(channel: str, *, if_rows_in: str) -> str:
    """A scalar subquery that NOTIFYs `channel` once when the CTE (or table expression)
    `if_rows_in` has a row: put in the select list of the statement that writes those rows, it
    costs no statement of its own. `channel` is one of this module's constants."""
    assert channel in CHANNELS
    return f"(SELECT count(pg_notify('{channel}', '')) FROM (SELECT 1 FROM {if_rows_in} LIMIT 1) w)"


def late_assets_wake_sql(*, asset_ids_param: str = "%s") -> str:
    """A scalar subquery that NOTIFYs `FRESHNESS` once if a late freshness policy watches one of
    the assets of the array parameter (its events may make it fresh): for the statement a
    registration runs before it inserts events (`registration_sql.announce_events`). Its
    parameters: the array of asset ids."""
    return (
        f"(SELECT count(pg_notify('{FRESHNESS}', '')) FROM (SELECT 1 FROM "
        f"{FreshnessPolicy._meta.db_table} WHERE state = '{FreshnessState.LATE.value}' "
        f"AND asset_id = ANY({asset_ids_param}) LIMIT 1) late)"
    )
