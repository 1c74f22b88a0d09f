"""What a task token may do beyond its own TI's state routes (issue 26; narrower than Airflow).

Airflow 3.3.2's execution API lets any valid task token read every Connection and Variable and
read or write any Dag's XComs until the token expires. Here a token (one TI try, `api/auth.py`)
is held to its task instance:

- **XCom writes** (`POST|DELETE /execution/xcoms/...`): only its own TI's address (Dag, run,
  task and map index), and only while that TI runs.
- **XCom reads**: within its own run and the runs that produced the asset events its run
  consumed (a consumer's `xcom_pull` of its producer, as `examples/airflow_dags/consumer.py`
  does), unless its Dag opts into wider reads with `xcom_read_scope` (`dag`: any run of the
  Dag; `all`: any Dag's).
- **Other writes** (Variables `PUT|DELETE`, triggering or clearing a Dag run, skip-downstream):
  only while its TI runs. Its own state route keeps its rules (a replayed final state is 200,
  any other change of a finished TI 409: `task_state`).
- **State store** (`/store/ti/...`, `/store/asset/...`): reads with a token of the TI's current
  try; writes while its TI runs or in its overtime (a callback's), as for rendered fields. Task
  keys only its own TI's (the path's TI must be the token's, Airflow's `ti:self`); asset keys of
  any asset, as Airflow 3.3.2 (its per-task asset check is a TODO there, so a refusal here
  would fail a consumer Airflow runs).
- **Connections**: only while its TI runs, or within TASK_SUCCESS_OVERTIME_SECONDS (20 s,
  Airflow's `[core] task_success_overtime`) after it finished, because the Task SDK reports the
  final state first and runs `on_success_callback` / `on_retry_callback` and listeners after
  (a notifier reads its Connection there); the server's own finish time counts (`updated_at`).

Each refusal is a 403 whose reason and message name the rule. Reads of the token's TI row:
one indexed query (`load`, done by the authentication with the try check it needed anyway);
a read outside the run adds one for the Dag's scope and, under `run`, one for the consumed
events' sources.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.utils import timezone

from ..guards import exceptions
from ..models import AssetEvent, Dag, TaskInstance, TIState, XComReadScope
from ..models.runs import TI_FINISHED_STATES


@dataclass(frozen=True)
class TokenTI:
    """The task instance a token was issued for, as it is now."""

    id: UUID
    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    try_number: int
    state: str
    updated_at: datetime


_FIELDS = ("id", "dag_id", "run_id", "task_id", "map_index", "try_number", "state", "updated_at")


def load(*, ti_id: Any) -> TokenTI | None:
    """The token's TI (one query), or None when it does not exist (any more)."""
    row = TaskInstance.objects.filter(id=ti_id).values_list(*_FIELDS).first()
    return None if row is None else TokenTI(*row)


def require_running(*, ti_id: Any, state: str, what: str) -> None:
    """PermissionDenied (`task_not_running`) unless the token's TI is running."""
    if state != TIState.RUNNING:
        raise exceptions.PermissionDenied(
            f"{what} refused: a task token writes only while its task instance runs, and task "
            f"instance {ti_id} is {state}",
            reason="task_not_running",
        )


def check_xcom_write(
    ti: TokenTI, *, dag_id: str, run_id: str, task_id: str, map_index: int
) -> None:
    """A push or delete: its own TI's address only, while it runs."""
    own = (ti.dag_id, ti.run_id, ti.task_id, ti.map_index)
    if (dag_id, run_id, task_id, map_index) != own:
        raise exceptions.PermissionDenied(
            "XCom write refused: a task token writes only its own task instance's XComs "
            f"(dag_id {ti.dag_id!r}, run_id {ti.run_id!r}, task_id {ti.task_id!r}, map_index "
            f"{ti.map_index}), not dag_id {dag_id!r}, run_id {run_id!r}, task_id {task_id!r}, "
            f"map_index {map_index}",
            reason="xcom_write_not_own",
        )
    require_running(ti_id=ti.id, state=ti.state, what="XCom write")


def check_xcom_read(ti: TokenTI, *, dag_id: str, run_id: str) -> None:
    """A read: its own run, a run that produced an event its run consumed, or what its Dag's
    `xcom_read_scope` opens."""
    if (dag_id, run_id) == (ti.dag_id, ti.run_id):
        return
    scope = (
        Dag.objects.filter(dag_id=ti.dag_id).values_list("xcom_read_scope", flat=True).first()
        or XComReadScope.RUN
    )
    if scope == XComReadScope.ALL or (scope == XComReadScope.DAG and dag_id == ti.dag_id):
        return
    if _consumed_an_event_of(ti, dag_id=dag_id, run_id=run_id):
        return
    raise exceptions.PermissionDenied(
        f"XCom read refused: Dag {ti.dag_id!r} lets its task tokens read XComs of "
        f"{XComReadScope(scope).label} (its xcom_read_scope is {scope!r}), not of Dag "
        f"{dag_id!r} run {run_id!r}",
        reason="xcom_read_outside_scope",
        xcom_read_scope=scope,
    )


def _consumed_an_event_of(ti: TokenTI, *, dag_id: str, run_id: str) -> bool:
    """Whether the token's run consumed an asset event written by Dag `dag_id`'s run `run_id`."""
    return AssetEvent.objects.filter(
        consuming_runs__dag_id=ti.dag_id,
        consuming_runs__run_id=ti.run_id,
        source_dag_id=dag_id,
        source_run_id=run_id,
    ).exists()


def check_rendered_fields_write(
    ti: TokenTI, *, token_try: int, now: datetime | None = None
) -> None:
    """A rendered-fields write (`PUT .../rtif`): with a token of the TI's current try (StaleTry,
    409, otherwise: invariant 12; Airflow answers 410 for an earlier try's TI id, which it
    regenerates on a retry), while the TI runs, or in its overtime after it finished, where the
    Task SDK's `finalize` overwrites them for an operator with `overwrite_rtif_after_execution`
    (after the state was reported)."""
    if ti.try_number != token_try:
        raise exceptions.StaleTry.of(ti_id=ti.id, token_try=token_try, current_try=ti.try_number)
    if ti.state == TIState.RUNNING or _in_overtime(ti, now):
        return
    raise exceptions.PermissionDenied(
        "Rendered fields write refused: only a running task instance's token writes them (or "
        f"in the {settings.TASK_SUCCESS_OVERTIME_SECONDS} s after it finished); task instance "
        f"{ti.id} is {ti.state}",
        reason="task_not_running",
    )


def _in_overtime(ti: TokenTI, now: datetime | None) -> bool:
    overtime = timedelta(seconds=settings.TASK_SUCCESS_OVERTIME_SECONDS)
    return ti.state in TI_FINISHED_STATES and (now or timezone.now()) - ti.updated_at <= overtime


def check_connection_read(ti: TokenTI, *, now: datetime | None = None) -> None:
    """A Connection read: while the TI runs, or in its overtime after it finished."""
    if ti.state == TIState.RUNNING or _in_overtime(ti, now):
        return
    raise exceptions.PermissionDenied(
        "Connection read refused: only a running task instance's token reads Connections "
        f"(or in the {settings.TASK_SUCCESS_OVERTIME_SECONDS} s after it finished, for its "
        f"callbacks); task instance {ti.id} is {ti.state}",
        reason="connection_needs_running_task",
    )


def check_state_store_access(ti: TokenTI, *, token_try: int, write: bool) -> None:
    """A state store call: a token of the TI's current try (StaleTry, 409, otherwise); a write
    while the TI runs or in its overtime after it finished."""
    if ti.try_number != token_try:
        raise exceptions.StaleTry.of(ti_id=ti.id, token_try=token_try, current_try=ti.try_number)
    if not write or ti.state == TIState.RUNNING or _in_overtime(ti, None):
        return
    raise exceptions.PermissionDenied(
        "State store write refused: only a running task instance's token writes state (or in "
        f"the {settings.TASK_SUCCESS_OVERTIME_SECONDS} s after it finished); task instance "
        f"{ti.id} is {ti.state}",
        reason="task_not_running",
    )
