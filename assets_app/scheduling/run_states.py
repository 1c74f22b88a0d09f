"""An operator's change of a Dag run through the public API (issue 49): Airflow 3.3.2's
`PATCH /api/v2/dags/{dag_id}/dagRuns/{dag_run_id}` (`routes/public/dag_run.py` `patch_dag_run`,
`services/public/dag_run.py`, `api/common/mark_tasks.py`): its note and its state.

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
from ..models import DagRun, DagRunState, Task, TaskInstance, TIState
from ..models.runs import TI_UNFINISHED_STATES
from ..operations import audit
from ..sql import locks

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
