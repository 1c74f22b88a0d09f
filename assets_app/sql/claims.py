"""The worker claim's statements (`task_state.claims`, through `locks`): the pool rows a claim
takes from, locked, and the claim itself, one statement whatever the number of pools, over a
bounded window of candidates whatever the backlog of queued TIs. It applies pools, priority
weights, queues and the run and task limits (`max_active_tasks`, `max_active_tis_per_dag`,
`max_active_tis_per_dagrun`).

Airflow's scheduler (`_executable_task_instances_to_queued`) locks every pool row (NOWAIT),
counts each pool's occupied slots (`Pool.slots_stats`: running and queued TIs' `pool_slots`)
and walks the scheduled TIs by priority, at most `max_tis` at a time after filtering out the
starved pools, Dags and tasks, skipping those whose pool has too few open slots, and queries
again while it found new starved ones. Here a claim is the same in two statements:

1. `lock_claim_pools`: the rows of the pools that the claimable TIs of the Dags it may claim
   from name, FOR NO KEY UPDATE, by name (a fixed order, so two claimers cannot deadlock),
   waiting for a claimer that holds one. That wait is the only one a claim has: it
   serializes claimers of one pool (and so of one Dag) for the length of a claim transaction
   (one claim statement, one UPDATE, three reads), so that each counts the slots and the run
   and task limits the one before it took.
2. `claim_task_instances`: a new statement, so a new snapshot (READ COMMITTED) that sees the
   claims committed by whoever held those pool rows before; the counting and the choice are in
   it, among the first `candidate_window(limit)` claimable TIs that are not starved, the TI
   rows locked FOR UPDATE SKIP LOCKED. The caller runs it again (after stamping what it
   claimed) only when it came back short with its window full.

Cost: the live TIs (running, deferred, or claimed by a claim that has not expired) are read
through partial indexes (`ti_running_heartbeat`, `ti_deferred_timeout`, `ti_queued_claimed`);
the claimable TIs are read once per statement, filtered and kept in a top-N heap of the
window's size (no sort, window or count over the backlog). That one pass stays: the order's
keys live in three tables (the task's weight, the run's logical date, the TI's map index), so
no index of the TI table alone can hand them over in order.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import connection

from ..models import DEFAULT_POOL_NAME, Dag, DagRun, Pool, Task, TaskInstance, WorkerBundle
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
# No TI of a paused Dag is claimed until the unpause, as Airflow 3.3.2's scheduler starts only
# queued runs of unpaused Dags (`DagRun.get_queued_dag_runs_to_set_running`) and queues only
# their scheduled TIs (`_executable_task_instances_to_queued`: `~DM.is_paused`). A claimed TI
# (Airflow's queued, at the executor) goes on. A run triggered or cleared while its Dag is
# paused so stays queued (its first started TI is what starts a run here).
_DAG_UNPAUSED = f"NOT EXISTS (SELECT 1 FROM {_DAG} pd WHERE pd.dag_id = ti.dag_id AND pd.is_paused)"


def _dag_claimable(bundles: Sequence[str] | None) -> tuple[str, list[str]]:
    """The condition on a candidate's Dag and its parameters: unpaused (`_DAG_UNPAUSED`) and,
    for a claimer that names the Dag bundles it serves, synced from one of them (a Dag of
    another bundle, a JSON definition or a TI whose Dag is gone is never claimed by it: its
    worker could not load the file). One lookup by the Dag's primary key either way."""
    if bundles is None:
        return _DAG_UNPAUSED, []
    placeholders = ", ".join(["%s"] * len(bundles))
    return (
        f"EXISTS (SELECT 1 FROM {_DAG} bd WHERE bd.dag_id = ti.dag_id AND NOT bd.is_paused "
        f"AND bd.bundle_name IN ({placeholders}))",
        list(bundles),
    )


# Airflow's order: priority weight descending, then the run's logical date (PostgreSQL puts
# Airflow's NULLs last; spelled out for SQLite), then map index; then FIFO.
_ORDER = (
    "{0}weight DESC, {0}logical_date IS NULL, {0}logical_date, {0}map_index, {0}queued_at, {0}id"
)


# A claim statement examines the first 2 x limit + CANDIDATE_SLACK claimable TIs that are not
# starved (`candidate_window`): room for those its window's run and task ranks leave out.
CANDIDATE_SLACK = 16


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
    in_queues, queue_params = _in_queues(queues)
    # One pass over the claimable TIs, down to their (Dag, task) pairs before any join.
    text = f"""
        WITH named AS MATERIALIZED (
            SELECT c.dag_id, COALESCE(t.pool, %s) AS pool, {in_queues} AS in_queues
            FROM (SELECT ti.dag_id, ti.task_id FROM {_TI} ti WHERE {_CLAIMABLE}
                  GROUP BY ti.dag_id, ti.task_id) c
            LEFT JOIN {_TASK} t ON t.dag_id = c.dag_id AND t.task_id = c.task_id
        )
        SELECT p.name FROM {_POOL} p WHERE p.name IN (
            SELECT pool FROM named WHERE dag_id IN (SELECT dag_id FROM named WHERE in_queues)
        ) ORDER BY p.name{lock}
    """
    params = [DEFAULT_POOL_NAME, *queue_params, *_params(now, expired)]
    with connection.cursor() as cursor:
        cursor.execute(text, params)
        return [name for (name,) in cursor.fetchall()]


@dataclass(frozen=True)
class ClaimedBatch:
    """The TIs one claim statement locked, and whether its candidate window was full (more
    candidates may wait behind it: `claim_task_instances`)."""

    tis: list[TaskInstance]
    window_full: bool


def candidate_window(limit: int) -> int:
    """How many candidates one claim statement examines for a claim of `limit` TIs: its
    bounded set (Airflow's `max_tis` of `_executable_task_instances_to_queued`)."""
    return 2 * limit + CANDIDATE_SLACK


def claim_task_instances(
    *,
    pools: Sequence[str],
    queues: Sequence[str],
    limit: int,
    now: datetime,
    expired: datetime,
    bundles: Sequence[str] | None = None,
) -> ClaimedBatch:
    """Lock and return up to `limit` claimable TIs of tasks in `queues` and `pools` (whose rows
    the caller locked, `lock_claim_pools`), heaviest first (`_ORDER`), FOR UPDATE SKIP LOCKED,
    such that no pool hands out more slots than it has open and no run, task or task of a run
    holds more claimed and running TIs than its limit; with `bundles`, only TIs of Dags synced
    from one of those Dag bundles (`_dag_claimable`). 1 statement, in the caller's
    transaction; the caller repeats it, after stamping the TIs it returned as claimed, while
    it returns some, fewer than asked and `window_full` (`task_state.claims`).

    The statement examines a bounded set, as Airflow's `_executable_task_instances_to_queued`
    does (`.limit(max_tis)` after its starvation filters, then its loop): the first
    `candidate_window(limit)` claimable TIs in order that are not starved, so its sorting and
    counting do not grow with the backlog of queued TIs. Starved, as Airflow's
    `starved_pools`, `starved_dags`, `starved_tasks` and
    `starved_tasks_task_dagrun_concurrency`, counted in the statement itself: a TI whose run
    is at the Dag's `max_active_tasks`, whose task is at its `max_active_tis_per_dag` or
    `max_active_tis_per_dagrun`, or whose pool has fewer open slots than it needs. A starved TI
    never takes a place in the window, so a TI behind any number of starved ones is examined
    (and the first one examined always fits: each statement with a candidate makes progress).

    Within the window the candidates are ranked per run, per task and per task of a run (row
    numbers) and kept while the count plus their rank fits; their pools' slots are then summed
    in order over those kept. A TI that needs more slots than are open is passed over and
    lighter ones after it may still go (Airflow's "we can execute tasks with lower priority if
    there's enough room"). Unlike Airflow's loop, a TI that fits the open slots alone but not
    after heavier ones still counts against those after it within this statement (and a TI
    kept by the limits but not by its pool counts against its run's and task's ranks): the
    next statement, which counts this one's claims, passes it over (a window sum, not a
    walk). A TI another transaction holds is skipped after that count, so a statement may
    take fewer, never more.

    Open slots, as Airflow's `Pool.slots_stats`: the pool's `slots` (-1: unlimited) less the
    `pool_slots` of its TIs that are running or claimed by a claim that has not expired
    (claimed at or after `expired`: Airflow's `queued`), and deferred ones when the pool has
    `include_deferred`. Deferred TIs count against the task limits, not against
    `max_active_tasks` (Airflow's `ConcurrencyMap`: "DEFERRED ... holding no worker slot");
    so do TIs awaiting input (Human-in-the-loop), which never count against a pool (Airflow's
    `ACTIVE_STATES`).
    Each TI comes back with `weight` (its
    task's effective priority weight), `claim_pool_slots` and `claim_queue`. Pools are counted
    across queues, as Airflow's are: a TI of another queue holds its pool's slots too."""
    if not pools or not queues or limit < 1 or (bundles is not None and not bundles):
        return ClaimedBatch(tis=[], window_full=False)
    dag_claimable, bundle_params = _dag_claimable(bundles)
    names = ", ".join(["%s"] * len(pools))
    queue_names = ", ".join(["%s"] * len(queues))
    # A TI whose task is gone is in the default queue and pool. The task's columns are
    # compared bare (not COALESCEd) so that the planner sees their statistics and hashes.
    gone_queue = "TRUE" if DEFAULT_QUEUE in queues else "FALSE"
    gone_pool = "TRUE" if DEFAULT_POOL_NAME in pools else "FALSE"
    lock = " FOR UPDATE OF ti SKIP LOCKED" if connection.vendor == "postgresql" else ""
    order = {alias: _ORDER.format(alias) for alias in ("", "c.", "k.")}
    window = candidate_window(limit)
    text = f"""
        WITH live AS MATERIALIZED (
            SELECT ti.dag_id, ti.dag_run_id, ti.task_id, COALESCE(t.pool, %s) AS pool,
                   COALESCE(t.pool_slots, 1) AS slots, ti.state = 'deferred' AS deferred,
                   ti.state = 'awaiting_input' AS awaiting
            FROM {_TI} ti {_TASK_JOIN}
            WHERE ti.state IN ('running', 'deferred', 'awaiting_input')
               OR (ti.state = 'queued' AND ti.claimed_at >= %s)
        ), free AS MATERIALIZED (
            SELECT p.name, CASE WHEN p.slots = -1 THEN NULL ELSE p.slots - COALESCE(
                (SELECT SUM(l.slots) FROM live l WHERE l.pool = p.name AND NOT l.awaiting
                 AND (NOT l.deferred OR p.include_deferred)), 0) END AS open
            FROM {_POOL} p WHERE p.name IN ({names})
        ), run_live AS MATERIALIZED (
            SELECT dag_id, dag_run_id, COUNT(*) AS n FROM live
            WHERE NOT deferred AND NOT awaiting
            GROUP BY dag_id, dag_run_id
        ), task_live AS MATERIALIZED (
            SELECT dag_id, task_id, COUNT(*) AS n FROM live GROUP BY dag_id, task_id
        ), run_task_live AS MATERIALIZED (
            SELECT dag_id, dag_run_id, task_id, COUNT(*) AS n FROM live
            GROUP BY dag_id, dag_run_id, task_id
        ), starved_run AS MATERIALIZED (
            SELECT rl.dag_run_id FROM run_live rl JOIN {_DAG} d ON d.dag_id = rl.dag_id
            WHERE rl.n >= d.max_active_tasks
        ), starved_task AS MATERIALIZED (
            SELECT tl.dag_id, tl.task_id FROM task_live tl
            JOIN {_TASK} t ON t.dag_id = tl.dag_id AND t.task_id = tl.task_id
            WHERE tl.n >= t.max_active_tis_per_dag
        ), starved_run_task AS MATERIALIZED (
            SELECT rtl.dag_run_id, rtl.task_id FROM run_task_live rtl
            JOIN {_TASK} t ON t.dag_id = rtl.dag_id AND t.task_id = rtl.task_id
            WHERE rtl.n >= t.max_active_tis_per_dagrun
        ), candidate AS MATERIALIZED (
            SELECT * FROM (
                SELECT ti.id, ti.dag_id, ti.dag_run_id, ti.task_id, ti.map_index, ti.queued_at,
                       r.logical_date, COALESCE(t.priority_weight_total, 1) AS weight,
                       COALESCE(t.pool, %s) AS pool, COALESCE(t.pool_slots, 1) AS slots,
                       COALESCE(t.queue, %s) AS queue, t.max_active_tis_per_dag AS task_max,
                       t.max_active_tis_per_dagrun AS run_task_max
                FROM {_TI} ti JOIN {_RUN} r ON r.id = ti.dag_run_id {_TASK_JOIN}
                WHERE {_CLAIMABLE} AND {dag_claimable}
                  AND (t.queue IN ({queue_names}) OR (t.task_id IS NULL AND {gone_queue}))
                  AND (t.pool IN ({names}) OR (t.task_id IS NULL AND {gone_pool}))
                  AND NOT EXISTS (SELECT 1 FROM free f WHERE f.name = COALESCE(t.pool, %s)
                      AND f.open < COALESCE(t.pool_slots, 1))
                  AND NOT EXISTS (SELECT 1 FROM starved_run s WHERE s.dag_run_id = ti.dag_run_id)
                  AND NOT EXISTS (SELECT 1 FROM starved_task s
                      WHERE s.dag_id = ti.dag_id AND s.task_id = ti.task_id)
                  AND NOT EXISTS (SELECT 1 FROM starved_run_task s
                      WHERE s.dag_run_id = ti.dag_run_id AND s.task_id = ti.task_id)
            ) c
            ORDER BY {order[""]}
            LIMIT %s
        ), counted AS (
            SELECT c.*, f.open, d.max_active_tasks AS run_max, COALESCE(rl.n, 0) AS run_n,
                COALESCE(tl.n, 0) AS task_n, COALESCE(rtl.n, 0) AS run_task_n,
                ROW_NUMBER() OVER (PARTITION BY c.dag_run_id ORDER BY {order["c."]})
                    AS run_rank,
                ROW_NUMBER() OVER (PARTITION BY c.dag_id, c.task_id ORDER BY {order["c."]})
                    AS task_rank,
                ROW_NUMBER() OVER (PARTITION BY c.dag_run_id, c.task_id ORDER BY {order["c."]})
                    AS run_task_rank
            FROM candidate c JOIN free f ON f.name = c.pool
            JOIN {_DAG} d ON d.dag_id = c.dag_id
            LEFT JOIN run_live rl ON rl.dag_run_id = c.dag_run_id
            LEFT JOIN task_live tl ON tl.dag_id = c.dag_id AND tl.task_id = c.task_id
            LEFT JOIN run_task_live rtl ON rtl.dag_run_id = c.dag_run_id
                AND rtl.task_id = c.task_id
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
        SELECT ti.*, k.weight AS weight, k.slots AS claim_pool_slots, k.queue AS claim_queue,
               (SELECT COUNT(*) FROM candidate) AS claim_window
        FROM limited k JOIN {_TI} ti ON ti.id = k.id
        WHERE k.open IS NULL OR k.taken <= k.open
        ORDER BY {order["k."]}
        LIMIT %s{lock}
    """
    now_, expired_ = _params(now, expired)
    params = [
        *(DEFAULT_POOL_NAME, expired_),
        *pools,
        *(DEFAULT_POOL_NAME, DEFAULT_QUEUE, now_, expired_),
        *bundle_params,
        *queues,
        *pools,
        DEFAULT_POOL_NAME,
        window,
        limit,
    ]
    tis = list(TaskInstance.objects.raw(text, params))
    full = bool(tis) and tis[0].claim_window >= window  # type: ignore[attr-defined]
    return ClaimedBatch(tis=tis, window_full=full)


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


def record_worker_bundles(
    *, hostname: str, bundles: Sequence[str], now: datetime, unless_since: datetime
) -> None:
    """Stamp each of `bundles` as claimed for by `hostname` at `now`, writing a bundle's row only
    when it is new or was last stamped before `unless_since` (idle workers poll every second:
    one write per bundle per interval, whatever the number of workers). 1 statement, INSERT ...
    ON CONFLICT DO UPDATE ... WHERE (PostgreSQL and SQLite alike)."""
    names = sorted(set(bundles))
    if not names:
        return
    adapt = connection.ops.adapt_datetimefield_value
    table = WorkerBundle._meta.db_table
    rows = ", ".join(["(%s, %s, %s)"] * len(names))
    params: list = []
    for name in names:
        params += [name, adapt(now), hostname]
    text = f"""
        INSERT INTO {table} (bundle_name, last_claim_at, last_hostname) VALUES {rows}
        ON CONFLICT (bundle_name) DO UPDATE
        SET last_claim_at = excluded.last_claim_at, last_hostname = excluded.last_hostname
        WHERE {table}.last_claim_at < %s
    """
    with connection.cursor() as cursor:
        cursor.execute(text, [*params, adapt(unless_since)])
