"""What a running task asks the worker API besides its own state changes (DESIGN 6.1): rendered
fields, inlet/outlet validation, its previous successful run, sensor reschedule dates, counts and
states of other TIs and runs, and runs it triggers or clears (TriggerDagRunOperator).

Reads take no locks. Writes are each their own durable transaction and idempotent: rendered
fields replace the TI's row; a trigger with a run id that exists is a Conflict and writes nothing.
"""

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import transaction
from django.db.models import Q, QuerySet

from ..catalog import asset_activity
from ..guards import exceptions
from ..models import (
    Dag,
    DagRun,
    DagRunState,
    DagRunTriggeredBy,
    DagRunType,
    RenderedTaskFields,
    Task,
    TaskInstance,
    TaskReschedule,
)
from ..operations import audit
from ..scheduling import runs


def _task_instance(ti_id: UUID) -> TaskInstance:
    ti = TaskInstance.objects.filter(id=ti_id).first()
    if ti is None:
        raise exceptions.NotFound("Task Instance not found")
    return ti


def set_rendered_fields(*, ti_id: UUID, fields: dict[str, Any]) -> None:
    """Replace the TI's rendered template fields (one row per TI)."""
    ti = _task_instance(ti_id)
    with transaction.atomic(durable=True):
        RenderedTaskFields.objects.update_or_create(ti=ti, defaults={"fields": fields})


def inactive_assets(*, ti_id: UUID) -> list[dict[str, str]]:
    """The TI's task's inlet and outlet assets Airflow would call inactive (its name or uri held
    by another asset: `catalog.asset_activity`), as Airflow's `validate_inlets_and_outlets`
    answers them: `{"name", "uri", "type": "Asset"}` profiles. A task the service no longer
    has declares none (Airflow's answer when the serialized Dag lacks the task)."""
    ti = _task_instance(ti_id)
    task = Task.objects.filter(dag_id=ti.dag_id, task_id=ti.task_id).first()
    if task is None:
        return []
    found = asset_activity.inactive(asset_activity.declared(task=task))
    return [{"name": key.name, "uri": key.uri, "type": "Asset"} for key in found]


def previous_successful_run(*, ti_id: UUID) -> DagRun | None:
    """The Dag's latest successful run with a logical date before this TI's run's (None when
    the run has no logical date, as in Airflow: asset-triggered and manual runs here have none
    unless one was given)."""
    ti = _task_instance(ti_id)
    run = DagRun.objects.get(id=ti.dag_run_id)
    if run.logical_date is None:
        return None
    return (
        DagRun.objects.filter(
            dag_id=ti.dag_id, logical_date__lt=run.logical_date, state=DagRunState.SUCCESS
        )
        .order_by("-logical_date")
        .first()
    )


def first_reschedule_date(*, ti_id: UUID, try_number: int = 1) -> datetime | None:
    """When the first reschedule of the TI (from `try_number` on) started: the sensor's
    start, for its timeout; None when it was never rescheduled."""
    return (
        TaskReschedule.objects.filter(ti_id=ti_id, try_number__gte=try_number)
        .order_by("id")
        .values_list("start_date", flat=True)
        .first()
    )


def _ti_filter(
    *,
    dag_id: str,
    map_index: int | None,
    task_ids: Sequence[str] | None,
    logical_dates: Sequence[datetime] | None,
    run_ids: Sequence[str] | None,
):
    tis = TaskInstance.objects.filter(dag_id=dag_id)
    if task_ids:
        tis = tis.filter(task_id__in=task_ids)
    if map_index is not None:
        tis = tis.filter(map_index=map_index)
    if logical_dates:
        tis = tis.filter(dag_run__logical_date__in=logical_dates)
    if run_ids:
        tis = tis.filter(run_id__in=run_ids)
    return tis


def _group_task_ids(*, dag_id: str, task_group_id: str) -> list[str]:
    """The task ids of the Dag's task group `task_group_id`, nested groups' included (Airflow
    3.3.2's `_get_group_tasks` in `execution_api/routes/task_instances.py`, which reads the
    group from the Dag's latest version): NotFound with Airflow's messages for an unknown Dag
    or group (its 404 `{"reason": "not_found", "message": ...}`)."""
    groups = Dag.objects.filter(dag_id=dag_id).values_list("task_groups", flat=True).first()
    if groups is None:
        raise exceptions.NotFound(f"The Dag with ID: `{dag_id}` was not found")
    if task_group_id not in groups:
        raise exceptions.NotFound(f"Task group {task_group_id} not found in DAG {dag_id}")
    return list(groups[task_group_id])


def _group_tis(
    *,
    dag_id: str,
    task_group_id: str,
    map_index: int | None,
    logical_dates: Sequence[datetime] | None,
    run_ids: Sequence[str] | None,
) -> QuerySet[TaskInstance]:
    """The TIs of the group's tasks in those runs (an empty group has none)."""
    members = _group_task_ids(dag_id=dag_id, task_group_id=task_group_id)
    if not members:
        return TaskInstance.objects.none()
    return _ti_filter(
        dag_id=dag_id,
        map_index=map_index,
        task_ids=members,
        logical_dates=logical_dates,
        run_ids=run_ids,
    )


def count_task_instances(
    *,
    dag_id: str,
    map_index: int | None = None,
    task_ids: Sequence[str] | None = None,
    task_group_id: str | None = None,
    logical_dates: Sequence[datetime] | None = None,
    run_ids: Sequence[str] | None = None,
    states: Sequence[str] | None = None,
) -> int:
    """How many TIs match (Airflow's `GET /execution/task-instances/count`). A TI here always
    has a state, so "null" in `states` matches none. With `task_group_id`, only the (task,
    map index) pairs the group's TIs of those runs have, or the group id itself (-1) when it
    has none, as Airflow's `get_task_instance_count` counts (404 for an unknown group)."""
    tis = _ti_filter(
        dag_id=dag_id,
        map_index=map_index,
        task_ids=task_ids,
        logical_dates=logical_dates,
        run_ids=run_ids,
    )
    if task_group_id:
        members = _group_tis(
            dag_id=dag_id,
            task_group_id=task_group_id,
            map_index=map_index,
            logical_dates=logical_dates,
            run_ids=run_ids,
        )
        pairs = set(members.values_list("task_id", "map_index")) or {(task_group_id, -1)}
        pair_q = Q(pk__in=[])
        for task_id, index in sorted(pairs):
            pair_q |= Q(task_id=task_id, map_index=index)
        tis = tis.filter(pair_q)
    if states:
        tis = tis.filter(state__in=[s for s in states if s != "null"])
    return tis.count()


def task_instance_states(
    *,
    dag_id: str,
    map_index: int | None = None,
    task_ids: Sequence[str] | None = None,
    task_group_id: str | None = None,
    logical_dates: Sequence[datetime] | None = None,
    run_ids: Sequence[str] | None = None,
) -> dict[str, dict[str, str]]:
    """{run_id: {task_id (or `task_id_mapindex` when mapped): state}} (Airflow's `GET
    /execution/task-instances/states`). With `task_group_id`: the group's TIs of those runs,
    added to those of `task_ids` when given, else instead of every TI of the Dag (404 for an
    unknown group, as Airflow's `get_task_instance_states`)."""
    result: dict[str, dict[str, str]] = defaultdict(dict)
    found = _ti_filter(
        dag_id=dag_id,
        map_index=map_index,
        task_ids=task_ids,
        logical_dates=logical_dates,
        run_ids=run_ids,
    )
    if task_group_id:
        group = _group_tis(
            dag_id=dag_id,
            task_group_id=task_group_id,
            map_index=map_index,
            logical_dates=logical_dates,
            run_ids=run_ids,
        )
        found = found | group if task_ids else group
    rows = found.values_list("run_id", "task_id", "map_index", "state")
    for run_id, task_id, index, state in rows:
        result[run_id][task_id if index < 0 else f"{task_id}_{index}"] = state
    return dict(result)


def get_dag(*, dag_id: str) -> Dag:
    dag = Dag.objects.filter(dag_id=dag_id).first()
    if dag is None:
        raise exceptions.NotFound(f"The Dag with dag_id: `{dag_id}` was not found")
    return dag


# --- dag runs ------------------------------------------------------------------------------------


def get_run(*, dag_id: str, run_id: str) -> DagRun:
    run = DagRun.objects.filter(dag_id=dag_id, run_id=run_id).first()
    if run is None:
        raise exceptions.NotFound(
            f"Dag run with dag_id '{dag_id}' and run_id '{run_id}' was not found"
        )
    return run


def count_runs(
    *,
    dag_id: str,
    logical_dates: Sequence[datetime] | None = None,
    run_ids: Sequence[str] | None = None,
    states: Sequence[str] | None = None,
) -> int:
    found = DagRun.objects.filter(dag_id=dag_id)
    if logical_dates:
        found = found.filter(logical_date__in=logical_dates)
    if run_ids:
        found = found.filter(run_id__in=run_ids)
    if states:
        found = found.filter(state__in=states)
    return found.count()


def previous_run(*, dag_id: str, logical_date: datetime, state: str | None = None) -> DagRun | None:
    """The Dag's run with the latest logical date before `logical_date` (in `state`)."""
    found = DagRun.objects.filter(dag_id=dag_id, logical_date__lt=logical_date)
    if state:
        found = found.filter(state=state)
    return found.order_by("-logical_date").first()


def trigger_from_task(
    *,
    ti_id: UUID,
    dag_id: str,
    run_id: str,
    conf: dict[str, Any] | None,
    logical_date: datetime | None,
    run_after: datetime | None,
    note: str | None,
    actor: audit.Actor | None = None,
) -> DagRun:
    """A run of `dag_id` asked for by the running TI `ti_id` (run type operator_triggered; the
    triggering user is that of the TI's own run), audited as `actor` (that TI, issue 26).
    Conflict (`already_exists`) when `run_id` exists, NotFound for an unknown Dag. A paused
    Dag's run is taken and waits, queued, for the unpause, as Airflow 3.3.2's execution API
    `trigger_dag_run` takes it."""
    parent = TaskInstance.objects.filter(id=ti_id).select_related("dag_run").first()
    try:
        return runs.trigger_dag(
            dag_id=dag_id,
            run_id=run_id,
            conf=conf,
            logical_date=logical_date,
            run_after=run_after,
            note=note,
            run_type=DagRunType.OPERATOR_TRIGGERED,
            triggered_by=DagRunTriggeredBy.OPERATOR,
            triggering_user_name=parent.dag_run.triggering_user_name if parent else None,
            actor=actor or audit.Actor.of_task(ti_id),
        )
    except exceptions.Conflict as exc:
        raise exceptions.Conflict(
            f"A run already exists for Dag '{dag_id}' with run_id '{run_id}'",
            reason="already_exists",
        ) from exc


def clear_run(*, dag_id: str, run_id: str, actor: audit.Actor | None = None) -> None:
    """Clear every finished TI of the run (Airflow's `POST /execution/dag-runs/.../clear`),
    audited as `actor` (the running TI whose token asked, issue 26)."""
    runs.clear_dag_run(dag_id=dag_id, run_id=run_id, dry_run=False, actor=actor)
