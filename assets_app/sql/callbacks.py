"""Dag callback requests' statements (issue 39): the request a run's finish writes
(`scheduling.dependencies.finish_run_if_done`, `scheduling.timeouts`), and the lease claim of
`bin/airflow-worker` (`task_state.dag_callbacks`, through `locks`).

A request is written only for a Dag that has the callback of the run's new state
(`Dag.has_on_success_callback` / `has_on_failure_callback`, Airflow's `DagModel` flags), with
the TI whose template context Airflow's callback gets (its `relevant_ti`): the success with
the latest end of a run that succeeded, the failure with the latest end of one that failed
(`DagRun.update_state`), the unfinished TI with the latest start of one that timed out
(`SchedulerJobRunner._schedule_dag_run`). The unique (run, clear_number) refuses a second
request for the same finish: `ON CONFLICT DO NOTHING`, so a replay writes nothing.
"""

from collections.abc import Sequence
from datetime import datetime

from django.db import connection

from ..models import Dag, DagCallbackRequest, DagRun, TaskInstance
from ..models.runs import TI_UNFINISHED_STATES

_REQUEST = DagCallbackRequest._meta.db_table
_RUN = DagRun._meta.db_table
_DAG = Dag._meta.db_table
_TI = TaskInstance._meta.db_table

# Python's max() in Airflow puts a TI without the date first (datetime.min): NULLS LAST here.
_LAST_TI_BY_STATE = (
    f"(SELECT ti.id FROM {_TI} ti WHERE ti.dag_run_id = r.id AND ti.state = r.state "
    "ORDER BY ti.end_date DESC NULLS LAST, ti.id LIMIT 1)"
)
_UNFINISHED = ", ".join(f"'{state}'" for state in sorted(TI_UNFINISHED_STATES))
_LAST_UNFINISHED_TI = (
    f"(SELECT ti.id FROM {_TI} ti WHERE ti.dag_run_id = r.id AND ti.state IN ({_UNFINISHED}) "
    "ORDER BY ti.start_date DESC NULLS LAST, ti.id LIMIT 1)"
)


# Over a run row just finished (the finish UPDATE's RETURNING, `scheduling.dependencies`):
# whether its Dag has the callback of its new state, so that a Dag without one costs no
# statement more.
WANTED = (
    f"(SELECT CASE WHEN {_RUN}.state = 'success' THEN d.has_on_success_callback "
    f"WHEN {_RUN}.state = 'failed' THEN d.has_on_failure_callback ELSE FALSE END "
    f"FROM {_DAG} d WHERE d.dag_id = {_RUN}.dag_id)"
)


def _at(value: datetime):
    return connection.ops.adapt_datetimefield_value(value)


def write_requests(*, dag_run_ids: Sequence[int], now: datetime, timed_out: bool = False) -> int:
    """Insert the callback request of each finished run of `dag_run_ids` whose Dag has the
    callback of its state (see the module docstring); a finish that has one already gets
    nothing. `timed_out`: the runs were failed by their dagrun_timeout and their unfinished
    TIs are not skipped yet (reason "timed_out"); else the reason follows the state
    ("success", "task_failure"). 1 statement, in the caller's transaction (the finish's).
    Returns how many it wrote."""
    if not dag_run_ids:
        return 0
    last_ti = _LAST_UNFINISHED_TI if timed_out else _LAST_TI_BY_STATE
    reason = (
        "'timed_out'"
        if timed_out
        else "CASE WHEN r.state = 'success' THEN 'success' ELSE 'task_failure' END"
    )
    ids = ", ".join(["%s"] * len(dag_run_ids))
    text = (
        f"INSERT INTO {_REQUEST} (dag_run_id, dag_id, clear_number, is_failure_callback, "
        "reason, last_ti_id, state, attempts, claimed_by, lease_until, created_at, "
        "finished_at, last_error) "
        f"SELECT r.id, r.dag_id, r.clear_number, r.state = 'failed', {reason}, {last_ti}, "
        "'pending', 0, '', NULL, %s, NULL, '' "
        f"FROM {_RUN} r JOIN {_DAG} d ON d.dag_id = r.dag_id WHERE r.id IN ({ids}) "
        "AND ((r.state = 'success' AND d.has_on_success_callback) "
        "OR (r.state = 'failed' AND d.has_on_failure_callback)) "
        "ON CONFLICT (dag_run_id, clear_number) DO NOTHING"
    )
    with connection.cursor() as cursor:
        cursor.execute(text, [_at(now), *dag_run_ids])
        return cursor.rowcount


def claim_due(
    *, claimed_by: str, limit: int, now: datetime, lease_until: datetime, max_attempts: int
) -> list[tuple[int, int]]:
    """Lease up to `limit` due pending requests (never claimed, or their lease ended before
    `now`), oldest first, to `claimed_by` until `lease_until`, FOR UPDATE SKIP LOCKED (two
    workers never take one, neither waits); each claim counts an attempt. A due request
    claimed `max_attempts` times already (its workers died, or never reported) is parked
    instead. Returns (id, attempt) of the claimed ones. 1 statement, in the caller's
    transaction."""
    lock = " FOR UPDATE OF c SKIP LOCKED" if connection.vendor == "postgresql" else ""
    text = (
        f"WITH due AS (SELECT c.id FROM {_REQUEST} c WHERE c.state = 'pending' "
        f"AND (c.lease_until IS NULL OR c.lease_until < %s) ORDER BY c.id LIMIT %s{lock}) "
        f"UPDATE {_REQUEST} SET "
        "state = CASE WHEN attempts >= %s THEN 'parked' ELSE 'pending' END, "
        "last_error = CASE WHEN attempts >= %s THEN 'claimed ' || attempts || "
        "' times without a report (its workers died or never answered): parked' "
        "ELSE last_error END, "
        "attempts = CASE WHEN attempts >= %s THEN attempts ELSE attempts + 1 END, "
        "claimed_by = %s, lease_until = %s "
        "WHERE id IN (SELECT id FROM due) RETURNING id, state, attempts"
    )
    params = [
        _at(now),
        limit,
        max_attempts,
        max_attempts,
        max_attempts,
        claimed_by,
        _at(lease_until),
    ]
    with connection.cursor() as cursor:
        cursor.execute(text, params)
        rows = cursor.fetchall()
    return sorted((row[0], row[2]) for row in rows if row[1] == "pending")
