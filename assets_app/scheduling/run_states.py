"""An operator's change of a Dag run through the public API (issue 49): Airflow 3.3.2's
`PATCH /api/v2/dags/{dag_id}/dagRuns/{dag_run_id}` (`routes/public/dag_run.py` `patch_dag_run`,
`services/public/dag_run.py`, `api/common/mark_tasks.py`): its note and its state; and of its
task instances (`PATCH .../taskInstances/{task_id}`: `patch_task_instances`).

- `success` / `failed` (`_set_dag_run_terminal_state`): the run's running TIs (running,
  deferred, awaiting input) get that state, its other unfinished TIs are skipped, teardown
  tasks' TIs are left alone, and the run takes the state (its end date now, when it was not
  finished) unless a teardown TI is still unfinished; a worker still running one of those TIs is
  told at its next heartbeat (409 `not_running`), as Airflow's execution API tells it.
- `queued`: the run alone, queued again now (start and end cleared), as `DagRun.set_state`.
- `note`: replaced; `""` removes it (Airflow's `patch_dag_run_note`).

A run that ends this way writes its `dag_run.succeeded` / `dag_run.failed` webhook message. A
replay (the run already in that state with nothing left to change, the same note) writes
nothing.
"""

from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from ..events_out import webhooks
from ..guards import exceptions
from ..models import DagRun, DagRunState, Task, TaskInstance, TaskUpstream, TIState
from ..models.runs import TI_UNFINISHED_STATES
from ..operations import audit
from ..sql import locks
from . import dependencies, runs

# Airflow's `running_states` of `_set_dag_run_terminal_state` that this service has.
RUNNING_TI_STATES = (TIState.RUNNING, TIState.DEFERRED, TIState.AWAITING_INPUT)
MUTABLE_STATES = (DagRunState.QUEUED, DagRunState.SUCCESS, DagRunState.FAILED)


@dataclass(frozen=True)
class RunPatch:
    run: DagRun
    changed: bool


def not_found(dag_id: str, run_id: str) -> exceptions.NotFound:
    return exceptions.NotFound(
        f"The DagRun with dag_id: `{dag_id}` and run_id: `{run_id}` was not found",
        reason="dag_run_not_found",
    )


def patch_dag_run(
    *,
    dag_id: str,
    run_id: str,
    state: str | None = None,
    note: str | None = None,
    fields: frozenset[str] = frozenset(),
    actor: audit.Actor | None = None,
) -> RunPatch:
    """Apply the `fields` named (`state`, `note`; the body's fields set, narrowed by Airflow's
    `update_mask`) to one run: a `state` of None changes nothing, a `note` of None or "" removes
    it. Own durable transaction; the run row is locked (waiting: its holders hold it briefly)
    and then its TIs updated with plain UPDATEs (run timeouts' order). Audited when something
    changed. Unknown run -> NotFound."""
    now = timezone.now()
    with transaction.atomic(durable=True):
        run = locks.lock_run(dag_id=dag_id, run_id=run_id)
        if run is None:
            raise not_found(dag_id, run_id)
        changes: dict[str, object] = {}
        if "note" in fields:
            wanted = note or None
            if run.note != wanted:
                DagRun.objects.filter(pk=run.pk).update(note=wanted)
                changes["note"] = wanted
        if "state" in fields and state is not None:
            changes.update(_set_state(run, state=state, now=now))
        if changes:
            audit.record(
                actor=actor,
                action="dag_run.patch",
                summary=f"changed run {run_id} of {dag_id}: " + ", ".join(sorted(changes)),
                targets=[audit.Target(kind="dag_run", object_id=run.pk)],
                dag_id=dag_id,
                detail={"run_id": run_id, **{k: v for k, v in changes.items()}},
            )
    run.refresh_from_db()
    return RunPatch(run=run, changed=bool(changes))


def _set_state(run: DagRun, *, state: str, now) -> dict[str, object]:
    """The state change, in the caller's transaction under the run's lock; what changed."""
    if state == DagRunState.QUEUED:
        if run.state == DagRunState.QUEUED:
            return {}
        DagRun.objects.filter(pk=run.pk).update(
            state=DagRunState.QUEUED, queued_at=now, start_date=None, end_date=None
        )
        return {"state": state}
    teardowns = set(
        Task.objects.filter(dag_id=run.dag_id, is_teardown=True).values_list("task_id", flat=True)
    )
    tis = TaskInstance.objects.filter(dag_run_id=run.pk).exclude(task_id__in=teardowns)
    ended = tis.filter(state__in=RUNNING_TI_STATES).update(
        state=state, end_date=now, updated_at=now
    )
    skipped = tis.filter(state__in=TI_UNFINISHED_STATES).update(
        state=TIState.SKIPPED, updated_at=now
    )
    teardown_pending = TaskInstance.objects.filter(
        dag_run_id=run.pk, task_id__in=teardowns, state__in=TI_UNFINISHED_STATES
    ).exists()
    changes: dict[str, object] = {}
    if ended or skipped:
        changes.update(task_instances_ended=ended, task_instances_skipped=skipped)
    if run.state != state and not teardown_pending:
        values: dict[str, object] = {"state": state}
        if run.state not in (DagRunState.SUCCESS, DagRunState.FAILED):
            values["end_date"] = now
        DagRun.objects.filter(pk=run.pk).update(**values)
        webhooks.write_run_finished(dag_run_id=run.pk, now=now)
        changes["state"] = state
    return changes


# Airflow's `PatchTaskInstanceBody.new_state` choices.
TI_NEW_STATES = (TIState.SUCCESS, TIState.FAILED, TIState.SKIPPED)
INCLUDE_FLAGS = ("include_upstream", "include_downstream", "include_future", "include_past")


def patch_task_instances(
    *,
    dag_id: str,
    run_id: str,
    task_id: str,
    map_index: int | None,
    new_state: str | None = None,
    note: str | None = None,
    fields: frozenset[str] = frozenset(),
    masked: bool = False,
    includes: frozenset[str] = frozenset(),
    dry_run: bool = False,
    actor: audit.Actor | None = None,
) -> list[TaskInstance]:
    """Airflow's `PATCH .../taskInstances/{task_id}[/{map_index}][/dry_run]`
    (`_patch_ti_validate_request`, `set_task_instance_state`, `_patch_task_instance_note`):
    the task's TIs in the run (one map index, or all when `map_index` is None). `note` first
    (when `fields` names it and it is not None or an `update_mask` was `masked`; "" removes
    it), then `new_state` for the TIs not in it already (none -> Conflict "already in"):
    start date kept or now, end date kept or now; after the commit the run's downstream
    failed / upstream_failed TIs of that task are cleared (`clear_task_instances`, only
    failed), as Airflow's, and the run follows (`dependencies.follow_finishes`: evaluation,
    finish). `dry_run` writes nothing and answers the TIs that would change (all matched ones
    without `new_state`). `includes` (upstream, downstream, future, past) are refused with
    BadRequest naming them: not served yet. Own durable transaction, the TIs locked (waiting,
    by id); audited. Unknown task -> NotFound; no TI -> NotFound, both in Airflow's words."""
    if includes:
        raise exceptions.BadRequest(
            f"{', '.join(sorted(includes))}: setting the state of other task instances along "
            "(upstream, downstream, future, past) is not served yet; set each one",
            reason="include_not_served",
        )
    if not Task.objects.filter(dag_id=dag_id, task_id=task_id).exists():
        raise exceptions.NotFound(
            f"Task '{task_id}' not found in Dag '{dag_id}'", reason="task_not_found"
        )
    matched = TaskInstance.objects.select_related("dag_run", "trigger").filter(
        dag_id=dag_id, run_id=run_id, task_id=task_id
    )
    if map_index is not None:
        matched = matched.filter(map_index=map_index)
    tis = list(matched.order_by("map_index"))
    if not tis:
        raise exceptions.NotFound(
            f"The Task Instance with dag_id: `{dag_id}`, run_id: `{run_id}`, task_id: "
            f"`{task_id}` and map_index: `{map_index}` was not found",
            reason="task_instance_not_found",
        )
    setting = "new_state" in fields and new_state is not None
    if dry_run:
        return [ti for ti in tis if ti.state != new_state] if setting else tis
    now = timezone.now()
    with transaction.atomic(durable=True):
        ids = [ti.id for ti in tis]
        changes: dict[str, object] = {}
        stale = TaskInstance.objects.filter(id__in=ids).exclude(note=note or None)
        if "note" in fields and (masked or note is not None) and stale.exists():
            TaskInstance.objects.filter(id__in=ids).update(note=note or None, updated_at=now)
            changes["note"] = note or None
        if setting:
            locked = locks.lock_task_instances_to_set(
                TaskInstance.objects.filter(id__in=ids).exclude(state=new_state)
            )
            if not locked:
                raise exceptions.Conflict(
                    f"Task id {task_id} is already in {new_state} state",
                    reason="task_instance_already_in_state",
                )
            for ti in locked:
                ti.state = str(new_state)
                ti.start_date = ti.start_date or now
                ti.end_date = ti.end_date or now
                ti.updated_at = now
            TaskInstance.objects.bulk_update(
                locked, ["state", "start_date", "end_date", "updated_at"]
            )
            changes["new_state"] = new_state
            changes["map_indexes"] = sorted(ti.map_index for ti in locked)
        if changes:
            audit.record(
                actor=actor,
                action="task_instance.patch",
                summary=f"changed task {task_id} of run {run_id} of {dag_id}: "
                + ", ".join(sorted(k for k in changes if k != "map_indexes")),
                targets=[audit.Target(kind="task_instance", object_id=i, ti_id=i) for i in ids],
                dag_id=dag_id,
                detail={"run_id": run_id, "task_id": task_id, **changes},
            )
    if setting:
        run_pk = tis[0].dag_run_id
        failed_below = list(
            TaskInstance.objects.filter(
                dag_run_id=run_pk,
                task_id__in=_downstream_task_ids(dag_id=dag_id, task_id=task_id),
                state__in=(TIState.FAILED, TIState.UPSTREAM_FAILED),
            ).values_list("id", flat=True)
        )
        if failed_below:
            runs.clear_task_instances(
                dag_run_id=run_pk, ti_ids=failed_below, only_failed=True, actor=actor
            )
        dependencies.follow_finishes(dag_run_id=run_pk, dag_id=dag_id, finished_task_ids=[task_id])
    return list(matched.order_by("map_index"))


def _downstream_task_ids(*, dag_id: str, task_id: str) -> set[str]:
    """Every task downstream of `task_id` (itself excluded), through the Dag's upstream links."""
    below: dict[str, set[str]] = {}
    for task, upstream in TaskUpstream.objects.filter(task__dag_id=dag_id).values_list(
        "task__task_id", "upstream__task_id"
    ):
        below.setdefault(upstream, set()).add(task)
    found: set[str] = set()
    todo = [task_id]
    while todo:
        for child in below.get(todo.pop(), ()):
            if child not in found and child != task_id:
                found.add(child)
                todo.append(child)
    return found
