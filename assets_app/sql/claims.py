"""The worker claim's statements (`task_state.claims`, through `locks`): the pool rows a claim
takes from, locked, and the claim itself, one statement whatever the number of pools or TIs.
It applies pools, priority weights, queues and the run and task limits (`max_active_tasks`,
`max_active_tis_per_dag`, `max_active_tis_per_dagrun`).

Airflow's scheduler (`_executable_task_instances_to_queued`) locks every pool row (NOWAIT),
counts each pool's occupied slots (`Pool.slots_stats`: running and queued TIs' `pool_slots`)
and walks the scheduled TIs by priority, skipping those whose pool has too few open slots.
Here a claim is the same in two statements:

1. `lock_claim_pools`: the rows of the pools that the claimable TIs of the Dags it may claim
   from name, FOR NO KEY UPDATE, by name (a fixed order, so two claimers cannot deadlock),
   waiting for a claimer that holds one. That wait is the only one a claim has: it
   serializes claimers of one pool (and so of one Dag) for the length of a claim transaction
   (one claim statement, one UPDATE, three reads), so that each counts the slots and the run
   and task limits the one before it took.
2. `claim_task_instances`: a new statement, so a new snapshot (READ COMMITTED) that sees the
   claims committed by whoever held those pool rows before; the counting and the choice are in
   it, the TI rows locked FOR UPDATE SKIP LOCKED.
"""

from collections.abc import Sequence
from datetime import datetime

from django.db import connection

from ..models import DEFAULT_POOL_NAME, Dag, DagRun, Pool, Task, TaskInstance
from ..models.dags import DEFAULT_QUEUE

_TI = TaskInstance._meta.db_table
_TASK = Task._meta.db_table
_RUN = DagRun._meta.db_table
_DAG = Dag._meta.db_table
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


def _in_queues(queues: Sequence[str], *, alias: str = "t") -> tuple[str, list[str]]:
    """The condition "the TI's task (`alias`) is in one of `queues`" (a TI whose task is gone:
    in Airflow's default queue) and its parameters."""
    placeholders = ", ".join(["%s"] * len(queues))
    return f"COALESCE({alias}.queue, %s) IN ({placeholders})", [DEFAULT_QUEUE, *queues]


def lock_claim_pools(*, queues: Sequence[str], now: datetime, expired: datetime) -> list[str]:
    """Lock the rows of the pools a claim in `queues` may take from, by name, waiting for
    another claimer that holds one; return their names. Those are the pools named by the tasks
    of every claimable TI (queued, past any retry delay, unclaimed or claimed before
    `expired`) of the Dags that have a claimable TI in one of `queues`: of the whole Dag, not
    only of those queues, so that two claimers of different queues that both take TIs of one
    Dag share a pool row and count each other's claims against the Dag's `max_active_tasks`
    and its tasks' `max_active_tis_per_*` (a claimer's own claimable TIs are in its other's
    snapshot until it commits). A pool name no pool row has is left out: its TIs are never
    claimed (Airflow's scheduler logs "Tasks using non-existent pool" and does not queue
    them). 1 statement, in the caller's transaction, as its first lock. SQLite: no row locks
    (its IMMEDIATE transactions serialize claimers whole)."""
    if not queues:
        return []
    lock = " FOR NO KEY UPDATE OF p" if connection.vendor == "postgresql" else ""
    in_queues, queue_params = _in_queues(queues, alias="qt")
    text = (
        f"SELECT p.name FROM {_POOL} p WHERE p.name IN (SELECT COALESCE(t.pool, %s) "
        f"FROM {_TI} ti {_TASK_JOIN} WHERE {_CLAIMABLE} AND ti.dag_id IN ("
        f"SELECT qi.dag_id FROM {_TI} qi LEFT JOIN {_TASK} qt ON qt.dag_id = qi.dag_id "
        f"AND qt.task_id = qi.task_id WHERE {_CLAIMABLE.replace('ti.', 'qi.')} AND {in_queues}"
        f")) ORDER BY p.name{lock}"
    )
    params = [DEFAULT_POOL_NAME, *_params(now, expired), *_params(now, expired), *queue_params]
    with connection.cursor() as cursor:
        cursor.execute(text, params)
        return [name for (name,) in cursor.fetchall()]


def claim_task_instances(
    *, pools: Sequence[str], queues: Sequence[str], limit: int, now: datetime, expired: datetime
) -> list[TaskInstance]:
    """Lock and return up to `limit` claimable TIs of tasks in `queues` and `pools` (whose rows
    the caller locked, `lock_claim_pools`), heaviest first (`_ORDER`), FOR UPDATE SKIP LOCKED,
    such that no pool hands out more slots than it has open and no run, task or task of a run
    holds more claimed and running TIs than its limit. 1 statement, in the caller's
    transaction.

    Limits, as Airflow's `_executable_task_instances_to_queued` applies them, counting TIs
    running or claimed by a claim that has not expired (Airflow's `queued`): a Dag's
    `max_active_tasks` per run, a task's `max_active_tis_per_dag` over all runs and
    `max_active_tis_per_dagrun` per run. A TI whose run or task is at its limit, or whose pool
    has fewer open slots than it needs, is left out first (Airflow's starved sets: it takes
    nothing from the others); the others are ranked per run, per task and per task of a run
    (row numbers) and kept while the count plus their rank fits; their pools' slots are then
    summed in order over those kept.

    Open slots, as Airflow's `Pool.slots_stats`: the pool's `slots` (-1: unlimited) less the
    `pool_slots` of its TIs that are running or claimed by a claim that has not expired
    (claimed at or after `expired`: Airflow's `queued`), and deferred ones when the pool has
    `include_deferred`. Deferred TIs count against the task limits, not against
    `max_active_tasks` (Airflow's `ConcurrencyMap`: "DEFERRED ... holding no worker slot").
    The TIs are taken in order per pool while their running total of `pool_slots` fits the
    open slots; a TI that needs more slots than are open is passed over and lighter ones
    after it may still go (Airflow's "we can execute tasks with lower priority if there's
    enough room"). Unlike Airflow's loop, a TI
    that fits the open slots alone but not after heavier ones still counts against those
    after it within this statement (and a TI kept by the limits but not by its pool counts
    against its run's and task's ranks): they go in the next claim, which passes it over (a
    window sum, not a walk, keeps the statement flat in the number of TIs). The first TI in
    line that could go alone always goes, so each claim makes progress. A TI another
    transaction holds is skipped after that count, so a claim may take fewer, never more.
    Each TI comes back with `weight` (its task's effective priority weight),
    `claim_pool_slots` and `claim_queue`. Pools are counted across queues, as Airflow's are:
    a TI of another queue holds its pool's slots too."""
    if not pools or not queues:
        return []
    names = ", ".join(["%s"] * len(pools))
    in_queues, queue_params = _in_queues(queues)
    lock = " FOR UPDATE OF ti SKIP LOCKED" if connection.vendor == "postgresql" else ""
    order = {alias: _ORDER.format(alias) for alias in ("", "k.")}
    text = f"""
        WITH candidate AS (
            SELECT ti.id, ti.dag_id, ti.run_id, ti.task_id, ti.map_index, ti.queued_at,
                   r.logical_date, COALESCE(t.priority_weight_total, 1) AS weight,
                   COALESCE(t.pool, %s) AS pool, COALESCE(t.pool_slots, 1) AS slots,
                   COALESCE(t.queue, %s) AS queue, d.max_active_tasks AS run_max,
                   t.max_active_tis_per_dag AS task_max,
                   t.max_active_tis_per_dagrun AS run_task_max
            FROM {_TI} ti JOIN {_RUN} r ON r.id = ti.dag_run_id
            JOIN {_DAG} d ON d.dag_id = r.dag_id {_TASK_JOIN}
            WHERE {_CLAIMABLE} AND {in_queues}
        ), live AS (
            SELECT ti.dag_id, ti.run_id, ti.task_id, COALESCE(t.pool, %s) AS pool,
                   COALESCE(t.pool_slots, 1) AS slots, ti.state = 'deferred' AS deferred
            FROM {_TI} ti {_TASK_JOIN}
            WHERE ti.state IN ('running', 'deferred')
               OR (ti.state = 'queued' AND ti.claimed_at >= %s)
        ), free AS MATERIALIZED (
            SELECT p.name, CASE WHEN p.slots = -1 THEN NULL ELSE p.slots - COALESCE(
                (SELECT SUM(l.slots) FROM live l WHERE l.pool = p.name
                 AND (NOT l.deferred OR p.include_deferred)), 0) END AS open
            FROM {_POOL} p WHERE p.name IN ({names})
        ), run_live AS (
            SELECT dag_id, run_id, COUNT(*) AS n FROM live WHERE NOT deferred
            GROUP BY dag_id, run_id
        ), task_live AS (
            SELECT dag_id, task_id, COUNT(*) AS n FROM live GROUP BY dag_id, task_id
        ), run_task_live AS (
            SELECT dag_id, run_id, task_id, COUNT(*) AS n FROM live
            GROUP BY dag_id, run_id, task_id
        ), possible AS (
            SELECT c.*, f.open, COALESCE(rl.n, 0) AS run_n, COALESCE(tl.n, 0) AS task_n,
                   COALESCE(rtl.n, 0) AS run_task_n
            FROM candidate c JOIN free f ON f.name = c.pool
            LEFT JOIN run_live rl ON rl.dag_id = c.dag_id AND rl.run_id = c.run_id
            LEFT JOIN task_live tl ON tl.dag_id = c.dag_id AND tl.task_id = c.task_id
            LEFT JOIN run_task_live rtl ON rtl.dag_id = c.dag_id AND rtl.run_id = c.run_id
                AND rtl.task_id = c.task_id
            WHERE (f.open IS NULL OR c.slots <= f.open) AND COALESCE(rl.n, 0) < c.run_max
              AND (c.task_max IS NULL OR COALESCE(tl.n, 0) < c.task_max)
              AND (c.run_task_max IS NULL OR COALESCE(rtl.n, 0) < c.run_task_max)
        ), counted AS (
            SELECT possible.*,
                ROW_NUMBER() OVER (PARTITION BY dag_id, run_id ORDER BY {order[""]})
                    AS run_rank,
                ROW_NUMBER() OVER (PARTITION BY dag_id, task_id ORDER BY {order[""]})
                    AS task_rank,
                ROW_NUMBER() OVER (PARTITION BY dag_id, run_id, task_id ORDER BY {order[""]})
                    AS run_task_rank
            FROM possible
        ), limited AS (
            SELECT counted.*, SUM(slots) OVER (
                PARTITION BY pool ORDER BY {order[""]}
                ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW
            ) AS taken
            FROM counted
            WHERE run_n + run_rank <= run_max
              AND (task_max IS NULL OR task_n + task_rank <= task_max)
              AND (run_task_max IS NULL OR run_task_n + run_task_rank <= run_task_max)
        )
        SELECT ti.*, k.weight AS weight, k.slots AS claim_pool_slots, k.queue AS claim_queue
        FROM limited k JOIN {_TI} ti ON ti.id = k.id
        WHERE k.open IS NULL OR k.taken <= k.open
        ORDER BY {order["k."]}
        LIMIT %s{lock}
    """
    now_, expired_ = _params(now, expired)
    params = [
        *(DEFAULT_POOL_NAME, DEFAULT_QUEUE, now_, expired_),
        *queue_params,
        *(DEFAULT_POOL_NAME, expired_),
        *pools,
        limit,
    ]
    return list(TaskInstance.objects.raw(text, params))


def pool_slot_counts(
    *, names: Sequence[str], expired: datetime
) -> dict[str, tuple[int, int, int, int]]:
    """(running, queued, scheduled, deferred) slots of each of these pools, as Airflow's `Pool`
    counts them: `pool_slots` of its tasks' TIs running; queued and claimed at or after
    `expired` (Airflow's `queued`); queued and not claimed, or claimed before it (Airflow's
    `scheduled`); deferred. 1 statement over the live TIs only (`ti_unfinished`'s states)."""
    if not names:
        return {}
    placeholders = ", ".join(["%s"] * len(names))
    text = f"""
        SELECT COALESCE(t.pool, %s) AS pool,
            SUM(CASE WHEN ti.state = 'running' THEN COALESCE(t.pool_slots, 1) ELSE 0 END),
            SUM(CASE WHEN ti.state = 'queued' AND ti.claimed_at >= %s
                THEN COALESCE(t.pool_slots, 1) ELSE 0 END),
            SUM(CASE WHEN ti.state = 'queued' AND (ti.claimed_at IS NULL OR ti.claimed_at < %s)
                THEN COALESCE(t.pool_slots, 1) ELSE 0 END),
            SUM(CASE WHEN ti.state = 'deferred' THEN COALESCE(t.pool_slots, 1) ELSE 0 END)
        FROM {_TI} ti {_TASK_JOIN}
        WHERE ti.state IN ('queued', 'running', 'deferred')
          AND COALESCE(t.pool, %s) IN ({placeholders})
        GROUP BY COALESCE(t.pool, %s)
    """
    adapted = connection.ops.adapt_datetimefield_value(expired)
    params = [DEFAULT_POOL_NAME, adapted, adapted, DEFAULT_POOL_NAME, *names, DEFAULT_POOL_NAME]
    with connection.cursor() as cursor:
        cursor.execute(text, params)
        return {pool: (int(r), int(q), int(s), int(d)) for pool, r, q, s, d in cursor.fetchall()}
