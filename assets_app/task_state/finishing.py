"""running -> a terminal state other than success (`finish`: failed, skipped, removed,
upstream_failed), and a branching TI skipping tasks of its run (`skip_downstream`); then, after
the commit, what follows a finish (downstream evaluation, the run's finish).
"""

from datetime import datetime
from uuid import UUID

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from ..guards import exceptions
from ..models import TaskInstance, TIState
from ..runtime import scopes as task_scopes
from ..scheduling import dependencies
from ..scheduling.dependencies import after_ti_finished
from ..sql import locks
from . import StateChange, check_try, not_found, not_running

TERMINAL_NON_SUCCESS = frozenset(
    {TIState.FAILED, TIState.SKIPPED, TIState.REMOVED, TIState.UPSTREAM_FAILED}
)


# --- failed / skipped / removed / upstream_failed ----------------------------------------------


def finish(*, ti_id: UUID, try_number: int, state: str, end_date: datetime) -> StateChange:
    """running -> a terminal state other than success. Lock, check, one UPDATE, commit; then the
    DagRun may finish. A TI already in `state` is a replay (nothing written)."""
    if state not in TERMINAL_NON_SUCCESS:
        raise exceptions.InvalidInput(f"{state!r} is not a terminal non-success state")
    with transaction.atomic(durable=True):
        ti = locks.lock_task_instance(ti_id)
        if ti is None:
            raise not_found(ti_id)
        check_try(ti, try_number)
        if ti.state == state:
            return StateChange(ti_id=ti.id, state=ti.state, replayed=True, try_number=ti.try_number)
        if ti.state != TIState.RUNNING:
            raise not_running(ti, f"marked {state}")
        ti.state = state
        ti.end_date = end_date
        ti.save(update_fields=["state", "end_date", "updated_at"])
    after_ti_finished(ti)
    return StateChange(ti_id=ti.id, state=ti.state, replayed=False, try_number=ti.try_number)


# --- skip-downstream --------------------------------------------------------------------------


# Airflow's skip-downstream leaves TIs that are executing or finished this way alone.
_NOT_SKIPPABLE = (TIState.RUNNING, TIState.SUCCESS, TIState.FAILED)


def skip_downstream(*, ti_id: UUID, try_number: int, tasks: list[tuple[str, int]]) -> int:
    """A branching TI skips tasks of its run (Airflow's `PATCH .../skip-downstream`): those of
    `tasks` ((task_id, map_index)) not running, success or failed become skipped, in one
    conditional UPDATE (autocommit; the TI's own row is not locked: it only names the run).
    Then, as after any finish, their downstream are evaluated and the run may finish. Returns
    how many TIs were skipped; replaying it skips nothing more. Unknown TI: NotFound; another
    try than the token's: StaleTry (checked on the row it reads anyway)."""
    source = (
        TaskInstance.objects.filter(id=ti_id)
        .values("dag_run_id", "dag_id", "try_number", "state")
        .first()
    )
    if source is None:
        raise not_found(ti_id)
    if source["try_number"] != try_number:
        raise exceptions.StaleTry.of(
            ti_id=ti_id, token_try=try_number, current_try=source["try_number"]
        )
    task_scopes.require_running(ti_id=ti_id, state=source["state"], what="skip-downstream")
    wanted = sorted(set(tasks))
    if not wanted:
        return 0
    now = timezone.now()
    keys = Q()
    for task_id, map_index in wanted:
        keys |= Q(task_id=task_id, map_index=map_index)
    count = (
        TaskInstance.objects.filter(keys, dag_run_id=source["dag_run_id"])
        .exclude(state__in=_NOT_SKIPPABLE)
        .exclude(state=TIState.SKIPPED)
        .update(state=TIState.SKIPPED, start_date=now, end_date=now, updated_at=now)
    )
    if not count:
        return 0
    dependencies.follow_finishes(
        dag_run_id=source["dag_run_id"],
        dag_id=source["dag_id"],
        finished_task_ids=sorted({t for t, _ in wanted}),
    )
    return count
