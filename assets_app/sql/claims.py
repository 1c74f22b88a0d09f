"""The worker claim's statements (`task_state.claims`, through `locks`): the pool rows a claim
takes from, locked, and the claim itself, one statement whatever the number of pools or TIs.

Airflow's scheduler (`_executable_task_instances_to_queued`) locks every pool row (NOWAIT),
counts each pool's occupied slots (`Pool.slots_stats`: running and queued TIs' `pool_slots`)
and walks the scheduled TIs by priority, skipping those whose pool has too few open slots.
Here a claim is the same in two statements:

1. `lock_claim_pools`: the rows of the pools that claimable TIs' tasks name, FOR NO KEY UPDATE,
   by name (a fixed order, so two claimers cannot deadlock), waiting for a claimer that holds
   one. That wait is the only one a claim has: it serializes claimers of one pool for the
   length of a claim transaction (one claim statement, one UPDATE, three reads), so that each
   counts the slots the one before it took.
2. `claim_task_instances`: a new statement, so a new snapshot (READ COMMITTED) that sees the
   claims committed by whoever held those pool rows before; the counting and the choice are in
   it, the TI rows locked FOR UPDATE SKIP LOCKED.
"""

from collections.abc import Sequence
from datetime import datetime

from django.db import connection

from ..models import DEFAULT_POOL_NAME, DagRun, Pool, Task, TaskInstance
from ..models.dags import DEFAULT_QUEUE

_TI = TaskInstance._meta.db_table
_TASK = Task._meta.db_table
_RUN = DagRun._meta.db_table
_POOL = Pool._meta.db_table

# A TI's task's pool, slots and weight; a TI whose task is gone takes Airflow's defaults.
_TASK_JOIN = f"LEFT JOIN {_TASK} t ON t.dag_id = ti.dag_id AND t.task_id = ti.task_id"
_CLAIMABLE = (
    "ti.state = 'queued' AND (ti.retry_at IS NULL OR ti.retry_at <= %s) "
    "AND (ti.claimed_at IS NULL OR ti.claimed_at < %s)"
)
# Airflow's order: priority weight descending, then the run's logical date (PostgreSQL puts
# Airflow's NULLs last; spelled out for SQLite), then map index; then FIFO.
_ORDER = (
    "{0}weight DESC, {0}logical_date IS NULL, {0}logical_date, {0}map_index, {0}queued_at, {0}id"
)


def _params(now: datetime, expired: datetime) -> list:
    adapt = connection.ops.adapt_datetimefield_value
    return [adapt(now), adapt(expired)]


def _in_queues(queues: Sequence[str]) -> tuple[str, list[str]]:
    """The condition "the TI's task is in one of `queues`" (a TI whose task is gone: in
    Airflow's default queue) and its parameters."""
    placeholders = ", ".join(["%s"] * len(queues))
    return f"COALESCE(t.queue, %s) IN ({placeholders})", [DEFAULT_QUEUE, *queues]


def lock_claim_pools(*, queues: Sequence[str], now: datetime, expired: datetime) -> list[str]:
    """Lock the rows of the pools named by the tasks of claimable TIs (queued, past any retry
    delay, unclaimed or claimed before `expired`, in one of `queues`), by name, waiting for
    another claimer that holds one; return their names. A pool name no pool row has is left
    out: its TIs are never claimed (Airflow's scheduler logs "Tasks using non-existent pool"
    and does not queue them). 1 statement, in the caller's transaction, as its first lock.
    SQLite: no row locks (its IMMEDIATE transactions serialize claimers whole)."""
    if not queues:
        return []
    lock = " FOR NO KEY UPDATE OF p" if connection.vendor == "postgresql" else ""
    in_queues, queue_params = _in_queues(queues)
    text = (
        f"SELECT p.name FROM {_POOL} p WHERE p.name IN (SELECT COALESCE(t.pool, %s) "
        f"FROM {_TI} ti {_TASK_JOIN} WHERE {_CLAIMABLE} AND {in_queues}) ORDER BY p.name{lock}"
    )
    with connection.cursor() as cursor:
        cursor.execute(text, [DEFAULT_POOL_NAME, *_params(now, expired), *queue_params])
        return [name for (name,) in cursor.fetchall()]


def claim_task_instances(
    *, pools: Sequence[str], queues: Sequence[str], limit: int, now: datetime, expired: datetime
) -> list[TaskInstance]:
    """Lock and return up to `limit` claimable TIs of tasks in `queues` and `pools` (whose rows
    the caller locked, `lock_claim_pools`), heaviest first (`_ORDER`), FOR UPDATE SKIP LOCKED,
    such that no pool hands out more slots than it has open. 1 statement, in the caller's
    transaction.

    Open slots, as Airflow's `Pool.slots_stats`: the pool's `slots` (-1: unlimited) less the
    `pool_slots` of its TIs that are running or claimed by a claim that has not expired
    (claimed at or after `expired`: Airflow's `queued`). The TIs are taken in order per pool
    while their running total of `pool_slots` fits the open slots; a TI that needs more slots
    than are open is passed over and lighter ones after it may still go (Airflow's "we can
    execute tasks with lower priority if there's enough room"). Unlike Airflow's loop, a TI
    that fits the open slots alone but not after heavier ones still counts against those
    after it within this statement: they go in the next claim, which passes it over (a
    window sum, not a walk, keeps the statement flat in the number of TIs). A TI another
    transaction holds is skipped after that count, so a claim may take fewer, never more.
    Each TI comes back with `weight` (its task's effective priority weight),
    `claim_pool_slots` and `claim_queue`. Pools are counted across queues, as Airflow's are:
    a TI of another queue holds its pool's slots too."""
    if not pools or not queues:
        return []
    names = ", ".join(["%s"] * len(pools))
    in_queues, queue_params = _in_queues(queues)
    lock = " FOR UPDATE OF ti SKIP LOCKED" if connection.vendor == "postgresql" else ""
    text = f"""
        WITH candidate AS (
            SELECT ti.id, ti.map_index, ti.queued_at, r.logical_date,
                   COALESCE(t.priority_weight_total, 1) AS weight,
                   COALESCE(t.pool, %s) AS pool, COALESCE(t.pool_slots, 1) AS slots,
                   COALESCE(t.queue, %s) AS queue
            FROM {_TI} ti JOIN {_RUN} r ON r.id = ti.dag_run_id {_TASK_JOIN}
            WHERE {_CLAIMABLE} AND COALESCE(t.pool, %s) IN ({names}) AND {in_queues}
        ), occupied AS (
            SELECT COALESCE(t.pool, %s) AS pool, SUM(COALESCE(t.pool_slots, 1)) AS slots
            FROM {_TI} ti {_TASK_JOIN}
            WHERE ti.state = 'running' OR (ti.state = 'queued' AND ti.claimed_at >= %s)
            GROUP BY COALESCE(t.pool, %s)
        ), free AS (
            SELECT p.name,
                   CASE WHEN p.slots = -1 THEN NULL ELSE p.slots - COALESCE(o.slots, 0) END
                   AS open
            FROM {_POOL} p LEFT JOIN occupied o ON o.pool = p.name
            WHERE p.name IN ({names})
        ), ranked AS (
            SELECT c.*, f.open, SUM(
                CASE WHEN f.open IS NULL OR c.slots <= f.open THEN c.slots ELSE 0 END
            ) OVER (
                PARTITION BY c.pool ORDER BY {_ORDER.format("c.")}
                ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW
            ) AS taken
            FROM candidate c JOIN free f ON f.name = c.pool
        )
        SELECT ti.*, k.weight AS weight, k.slots AS claim_pool_slots, k.queue AS claim_queue
        FROM ranked k JOIN {_TI} ti ON ti.id = k.id
        WHERE k.open IS NULL OR (k.slots <= k.open AND k.taken <= k.open)
        ORDER BY {_ORDER.format("k.")}
        LIMIT %s{lock}
    """
    now_, expired_ = _params(now, expired)
    params = [
        *(DEFAULT_POOL_NAME, DEFAULT_QUEUE, now_, expired_, DEFAULT_POOL_NAME, *pools),
        *queue_params,
        *(DEFAULT_POOL_NAME, expired_, DEFAULT_POOL_NAME),
        *pools,
        limit,
    ]
    return list(TaskInstance.objects.raw(text, params))


def pool_slot_counts(*, names: Sequence[str], expired: datetime) -> dict[str, tuple[int, int, int]]:
    """(running, queued, scheduled) slots of each of these pools, as Airflow's `Pool` counts
    them: `pool_slots` of its tasks' TIs running; queued and claimed at or after `expired`
    (Airflow's `queued`); queued and not claimed, or claimed before it (Airflow's
    `scheduled`). 1 statement over the live TIs only (`ti_unfinished`'s states)."""
    if not names:
        return {}
    placeholders = ", ".join(["%s"] * len(names))
    text = f"""
        SELECT COALESCE(t.pool, %s) AS pool,
            SUM(CASE WHEN ti.state = 'running' THEN COALESCE(t.pool_slots, 1) ELSE 0 END),
            SUM(CASE WHEN ti.state = 'queued' AND ti.claimed_at >= %s
                THEN COALESCE(t.pool_slots, 1) ELSE 0 END),
            SUM(CASE WHEN ti.state = 'queued' AND (ti.claimed_at IS NULL OR ti.claimed_at < %s)
                THEN COALESCE(t.pool_slots, 1) ELSE 0 END)
        FROM {_TI} ti {_TASK_JOIN}
        WHERE ti.state IN ('queued', 'running') AND COALESCE(t.pool, %s) IN ({placeholders})
        GROUP BY COALESCE(t.pool, %s)
    """
    adapted = connection.ops.adapt_datetimefield_value(expired)
    params = [DEFAULT_POOL_NAME, adapted, adapted, DEFAULT_POOL_NAME, *names, DEFAULT_POOL_NAME]
    with connection.cursor() as cursor:
        cursor.execute(text, params)
        return {pool: (int(r), int(q), int(s)) for pool, r, q, s in cursor.fetchall()}
