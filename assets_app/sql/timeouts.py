"""The statements of run timeouts (issue 39, `scheduling.timeouts`): a run starting sets when it
times out (its Dag's `dagrun_timeout` after its start) and wakes the timeout timer in the same
statement; the timer's reads and writes go through the partial index `dag_run_timeout_due`."""

from datetime import datetime

from django.db import connection

from ..models import Dag, DagRun, DagRunState
from . import wakeups
from .connection import prepared_cursor

_RUN, _DAG = DagRun._meta.db_table, Dag._meta.db_table
_QUEUED, _RUNNING = DagRunState.QUEUED.value, DagRunState.RUNNING.value

_START_SQL = f"""
WITH started AS (
    UPDATE {_RUN} SET state = '{_RUNNING}', start_date = %s,
        timeout_at = %s + (SELECT d.dagrun_timeout FROM {_DAG} d WHERE d.dag_id = {_RUN}.dag_id)
    WHERE id = %s AND state = '{_QUEUED}'
    RETURNING timeout_at
)
SELECT {wakeups.wake_sql(wakeups.TIMEOUTS, if_rows_in="started WHERE timeout_at IS NOT NULL")}
"""


def mark_run_running(*, dag_run_id: int, now: datetime) -> None:
    """queued -> running with `start_date` now and `timeout_at` now + its Dag's
    `dagrun_timeout` (None without one), waking the timeout timer when it has one: one
    statement, autocommit (or the caller's transaction). A run not queued is left alone."""
    if connection.vendor != "postgresql":
        start = DagRun.objects.filter(id=dag_run_id, state=DagRunState.QUEUED)
        timeout = Dag.objects.filter(runs__id=dag_run_id).values_list("dagrun_timeout", flat=True)
        delta = timeout.first()
        start.update(
            state=DagRunState.RUNNING,
            start_date=now,
            timeout_at=None if delta is None else now + delta,
        )
        return
    at = connection.ops.adapt_datetimefield_value(now)
    with prepared_cursor() as cursor:
        cursor.execute(_START_SQL, [at, at, dag_run_id])


_RETIME_SQL = f"""
UPDATE {_RUN} r SET timeout_at = r.start_date + d.dagrun_timeout
FROM {_DAG} d
WHERE r.dag_id = d.dag_id AND r.state = '{_RUNNING}' AND r.start_date IS NOT NULL
  AND r.timeout_at IS DISTINCT FROM r.start_date + d.dagrun_timeout
"""


def retime_running_runs() -> int:
    """Every running run's `timeout_at` from its Dag's current `dagrun_timeout` (Airflow reads
    the Dag's timeout at each look; a sync that changes it wakes the timer, which runs this):
    one UPDATE, per Dag an index probe of its running runs (`dag_run_by_dag_state`), writing
    only the runs whose due time changed. Autocommit. Returns how many it changed."""
    if connection.vendor != "postgresql":
        changed = 0
        for run in DagRun.objects.filter(state=DagRunState.RUNNING).select_related("dag"):
            due = (
                run.start_date + run.dag.dagrun_timeout
                if run.start_date and run.dag.dagrun_timeout
                else None
            )
            if due != run.timeout_at:
                changed += DagRun.objects.filter(pk=run.pk).update(timeout_at=due)
        return changed
    with connection.cursor() as cursor:
        cursor.execute(_RETIME_SQL)
        return cursor.rowcount
