"""Counters shared by every process (gunicorn workers, django-q2 clusters, commands).

A counter lives in the database, sharded by process so concurrent increments do not queue on one
row. Increments run after the surrounding transaction commits (a rolled-back batch counts
nothing), in their own short statement.
"""

import os

from django.db import transaction
from django.db.models import Sum

from ..models import MetricCounter
from ..sql import connection as connection_sql

SHARDS = 16

# Counter names (exposed on /metrics with an `asset_service_` prefix and `_total` suffix).
ENQUEUED = "outbox_enqueued"
REGISTERED = "outbox_registered"
FAILED_ATTEMPTS = "outbox_failed_attempts"
PARKED = "outbox_parked"
REQUEUED = "outbox_requeued"
EVENTS_WRITTEN = "asset_events_written"
OUTLET_EVENTS_IGNORED = "outlet_events_ignored"
RUNS_TRIGGERED = "dag_runs_triggered"
# Retention (issue 30): rows its cleans deleted, and cleans that failed.
RETENTION_ROWS_DELETED = "retention_rows_deleted"
RETENTION_FAILURES = "retention_failures"
# Queue watchers (issue 28): messages registered (events committed), parked, and redeliveries
# of a message already taken (acknowledged, nothing written).
WATCHER_REGISTERED = "watcher_messages_registered"
WATCHER_PARKED = "watcher_messages_parked"
WATCHER_DUPLICATES = "watcher_messages_duplicate"
COUNTERS = (
    ENQUEUED,
    REGISTERED,
    FAILED_ATTEMPTS,
    PARKED,
    REQUEUED,
    EVENTS_WRITTEN,
    OUTLET_EVENTS_IGNORED,
    RUNS_TRIGGERED,
    RETENTION_ROWS_DELETED,
    RETENTION_FAILURES,
    WATCHER_REGISTERED,
    WATCHER_PARKED,
    WATCHER_DUPLICATES,
)


def _add(name: str, amount: int) -> None:
    connection_sql.add_to_counter(name=name, shard=os.getpid() % SHARDS, amount=amount)


def incr(name: str, amount: int = 1) -> None:
    """Add `amount` to a counter once the current transaction commits (now, outside one)."""
    if amount:
        transaction.on_commit(lambda: _add(name, amount))


def value(name: str) -> int:
    return MetricCounter.objects.filter(name=name).aggregate(total=Sum("value"))["total"] or 0


def values() -> dict[str, int]:
    totals = dict(MetricCounter.objects.values_list("name").annotate(total=Sum("value")).order_by())
    return {name: int(totals.get(name, 0)) for name in COUNTERS}
