"""Worker-facing task instance state changes, one module per concern; the package owns the TI
row lock (`locks.lock_task_instance`, `of=("self",)`).

Owns: one module per state change:

- `starting`: queued -> running, and the run context a started TI gets;
- `success`: running -> success, its outlets handed to the outbox (or, inline, registered);
- `finishing`: running -> failed / skipped / removed / upstream_failed, and a branch's
  skip-downstream;
- `retries`: back to queued, the next try after its delay (`retry`) or the same try later
  (`reschedule`), with Airflow's retry rule and delay;
- `deferral`: running -> deferred with its trigger, the triggerer's claims, and back to queued
  (in the task's `next_method`) on the trigger's event, failure or timeout (issue 42);
- `liveness`: heartbeats, and the sweep of running TIs whose worker died;
- `claims`: workers claiming queued TIs;
- `repair`: the repair sweep (invariant 11): what dead workers and crashes left behind.

This module holds what they share: the answer (`StateChange`), the refusals, the token's try
check and the retry eligibility rule.

While the TI lock is held a function only reads the TI and writes its new state (invariant 1):
the SELECT ... FOR UPDATE, one UPDATE, then COMMIT, whatever the number of outlets or consumed
events. A success in queue mode takes the lock with its conditional UPDATE itself (UPDATE, then
COMMIT) and inserts its outbox row in the same transaction just before (see
`success._succeed_queued`), so the payload's size never lengthens the hold. Everything else
happens after the commit, without the lock:

- the DagRun follows its TIs in its own short statement (conditional UPDATE, no lock): `running`
  when a TI starts, `success` / `failed` once every TI is finished (failed if any TI is `failed`
  or `upstream_failed`). Because each finishing TI checks after its own commit, the last one to
  commit always sees all the others finished. That follow-up (downstream evaluation, then the
  run's finish) is `dependencies.after_ti_finished`, which each finishing module imports under
  its name.
- the run context of `start` is loaded with a fixed number of queries (invariant 9).

One try per token (invariant 12): every function takes the `try_number` the worker's token was
issued for and refuses any other try than the TI's current one with `StaleTry` (HTTP 409,
`stale_try`), writing nothing. The check compares the row already read under the lock (start,
finish, retry), or sits in the conditional UPDATE's WHERE (success, heartbeat) and explains a
miss from the row read anyway, so it adds no statement under the TI lock. It comes before the
replay rule: a success of try 1 arriving after try 2 started is stale, never a "replay" of try 2.

Idempotency (invariant 4): a replayed start from the same hostname/unixname/pid while running, a
replayed success of a TI already in success, and a replayed failed/skipped/... of a TI already in
that state return "replayed" and write nothing. Any other transition from a non-running TI raises
`InvalidState` with `previous_state` (HTTP 409) and writes nothing.

Writes: the state of `TaskInstance` rows (created by `scheduling`, changed only here), a run's
`running` state when its first TI starts, `TaskReschedule`, `Trigger` (inserted by a deferral,
leased by triggerers, deleted once unused); a success's outbox row through
`outbox.rows.enqueue`, in the success's own transaction. It deletes nothing but unused
`Trigger` rows.

May import: every layer to its right (`runtime`, `outbox`, `watchers`, `registration`,
`scheduling`, `events_out`) and the shared packages; never a door.
"""

from dataclasses import dataclass
from uuid import UUID

from ..guards.exceptions import InvalidState, NotFound, StaleTry
from ..models import TaskInstance


@dataclass(frozen=True)
class StateChange:
    """What succeed / finish / retry did. `replayed`: the TI was already in the requested state
    and nothing was written."""

    ti_id: UUID
    state: str
    replayed: bool
    try_number: int


def not_found(ti_id: UUID) -> NotFound:
    return NotFound(f"task instance {ti_id} not found")


def not_running(ti: TaskInstance, action: str) -> InvalidState:
    return InvalidState(
        f"task instance is {ti.state}, not running, so it cannot be {action}",
        previous_state=ti.state,
    )


def check_try(ti: TaskInstance, try_number: int) -> None:
    if ti.try_number != try_number:
        raise StaleTry.of(ti_id=ti.id, token_try=try_number, current_try=ti.try_number)


def is_eligible_to_retry(*, try_number: int, max_tries: int) -> bool:
    return max_tries != 0 and try_number <= max_tries
