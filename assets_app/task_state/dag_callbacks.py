"""Dag callback requests, the worker's side (issue 39): `bin/airflow-worker` claims the
requests a run's finish wrote (`sql.callbacks`, in the finish's transaction) and reports how
its callbacks went.

- `claim`: a lease on up to `limit` due requests (SKIP LOCKED, `locks.claim_dag_callbacks`,
  for `DAG_CALLBACK_LEASE_SECONDS`), with what Airflow's `DagCallbackRequest` carries: the Dag
  file, the run, its last relevant TI and the reason. A worker that dies mid-callback never
  reports; its request is due again when the lease ends (at least once, as a callback the
  dag-processor was running when it died is in Airflow, where it is lost instead), and parked
  after `DAG_CALLBACK_MAX_ATTEMPTS` claims without a report.
- `report`: `success` (every callback ran) or `failed` (one raised, or the Dag could not be
  loaded: the traceback kept), for the attempt the claim handed out. The run's state is never
  changed, as in Airflow (`_execute_dag_callbacks` logs a callback's exception and goes on).

Writes: `DagCallbackRequest` rows' lease and outcome (inserted by `sql.callbacks` for the
finish).
"""

from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ..guards.exceptions import InvalidState, NotFound
from ..models import CallbackState, Dag, DagCallbackRequest, DagRun, TaskInstance
from ..sql import locks
from .starting import ConsumedEvent, load_consumed_events


@dataclass(frozen=True)
class ClaimedCallback:
    """One leased request: `attempt` is what its report names."""

    request: DagCallbackRequest
    attempt: int
    dag_rel_path: str
    dag_run: DagRun
    consumed_events: list[ConsumedEvent]
    last_ti: TaskInstance | None


def claim(*, claimed_by: str, limit: int) -> list[ClaimedCallback]:
    """Lease up to `limit` due requests to `claimed_by` (one durable transaction of one
    statement), then read what each needs, unlocked: the requests, their runs, Dags and last
    TIs (4 queries) and each run's consumed events (2 each)."""
    now = timezone.now()
    lease_until = now + timedelta(seconds=float(settings.DAG_CALLBACK_LEASE_SECONDS))
    if limit <= 0:
        return []
    with transaction.atomic(durable=True):
        leased = locks.claim_dag_callbacks(
            claimed_by=claimed_by,
            limit=limit,
            now=now,
            lease_until=lease_until,
            max_attempts=int(settings.DAG_CALLBACK_MAX_ATTEMPTS),
        )
    if not leased:
        return []
    requests = DagCallbackRequest.objects.in_bulk([pk for pk, _ in leased])
    runs = DagRun.objects.in_bulk({r.dag_run_id for r in requests.values()})
    files = dict(
        Dag.objects.filter(dag_id__in={r.dag_id for r in requests.values()}).values_list(
            "dag_id", "fileloc"
        )
    )
    tis = TaskInstance.objects.in_bulk(
        [r.last_ti_id for r in requests.values() if r.last_ti_id is not None]
    )
    claimed = []
    for pk, attempt in leased:
        request = requests[pk]
        claimed.append(
            ClaimedCallback(
                request=request,
                attempt=attempt,
                dag_rel_path=files.get(request.dag_id, ""),
                dag_run=runs[request.dag_run_id],
                consumed_events=load_consumed_events(dag_run_id=request.dag_run_id),
                last_ti=tis.get(request.last_ti_id) if request.last_ti_id else None,
            )
        )
    return claimed


@dataclass(frozen=True)
class Reported:
    state: str
    replayed: bool


def report(
    *, request_id: int, attempt: int, state: Literal["success", "failed"], error: str = ""
) -> Reported:
    """End request `request_id`'s `attempt` in `state` (`error`: the traceback of a failure).
    One conditional UPDATE (autocommit). Idempotent: the same report again answers
    `replayed` and writes nothing; a report of another attempt than the request's last
    claim, or of a request ended otherwise or parked, is refused (409) and writes nothing."""
    now = timezone.now()
    changed = DagCallbackRequest.objects.filter(
        id=request_id, attempts=attempt, state=CallbackState.PENDING
    ).update(state=state, finished_at=now, lease_until=None, last_error=error)
    if changed:
        return Reported(state=state, replayed=False)
    found = DagCallbackRequest.objects.filter(id=request_id).values("state", "attempts").first()
    if found is None:
        raise NotFound(f"Dag callback request {request_id} not found")
    if found["state"] == state and found["attempts"] == attempt:
        return Reported(state=state, replayed=True)
    raise InvalidState(
        f"Dag callback request {request_id} is {found['state']} at attempt "
        f"{found['attempts']}; a report of attempt {attempt} as {state} changes nothing",
        previous_state=found["state"],
    )
