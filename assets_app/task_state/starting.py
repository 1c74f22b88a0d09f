"""queued -> running (`start`), and the run context a started TI gets (`load_run_context`).

The start holds the TI lock for its SELECT FOR UPDATE and one UPDATE; the DagRun becomes running
and the context (the DagRun, its consumed events with their assets and aliases) is loaded after
the commit, without the lock, with a fixed number of queries whatever the number of consumed
events (invariant 9).
"""

from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from django.db import transaction
from django.db.models import TextField
from django.db.models.functions import Cast
from django.utils import timezone

from ..guards import exceptions
from ..models import (
    AssetAliasEvent,
    AssetEvent,
    DagRun,
    TaskInstance,
    TaskReschedule,
    TIState,
)
from ..runtime import xcoms
from ..sql import locks
from ..sql import timeouts as timeouts_sql
from . import check_try, is_eligible_to_retry, not_found


@dataclass(frozen=True, slots=True)
class ConsumedEvent:
    """A consumed asset event as the run context shows it: the event's fields, its asset's
    name, uri and extra, and the names of the aliases it was emitted through (sorted).

    The two extras are the JSON text the database stores (a JSON object), not decoded: the
    worker API passes them through, and decoding thousands only to encode them again was a
    third of the response time."""

    id: int
    asset_name: str
    asset_uri: str
    asset_extra_json: str
    extra_json: str
    source_task_id: str | None
    source_dag_id: str | None
    source_run_id: str | None
    source_map_index: int | None
    timestamp: datetime
    source_alias_names: tuple[str, ...]


@dataclass(frozen=True)
class RunContext:
    """What `start` returns: the TI as it is now, its DagRun and the run's consumed events,
    oldest first."""

    ti: TaskInstance
    dag_run: DagRun
    consumed_events: list[ConsumedEvent]
    should_retry: bool
    replayed: bool
    # XCom keys an earlier try of this TI pushed (the SDK clears them before running again) and
    # how often this try was rescheduled (a sensor in reschedule mode).
    xcom_keys_to_clear: list[str] = field(default_factory=list)
    task_reschedule_count: int = 0


# --- DagRun follows its TIs (after the TI commit, no locks) -----------------------------------


def _mark_run_running(dag_run_id: int, *, now: datetime) -> None:
    # With its timeout due time (issue 39), in the same statement.
    timeouts_sql.mark_run_running(dag_run_id=dag_run_id, now=now)


# --- start ------------------------------------------------------------------------------------


def start(
    *,
    ti_id: UUID,
    try_number: int,
    hostname: str,
    unixname: str,
    pid: int,
    start_date: datetime,
) -> RunContext:
    """queued -> running, then load the run context.

    Transaction: one durable transaction holding the TI lock for SELECT FOR UPDATE + UPDATE.
    A replay (running, same hostname/unixname/pid) writes nothing and returns the context again.
    After the commit: the DagRun becomes running (if queued) and the context is loaded with a
    fixed number of queries (DagRun; events + assets; aliases).
    """
    now = timezone.now()
    with transaction.atomic(durable=True):
        ti = locks.lock_task_instance(ti_id)
        if ti is None:
            raise not_found(ti_id)
        check_try(ti, try_number)
        previous_state = ti.state
        replayed = previous_state == TIState.RUNNING and (ti.hostname, ti.unixname, ti.pid) == (
            hostname,
            unixname,
            pid,
        )
        if not replayed:
            if previous_state != TIState.QUEUED:
                raise exceptions.InvalidState(
                    "TI was not in a state where it could be marked as running",
                    previous_state=previous_state,
                )
            ti.state = TIState.RUNNING
            ti.hostname = hostname
            ti.unixname = unixname
            ti.pid = pid
            # Resuming from deferral keeps the first start (Airflow's `ti_run`: "don't update
            # start date when resuming from deferral", on `next_kwargs` being set).
            if not ti.next_kwargs or ti.start_date is None:
                ti.start_date = start_date
            ti.end_date = None
            ti.last_heartbeat_at = now
            ti.save(
                update_fields=[
                    "state",
                    "hostname",
                    "unixname",
                    "pid",
                    "start_date",
                    "end_date",
                    "last_heartbeat_at",
                    "updated_at",
                ]
            )
    if not replayed:
        _mark_run_running(ti.dag_run_id, now=now)
    return load_run_context(ti=ti, replayed=replayed)


def load_run_context(*, ti: TaskInstance, replayed: bool = False) -> RunContext:
    """Load the run context of a TI: 3 queries whatever the number of consumed events (DagRun;
    consumed events joined with their assets; their source aliases). No lock, no transaction.

    The events are read as value rows, not model instances: a run may have consumed thousands
    (5,000 AssetEvents with their assets and prefetched aliases took ~300 ms to build), and
    their extras stay JSON text (see `ConsumedEvent`)."""
    dag_run = DagRun.objects.get(id=ti.dag_run_id)
    events = load_consumed_events(dag_run_id=dag_run.id)
    return RunContext(
        ti=ti,
        dag_run=dag_run,
        consumed_events=events,
        should_retry=is_eligible_to_retry(try_number=ti.try_number, max_tries=ti.max_tries),
        replayed=replayed,
        # Not for a TI resuming from deferral (Airflow's `ti_run`: "do not clear it for
        # deferral"): its first part's XComs are its own.
        xcom_keys_to_clear=[] if ti.next_method else xcoms.keys_of(ti),
        task_reschedule_count=TaskReschedule.objects.filter(
            ti_id=ti.id, try_number=ti.try_number
        ).count(),
    )


def load_consumed_events(*, dag_run_id: int) -> list[ConsumedEvent]:
    """A run's consumed events, oldest first, with their assets and source aliases: 2 queries
    whatever their number (see `load_run_context`). No lock, no transaction."""
    aliases: dict[int, list[str]] = {}
    for event_id, alias_name in (
        AssetAliasEvent.objects.filter(asset_event__consumed_links__dag_run_id=dag_run_id)
        .order_by("asset_event_id", "alias__name")
        .values_list("asset_event_id", "alias__name")
    ):
        aliases.setdefault(event_id, []).append(alias_name)
    rows = (
        AssetEvent.objects.filter(consumed_links__dag_run_id=dag_run_id)
        .annotate(asset_extra_json=Cast("asset__extra", TextField()))
        .annotate(extra_json=Cast("extra", TextField()))
        .order_by("timestamp", "id")
        .values_list(
            "id",
            "asset__name",
            "asset__uri",
            "asset_extra_json",
            "extra_json",
            "source_task_id",
            "source_dag_id",
            "source_run_id",
            "source_map_index",
            "timestamp",
        )
    )
    return [ConsumedEvent(*row, tuple(aliases.get(row[0], ()))) for row in rows]
