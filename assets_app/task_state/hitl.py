"""Human-in-the-loop (issue 42), as Airflow 3.3.2 does it: a `HITLOperator` writes its request
(`upsert_request`), raises `TaskAwaitingInput` and its TI is parked in `awaiting_input` with its
`next_method` and no trigger (`await_input`); a person's response (`respond`, the public
`PATCH .../hitlDetails`) or the timeout sweep (`time_out_awaiting_input`) queues it again with
`next_kwargs["event"]` = the response, and the Task SDK resumes the task in `execute_complete`.

Sources: `api_fastapi/execution_api/routes/hitl.py` (the worker's upsert, response and read),
`routes/task_instances.py` (the `awaiting_input` state update), `core_api/routes/public/hitl.py`
(the response: 409 once answered, 403 for a user not assigned, 400 for options not offered or
several for a single choice), `models/hitl.py` `as_resume_event_payload` and the scheduler's
`check_awaiting_input_timeouts` (a response that landed first resumes with it; else the
defaults are applied as the response, `responded_by` null; else the task resumes with the
timeout error and fails in `execute_complete`). Airflow's TI becomes `scheduled` and its
scheduler queues it; here it becomes `queued` at once, as a deferral's resume does.

Locks: every write of a HITLDetail row happens under its TI's row lock (`locks.lock_task_instance`,
step 1), taken first, as Airflow takes the TI before the HITL row: the park, a response and the
sweep therefore serialize per TI, and a response racing the park resumes the TI exactly once.
Under the lock: the HITL row's read and one write, and the TI's one UPDATE.

Idempotency: a replayed park of a TI already awaiting input (same try) writes nothing (200); a
second response is refused (409), as Airflow refuses it; the worker's upsert of a request that
exists keeps it (and clears an old try's response, Airflow's rule).
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.db import transaction
from django.db.models import Min
from django.utils import timezone

from ..guards.exceptions import BadRequest, Conflict, NotFound, PermissionDenied
from ..models import HITLDetail, TaskInstance, TIState
from ..operations import audit
from ..sql import locks, wakeups
from . import StateChange, check_try, not_found, not_running
from .deferral import TRIGGER_FAIL_REPR

HITL_TIMEOUT_ERROR = "The Human-in-the-loop response timeout has passed without a response."


def _no_detail(ti_id: UUID) -> NotFound:
    return NotFound(
        "HITLDetail not found. This happens most likely due to clearing task instance before "
        "receiving response.",
        reason="not_found",
    )


# --- the worker's routes (`/execution/hitlDetails/{ti_id}`) -----------------------------------


def upsert_request(
    *,
    ti_id: UUID,
    try_number: int,
    options: list[str],
    subject: str,
    body: str | None,
    defaults: list[str] | None,
    multiple: bool,
    params: dict[str, Any],
    assigned_users: list[dict[str, str]],
) -> HITLDetail:
    """The task's request (Airflow's `upsert_hitl_detail`): created when the TI has none; kept
    as it is when it has one (a cleared TI asking again), its response cleared when it had one
    (a retry: only the latest response is kept). One durable transaction under the TI lock;
    a token of an earlier try writes nothing (StaleTry, invariant 12)."""
    with transaction.atomic(durable=True):
        ti = locks.lock_task_instance(ti_id)
        if ti is None:
            raise not_found(ti_id)
        check_try(ti, try_number)
        detail = HITLDetail.objects.filter(ti_id=ti_id).first()
        if detail is None:
            return HITLDetail.objects.create(
                ti_id=ti_id,
                options=options,
                subject=subject,
                body=body,
                defaults=defaults,
                multiple=multiple,
                params=params,
                assignees=assigned_users,
            )
        if detail.response_received:
            detail.responded_by = None
            detail.responded_at = None
            detail.chosen_options = None
            detail.params_input = {}
            detail.save(
                update_fields=["responded_by", "responded_at", "chosen_options", "params_input"]
            )
        return detail


def get_detail(*, ti_id: UUID) -> HITLDetail:
    detail = HITLDetail.objects.filter(ti_id=ti_id).first()
    if detail is None:
        raise _no_detail(ti_id)
    return detail


def worker_respond(
    *, ti_id: UUID, try_number: int, chosen_options: list[str], params_input: dict[str, Any]
) -> HITLDetail:
    """The task answering itself (the SDK's `update_hitl_detail_response`): no user, 409 once
    answered, 404 without a request, 409 `stale_try` for a token of an earlier try. Under the
    TI lock; it does not resume the TI (Airflow's route does not either)."""
    with transaction.atomic(durable=True):
        ti = locks.lock_task_instance(ti_id)
        if ti is None:
            raise not_found(ti_id)
        check_try(ti, try_number)
        detail = get_detail(ti_id=ti_id)
        if detail.response_received:
            raise Conflict(
                f"Human-in-the-loop detail for Task Instance with id {ti_id} already exists."
            )
        detail.responded_by = None
        detail.responded_at = timezone.now()
        detail.chosen_options = chosen_options
        detail.params_input = params_input
        detail.save(
            update_fields=["responded_by", "responded_at", "chosen_options", "params_input"]
        )
        return detail


# --- running -> awaiting_input ----------------------------------------------------------------


def await_input(
    *,
    ti_id: UUID,
    try_number: int,
    next_method: str,
    next_kwargs: dict[str, Any],
    timeout: timedelta | None,
) -> StateChange:
    """running -> awaiting_input (Airflow's `TIAwaitingInputStatePayload`): `next_method`,
    `next_kwargs` and `trigger_timeout = now + timeout` stored, no trigger. When the response
    arrived between the request and the park, the TI is queued again with it at once (Airflow's
    same rule, so that nothing strands an answered task). A replay while awaiting input is 200
    writing nothing; another state 409."""
    now = timezone.now()
    with transaction.atomic(durable=True):
        ti = locks.lock_task_instance(ti_id)
        if ti is None:
            raise not_found(ti_id)
        check_try(ti, try_number)
        if ti.state == TIState.AWAITING_INPUT:
            return StateChange(ti_id=ti.id, state=ti.state, replayed=True, try_number=try_number)
        if ti.state != TIState.RUNNING:
            raise not_running(ti, "awaiting_input")
        detail = HITLDetail.objects.filter(ti_id=ti_id).first()
        ti.next_method = next_method
        if detail is not None and detail.response_received:
            ti.next_kwargs = _with_event(next_kwargs, resume_event(detail, timedout=False))
            _queue_again(ti, now=now)
        else:
            ti.state = TIState.AWAITING_INPUT
            ti.next_kwargs = next_kwargs
            ti.trigger_timeout = now + timeout if timeout is not None else None
            ti.updated_at = now
            if ti.trigger_timeout is not None:
                wakeups.wake(wakeups.TRIGGERS)  # delivered on commit
        ti.save(update_fields=_TI_FIELDS)
    return StateChange(ti_id=ti.id, state=ti.state, replayed=False, try_number=try_number)


_TI_FIELDS = [
    "state",
    "next_method",
    "next_kwargs",
    "trigger_timeout",
    "queued_at",
    "retry_at",
    "claimed_by",
    "claimed_at",
    "updated_at",
]


def _queue_again(ti: TaskInstance, *, now: datetime) -> None:
    """Back in line for a worker, same try, as a deferral's resume (`deferral._resume_values`)."""
    ti.state = TIState.QUEUED
    ti.trigger_timeout = None
    ti.queued_at = now
    ti.retry_at = None
    ti.claimed_by = ""
    ti.claimed_at = None
    ti.updated_at = now


# --- the response ------------------------------------------------------------------------------


def serde_datetime(value: datetime) -> dict[str, Any]:
    """A UTC datetime as the Task SDK's serde encodes Airflow's `timezone.utcnow()` (so that
    `execute_complete` gets a datetime back, and calls `.isoformat()` on it)."""
    return {
        "__classname__": "datetime.datetime",
        "__version__": 2,
        "__data__": {
            "timestamp": value.timestamp(),
            "tz": {
                "__classname__": "builtins.tuple",
                "__version__": 1,
                "__data__": ["UTC", "pendulum.tz.timezone.Timezone", 1, True],
            },
        },
    }


def resume_event(detail: HITLDetail, *, timedout: bool) -> dict[str, Any]:
    """Airflow's `HITLDetail.as_resume_event_payload`, serde-encoded."""
    return {
        "chosen_options": list(detail.chosen_options or []),
        "params_input": detail.params_input or {},
        "responded_at": serde_datetime(detail.responded_at) if detail.responded_at else None,
        "responded_by_user": (
            {"id": detail.responded_by["id"], "name": detail.responded_by["name"]}
            if detail.responded_by
            else None
        ),
        "timedout": timedout,
    }


def _with_event(next_kwargs: Any, event: dict[str, Any]) -> Any:
    return {**(next_kwargs if isinstance(next_kwargs, dict) else {}), "event": event}


@dataclass(frozen=True)
class Responder:
    """Who answers: Airflow's `HITLUser` (`id` as a string, `name`)."""

    id: str
    name: str


def respond(
    *,
    dag_id: str,
    run_id: str,
    task_id: str,
    map_index: int,
    responder: Responder,
    chosen_options: list[str],
    params_input: dict[str, Any],
    actor: audit.Actor,
) -> HITLDetail:
    """A person's response (Airflow's public `update_hitl_detail`): refused once answered
    (409), by a user not among the assigned ones when some are (403), with options not offered
    or several for a single choice (400). Stored with its responder, and a TI awaiting input
    is queued again with the response as its event; audited in the same transaction. One
    durable transaction: the TI lock, then its HITL row, the TI's UPDATE, the audit entry."""
    ti_id = (
        TaskInstance.objects.filter(
            dag_id=dag_id, dag_run__run_id=run_id, task_id=task_id, map_index=map_index
        )
        .values_list("id", flat=True)
        .first()
    )
    if ti_id is None:
        raise NotFound(
            f"The Task Instance with dag_id: `{dag_id}`, run_id: `{run_id}`, task_id: "
            f"`{task_id}` and map_index: `{map_index}` was not found"
        )
    now = timezone.now()
    with transaction.atomic(durable=True):
        ti = locks.lock_task_instance(ti_id)
        if ti is None:
            raise not_found(ti_id)
        detail = HITLDetail.objects.filter(ti_id=ti_id).first()
        if detail is None:
            raise NotFound(
                f"Human-in-the-loop detail does not exist for Task Instance with id {ti_id}"
            )
        if detail.response_received:
            raise Conflict(
                "Human-in-the-loop detail has already been updated for Task Instance with id "
                f"{ti_id} and is not allowed to write again."
            )
        if detail.assignees and responder.id not in {u["id"] for u in detail.assignees}:
            raise PermissionDenied(
                f"User={responder.name} (id={responder.id}) is not a respondent for the task."
            )
        allowed = set(detail.options or [])
        if invalid := set(chosen_options) - allowed:
            raise BadRequest(
                f"Invalid options {sorted(invalid)}; allowed options are {sorted(allowed)}."
            )
        if not detail.multiple and len(chosen_options) > 1:
            raise BadRequest(
                "Multiple options chosen but this Human-in-the-loop task accepts only a "
                "single option."
            )
        detail.responded_by = {"id": responder.id, "name": responder.name}
        detail.responded_at = now
        detail.chosen_options = chosen_options
        detail.params_input = params_input
        detail.save(
            update_fields=["responded_by", "responded_at", "chosen_options", "params_input"]
        )
        if ti.state == TIState.AWAITING_INPUT:
            ti.next_kwargs = _with_event(ti.next_kwargs, resume_event(detail, timedout=False))
            _queue_again(ti, now=now)
            ti.save(update_fields=_TI_FIELDS)
        audit.record(
            actor=actor,
            action="hitl_respond",
            summary=f"answered {dag_id}.{task_id}[{map_index}] ({run_id}): "
            f"{', '.join(chosen_options)}",
            targets=[audit.Target(kind="task_instance", object_id=ti_id, ti_id=ti_id)],
            dag_id=dag_id,
            detail={
                "task_id": task_id,
                "map_index": map_index,
                "chosen_options": chosen_options,
                "params_input": params_input,
                "responded_by": detail.responded_by,
            },
        )
    return detail


# --- the timeout sweep (the timers process) ----------------------------------------------------


def time_out_awaiting_input(*, now: datetime | None = None, batch: int = 100) -> int:
    """TIs awaiting input past their `trigger_timeout`, resumed as Airflow's scheduler
    `check_awaiting_input_timeouts` resumes them: with a response that landed first; else with
    the defaults written as the response (`responded_by` null, `timedout` true; the params'
    values as `params_input`); else with the timeout error, which `execute_complete` raises
    (`HITLTimeoutError`: the try fails or retries). Each TI in its own short transaction under
    its lock (a response racing the sweep wins or loses whole). How many were resumed."""
    now = now or timezone.now()
    due = list(
        TaskInstance.objects.filter(
            state=TIState.AWAITING_INPUT, trigger_timeout__lt=now
        ).values_list("id", flat=True)[:batch]
    )
    resumed = 0
    for ti_id in due:
        with transaction.atomic(durable=True):
            ti = locks.lock_task_instance(ti_id)
            if ti is None or ti.state != TIState.AWAITING_INPUT:
                continue
            detail = HITLDetail.objects.filter(ti_id=ti_id).first()
            event: dict[str, Any]
            if detail is not None and detail.response_received:
                event = resume_event(detail, timedout=False)
            elif detail is not None and detail.defaults is not None:
                detail.chosen_options = list(detail.defaults)
                detail.params_input = {
                    key: value["value"] if isinstance(value, dict) and "value" in value else value
                    for key, value in (detail.params or {}).items()
                }
                detail.responded_by = None
                detail.responded_at = now
                detail.save(
                    update_fields=["responded_by", "responded_at", "chosen_options", "params_input"]
                )
                event = resume_event(detail, timedout=True)
            else:
                event = {"error": HITL_TIMEOUT_ERROR, "error_type": "timeout"}
            if isinstance(ti.next_kwargs, dict) or ti.next_kwargs is None:
                ti.next_kwargs = _with_event(ti.next_kwargs, event)
            else:
                ti.next_method = TRIGGER_FAIL_REPR
                ti.next_kwargs = {"error": "Could not resume the task", "traceback": []}
            _queue_again(ti, now=now)
            ti.save(update_fields=_TI_FIELDS)
            resumed += 1
    return resumed


def next_timeout_at() -> datetime | None:
    """The earliest response deadline of a TI awaiting input (`ti_awaiting_input_timeout`)."""
    return TaskInstance.objects.filter(state=TIState.AWAITING_INPUT).aggregate(
        due=Min("trigger_timeout")
    )["due"]
