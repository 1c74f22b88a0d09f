"""The triggerer's statements (`task_state.deferral`, through `locks`; issue 42): claiming
live triggers under a lease, renewing the leases a triggerer still holds, and deleting the
triggers no deferred TI waits for (Airflow's `Trigger.clean_unused`).

A trigger is live while a TI in `deferred` points at it (`task_instance.trigger_id`, as in
Airflow) and its trigger timeout has not passed. A triggerer holds it until `lease_until`;
after that any triggerer may claim it again (a triggerer that died loses nothing).
"""

from collections.abc import Sequence
from datetime import datetime

from django.db import connection

from ..models import TaskInstance, Trigger

_TRIGGER = Trigger._meta.db_table
_TI = TaskInstance._meta.db_table

_LIVE = (
    f"EXISTS (SELECT 1 FROM {_TI} ti WHERE ti.trigger_id = tr.id AND ti.state = 'deferred' "
    "AND (ti.trigger_timeout IS NULL OR ti.trigger_timeout > %s))"
)


def _at(value: datetime):
    return connection.ops.adapt_datetimefield_value(value)


def claim_triggers(
    *,
    triggerer: str,
    limit: int,
    queues: Sequence[str] | None,
    now: datetime,
    lease_until: datetime,
) -> list[int]:
    """Lease up to `limit` live triggers that nobody holds (never leased, or leased until
    before `now`), oldest first, to `triggerer` until `lease_until`: FOR UPDATE SKIP LOCKED,
    so two triggerers never take the same one and neither waits. `queues`: only triggers of
    those queues (Airflow's `ids_for_triggerer` with `[triggerer] queues_enabled`); None: any.
    Their ids. 1 statement, in the caller's transaction."""
    in_queues, queue_params = "", []
    if queues is not None:
        if not queues:
            return []
        in_queues = f" AND tr.queue IN ({', '.join(['%s'] * len(queues))})"
        queue_params = list(queues)
    lock = " FOR UPDATE OF tr SKIP LOCKED" if connection.vendor == "postgresql" else ""
    text = (
        f"WITH claimable AS (SELECT tr.id FROM {_TRIGGER} tr WHERE {_LIVE} "
        f"AND (tr.lease_until IS NULL OR tr.lease_until < %s){in_queues} "
        f"ORDER BY tr.id LIMIT %s{lock}) "
        f"UPDATE {_TRIGGER} SET claimed_by = %s, lease_until = %s "
        f"WHERE id IN (SELECT id FROM claimable) RETURNING id"
    )
    params = [_at(now), _at(now), *queue_params, limit, triggerer, _at(lease_until)]
    with connection.cursor() as cursor:
        cursor.execute(text, params)
        return sorted(row[0] for row in cursor.fetchall())


def renew_leases(
    *, triggerer: str, ids: Sequence[int], now: datetime, lease_until: datetime
) -> list[int]:
    """Extend `triggerer`'s lease on those of `ids` it still holds and that are still live;
    their ids (the others it must stop running: fired, timed out, their TI moved on, or
    claimed by another triggerer after its lease ended). 1 statement, no explicit lock (the
    UPDATE waits for a claimer holding one of these rows, then re-checks the holder)."""
    if not ids:
        return []
    text = (
        f"UPDATE {_TRIGGER} tr SET lease_until = %s WHERE tr.id IN "
        f"({', '.join(['%s'] * len(ids))}) AND tr.claimed_by = %s AND {_LIVE} RETURNING tr.id"
    )
    params = [_at(lease_until), *ids, triggerer, _at(now)]
    with connection.cursor() as cursor:
        cursor.execute(text, params)
        return sorted(row[0] for row in cursor.fetchall())


def delete_unused_triggers(*, limit: int) -> int:
    """Delete up to `limit` triggers no TI points at (Airflow's `Trigger.clean_unused`): a
    trigger whose event, failure or timeout resumed its TI, or whose TI was deleted. A trigger
    being inserted with its deferral is not visible here until that commits, and then its TI
    points at it. A trigger a claim holds is skipped (FOR UPDATE SKIP LOCKED, as Airflow's),
    never waited for. 1 statement."""
    lock = " FOR UPDATE OF tr SKIP LOCKED" if connection.vendor == "postgresql" else ""
    text = (
        f"DELETE FROM {_TRIGGER} WHERE id IN (SELECT tr.id FROM {_TRIGGER} tr WHERE NOT EXISTS "
        f"(SELECT 1 FROM {_TI} ti WHERE ti.trigger_id = tr.id) ORDER BY tr.id LIMIT %s{lock})"
    )
    with connection.cursor() as cursor:
        cursor.execute(text, [limit])
        return cursor.rowcount
