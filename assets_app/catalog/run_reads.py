"""Reading DAG runs and task instances for the public API (`/api/v2/dags/{dag_id}/dagRuns/...`),
with Airflow 3.3.2's filters, orderings and offset or cursor pages. No transaction, no locks, a
fixed number of queries per page whatever its size. Runs are written by `runs`, `scheduling` and
`task_state` only.

`~` as a Dag id (and, for task instances, as a run id) means "every Dag" / "every run", as in
Airflow. A run's `duration` is end - start in seconds; its `updated_at` is the latest of the times
it was created, queued, started and ended (the service keeps no separate update time).
"""

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.db.models import (
    DateTimeField,
    DurationField,
    ExpressionWrapper,
    F,
    Q,
    QuerySet,
    TextField,
    Value,
)
from django.db.models.functions import Cast, Coalesce, Greatest

from ..guards import exceptions
from ..models import Dag, DagRun, DagRunState, Task, TaskInstance, TIState
from . import listing

ALL = "~"

# Airflow 3.3.2's grid summarises a mapped task's TIs as the first of these states any of them
# is in (`api_fastapi.common.parameters.state_priority`, used by `services.ui.grid.agg_state`);
# None is "no status". The states this service has no equivalent of are left out.
MAPPED_STATE_PRIORITY: tuple[str | None, ...] = (
    TIState.FAILED,
    TIState.UPSTREAM_FAILED,
    TIState.UP_FOR_RETRY,
    TIState.RUNNING,
    TIState.DEFERRED,
    TIState.AWAITING_INPUT,
    TIState.QUEUED,
    TIState.SCHEDULED,
    None,
    TIState.SUCCESS,
    TIState.SKIPPED,
    TIState.REMOVED,
)


def mapped_state(states: Sequence[str | None]) -> str | None:
    """The one state a mapped task's TIs show as (Airflow's grid `agg_state`)."""
    present = set(states)
    return next((state for state in MAPPED_STATE_PRIORITY if state in present), None)


def state_counts(states: Sequence[str | None]) -> list[tuple[str, int]]:
    """(state, count) of a mapped task's TIs, in MAPPED_STATE_PRIORITY order ("none": no
    status), e.g. [("running", 3), ("success", 10)]."""
    counts: dict[str | None, int] = {}
    for state in states:
        counts[state] = counts.get(state, 0) + 1
    order = {state: i for i, state in enumerate(MAPPED_STATE_PRIORITY)}
    return [
        (state or "none", n)
        for state, n in sorted(counts.items(), key=lambda kv: order.get(kv[0], len(order)))
    ]


# Airflow's DagRunState / TaskInstanceState values; "none" (and "no_status") ask for no state.
AIRFLOW_RUN_STATES = ("queued", "running", "success", "failed")
AIRFLOW_RUN_TYPES = (
    "backfill",
    "scheduled",
    "manual",
    "operator_triggered",
    "asset_triggered",
    "asset_materialization",
)
AIRFLOW_TI_STATES = (
    "removed",
    "scheduled",
    "queued",
    "running",
    "success",
    "restarting",
    "failed",
    "up_for_retry",
    "up_for_reschedule",
    "upstream_failed",
    "skipped",
    "deferred",
    "awaiting_input",
)
# Every TI state of this service as Airflow names it; None is Airflow's "no status". A state
# missing here is a test failure (tests/api/test_public_runs.py), not a silent null.
TI_STATE_TO_AIRFLOW: dict[str, str | None] = {
    TIState.SCHEDULED: "scheduled",
    TIState.QUEUED: "queued",
    TIState.RUNNING: "running",
    TIState.SUCCESS: "success",
    TIState.FAILED: "failed",
    TIState.UP_FOR_RETRY: "up_for_retry",
    TIState.SKIPPED: "skipped",
    TIState.REMOVED: "removed",
    TIState.UPSTREAM_FAILED: "upstream_failed",
    TIState.DEFERRED: "deferred",
    TIState.AWAITING_INPUT: "awaiting_input",
}


def airflow_ti_state(state: str | None) -> str | None:
    return None if state is None else TI_STATE_TO_AIRFLOW.get(state)


def _run_duration(prefix: str = "") -> ExpressionWrapper:
    return ExpressionWrapper(
        F(f"{prefix}end_date") - F(f"{prefix}start_date"), output_field=DurationField()
    )


def _run_updated_at() -> Greatest:
    created = F("created_at")
    return Greatest(
        created,
        Coalesce("queued_at", created),
        Coalesce("start_date", created),
        Coalesce("end_date", created),
        output_field=DateTimeField(),
    )


RUN_ORDERING = listing.Ordering(
    keys={
        "id": "id",
        "state": "state",
        "dag_id": "dag_id",
        "run_id": "run_id",
        "dag_run_id": "run_id",
        "logical_date": "logical_date",
        "partition_date": Value(None, output_field=DateTimeField()),
        "run_after": "run_after",
        "start_date": "start_date",
        "end_date": "end_date",
        "updated_at": _run_updated_at(),
        "conf": Cast("conf", TextField()),
        "duration": _run_duration(),
    },
    default=("id",),
)
TI_ORDERING = listing.Ordering(
    keys={
        "id": "id",
        "state": "state",
        "duration": _run_duration(),
        "start_date": "start_date",
        "end_date": "end_date",
        "map_index": "map_index",
        "try_number": "try_number",
        "logical_date": "dag_run__logical_date",
        "run_after": "dag_run__run_after",
        "data_interval_start": "dag_run__data_interval_start",
        "data_interval_end": "dag_run__data_interval_end",
        # Rendered map indexes are not kept: Airflow orders those equal by map_index.
        "rendered_map_index": "map_index",
        "operator": Value(None, output_field=TextField()),
    },
    default=("map_index",),
)


# Longer than any run (about 317 years), far inside what timedelta and PostgreSQL's interval hold.
MAX_DURATION_SECONDS = 10**10


def _seconds(value: float | None, *, field: str) -> timedelta | None:
    """A duration filter in seconds; a value no run could have (or not a number) is a 422."""
    if value is None:
        return None
    if not math.isfinite(value) or abs(value) > MAX_DURATION_SECONDS:
        raise exceptions.InvalidInput(
            f"{field} must be a number of seconds within +/-{MAX_DURATION_SECONDS:.0e}",
            reason="invalid_duration",
            loc=("query", field),
        )
    return timedelta(seconds=value)


def _states(values: Sequence[str], allowed: Sequence[str], what: str) -> tuple[list[str], bool]:
    """(states, also no state) from Airflow's `state` list; an unknown value is a 422."""
    states: list[str] = []
    none = False
    for value in values:
        if value in ("none", "no_status"):
            none = True
        elif value in allowed:
            states.append(value)
        else:
            raise exceptions.InvalidInput(
                f"Invalid value for {what}. Valid values are {', '.join(allowed)}",
                reason=f"invalid_{what.replace(' ', '_')}",
                loc=("query", "state" if what == "state" else "run_type"),
            )
    return states, none


def _check_dag(dag_id: str) -> None:
    if dag_id != ALL and not Dag.objects.filter(dag_id=dag_id).exists():
        raise exceptions.NotFound(
            f"The Dag with ID: `{dag_id}` was not found", reason="dag_not_found", dag_id=dag_id
        )


@dataclass(frozen=True, kw_only=True)
class Ranges:
    """Airflow's range filters of runs and task instances, `<param>_gte/_gt/_lte/_lt`, declared
    once; `RUN_RANGES` and `TI_RANGES` say which field of each queryset a param filters."""

    run_after_gte: datetime | None = None
    run_after_gt: datetime | None = None
    run_after_lte: datetime | None = None
    run_after_lt: datetime | None = None
    logical_date_gte: datetime | None = None
    logical_date_gt: datetime | None = None
    logical_date_lte: datetime | None = None
    logical_date_lt: datetime | None = None
    start_date_gte: datetime | None = None
    start_date_gt: datetime | None = None
    start_date_lte: datetime | None = None
    start_date_lt: datetime | None = None
    end_date_gte: datetime | None = None
    end_date_gt: datetime | None = None
    end_date_lte: datetime | None = None
    end_date_lt: datetime | None = None
    duration_gte: float | None = None
    duration_gt: float | None = None
    duration_lte: float | None = None
    duration_lt: float | None = None
    updated_at_gte: datetime | None = None
    updated_at_gt: datetime | None = None
    updated_at_lte: datetime | None = None
    updated_at_lt: datetime | None = None


@dataclass(frozen=True)
class Range:
    """One range filter: the filters' `param` on the queryset's `field` (`param` by default);
    `seconds`: a duration given in seconds."""

    param: str
    field: str | None = None
    seconds: bool = False


RUN_RANGES = (
    Range("run_after"),
    Range("logical_date"),
    Range("start_date"),
    Range("end_date"),
    Range("duration", seconds=True),
    Range("updated_at"),
)
TI_RANGES = (
    Range("run_after", "dag_run__run_after"),
    Range("logical_date", "dag_run__logical_date"),
    Range("start_date"),
    Range("end_date"),
    Range("updated_at"),
    Range("duration", seconds=True),
)
_BOUNDS = ("gte", "gt", "lte", "lt")


def _ranges_q(f: Ranges, table: Sequence[Range]) -> Q:
    """Every range of `table` that `f` asks for; a duration no run could have is a 422."""
    q = Q()
    for r in table:
        bounds = {b: getattr(f, f"{r.param}_{b}") for b in _BOUNDS}
        if r.seconds:
            bounds = {b: _seconds(v, field=f"{r.param}_{b}") for b, v in bounds.items()}
        q &= listing.range_q(r.field or r.param, **bounds, param=r.param)
    return q


@dataclass(frozen=True, kw_only=True)
class RunFilters(Ranges):
    """Airflow's `GET /dags/{dag_id}/dagRuns` filters (also `POST .../dagRuns/list`)."""

    dag_ids: Sequence[str] | None = None
    conf_contains: str | None = None
    run_type: Sequence[str] = ()
    state: Sequence[str] = ()
    dag_version: Sequence[int] = ()
    bundle_version: str | None = None
    run_id_pattern: str | None = None
    run_id_prefix_pattern: str | None = None
    triggering_user_name_pattern: str | None = None
    triggering_user_name_prefix_pattern: str | None = None
    dag_id_pattern: str | None = None
    dag_id_prefix_pattern: str | None = None
    partition_key_pattern: str | None = None
    partition_key_prefix_pattern: str | None = None
    consuming_asset_pattern: str | None = None
    partition_date_gte: Any = None
    partition_date_lte: Any = None


def _run_queryset(dag_id: str, f: RunFilters) -> QuerySet[DagRun]:
    if f.partition_date_gte is not None or f.partition_date_lte is not None:
        if dag_id == ALL:
            raise exceptions.BadRequest(
                "partition_date_gte and partition_date_lte require a specific dag_id.",
                reason="partition_dates_need_dag",
            )
        _check_dag(dag_id)
        raise exceptions.BadRequest(
            f"Dag with dag_id: '{dag_id}' is not partitioned; partition_date_gte and "
            "partition_date_lte are not supported.",
            reason="dag_not_partitioned",
        )
    _check_dag(dag_id)
    runs = DagRun.objects.annotate(duration=_run_duration(), updated_at=_run_updated_at())
    if dag_id != ALL:
        runs = runs.filter(dag_id=dag_id)
    if f.dag_ids is not None:
        runs = runs.filter(dag_id__in=list(f.dag_ids))
    q = (
        _ranges_q(f, RUN_RANGES)
        & listing.pattern_q("run_id", f.run_id_pattern)
        & listing.prefix_q("run_id", f.run_id_prefix_pattern)
        & listing.pattern_q("triggering_user_name", f.triggering_user_name_pattern)
        & listing.prefix_q("triggering_user_name", f.triggering_user_name_prefix_pattern)
        # The Dag's own column (issue 26): `dag_id` is the foreign key's, which has no ilike
        # or startswith lookup (every request with one was a 500 `Unsupported lookup`).
        & listing.pattern_q("dag__dag_id", f.dag_id_pattern)
        & listing.prefix_q("dag__dag_id", f.dag_id_prefix_pattern)
    )
    if f.conf_contains:
        runs = runs.annotate(conf_text=Cast("conf", TextField()))
        q &= Q(conf_text__contains=f.conf_contains)
    if f.state:
        states, none = _states(f.state, AIRFLOW_RUN_STATES, "state")
        q &= Q(state__in=states) | (Q(state__isnull=True) if none else Q(pk__in=[]))
    if f.run_type:
        types, none = _states(f.run_type, AIRFLOW_RUN_TYPES, "run type")
        q &= Q(run_type__in=types)
    # No Dag versions, bundle versions or partition keys here: asking for one matches nothing.
    if f.dag_version or f.bundle_version is not None:
        q &= Q(pk__in=[])
    if f.partition_key_pattern is not None or f.partition_key_prefix_pattern is not None:
        q &= Q(pk__in=[])
    if f.consuming_asset_pattern:
        pattern = f.consuming_asset_pattern
        q &= Q(consumed_events__asset__name__icontains=pattern) | Q(
            consumed_events__asset__uri__icontains=pattern
        )
        runs = runs.filter(q).distinct()
        return DagRun.objects.filter(pk__in=runs.values("pk")).annotate(
            duration=_run_duration(), updated_at=_run_updated_at()
        )
    return runs.filter(q)


def list_runs(
    *,
    dag_id: str,
    filters: RunFilters,
    order_by: Sequence[str] | None = None,
    limit: int = listing.DEFAULT_PAGE_LIMIT,
    offset: int = 0,
    cursor: str | None = None,
) -> listing.Page:
    """A page of runs of `dag_id` (or of every Dag for `~`). NotFound for an unknown Dag. 3
    queries (Dag check, count, page); no locks."""
    runs = _run_queryset(dag_id, filters)
    return listing.page_of(
        runs, RUN_ORDERING, order_by=order_by, limit=limit, offset=offset, cursor=cursor
    )


def get_run(*, dag_id: str, run_id: str) -> DagRun:
    run = (
        DagRun.objects.annotate(duration=_run_duration())
        .filter(dag_id=dag_id, run_id=run_id)
        .first()
    )
    if run is None:
        raise exceptions.NotFound(
            f"The DagRun with dag_id: `{dag_id}` and run_id: `{run_id}` was not found",
            reason="dag_run_not_found",
        )
    return run


def run_state(*, dag_id: str, run_id: str) -> str | None:
    """The run's state, or None when it does not exist (any more). One query."""
    return (
        DagRun.objects.filter(dag_id=dag_id, run_id=run_id).values_list("state", flat=True).first()
    )


FINISHED_RUN_STATES = frozenset({DagRunState.SUCCESS, DagRunState.FAILED})


@dataclass(frozen=True, kw_only=True)
class TIFilters(Ranges):
    """Airflow's `GET .../taskInstances` filters (also the batch body). Pools, queues,
    executors, operators and rendered map indexes have one value here (Airflow's defaults:
    pool `default_pool`, queue `default`, no executor / operator / rendered index)."""

    task_id: str | None = None
    task_ids: Sequence[str] | None = None
    dag_ids: Sequence[str] | None = None
    dag_run_ids: Sequence[str] | None = None
    task_display_name_pattern: str | None = None
    task_display_name_prefix_pattern: str | None = None
    task_group_id: str | None = None
    dag_id_pattern: str | None = None
    dag_id_prefix_pattern: str | None = None
    run_id_pattern: str | None = None
    run_id_prefix_pattern: str | None = None
    state: Sequence[str | None] = ()
    pool: Sequence[str] = ()
    pool_name_pattern: str | None = None
    pool_name_prefix_pattern: str | None = None
    queue: Sequence[str] = ()
    queue_name_pattern: str | None = None
    queue_name_prefix_pattern: str | None = None
    executor: Sequence[str] = ()
    version_number: Sequence[int] = ()
    try_number: Sequence[int] = ()
    operator: Sequence[str] = ()
    operator_name_pattern: str | None = None
    operator_name_prefix_pattern: str | None = None
    map_index: Sequence[int] = ()
    rendered_map_index_pattern: str | None = None
    rendered_map_index_prefix_pattern: str | None = None


DEFAULT_POOL = "default_pool"
DEFAULT_QUEUE = "default"


def _constant_pattern(value: str, pattern: str | None, prefix: str | None) -> Q:
    """`*_pattern` / `*_prefix_pattern` on a field every TI has the same `value` of."""
    q = Q()
    if pattern is not None:
        terms = ["%" if t == "~" else t for t in pattern.split("|") if t.strip()] or [pattern]
        if not any(_like(value, t) for t in terms):
            q &= Q(pk__in=[])
    if prefix is not None:
        terms = [t.strip() for t in prefix.split("|") if t.strip()] or [prefix]
        if not any(t == "~" or value.startswith(t) for t in terms):
            q &= Q(pk__in=[])
    return q


def _like(value: str, term: str) -> bool:
    regex = "".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in term)
    return re.search(regex, value, re.IGNORECASE | re.DOTALL) is not None


def _ti_queryset(dag_id: str, run_id: str, f: TIFilters) -> QuerySet[TaskInstance]:
    tis = TaskInstance.objects.select_related("dag_run", "trigger").annotate(
        duration=_run_duration()
    )
    if run_id != ALL:
        if dag_id == ALL:
            raise exceptions.BadRequest(
                "dag_id is required when dag_run_id is specified", reason="dag_id_required"
            )
        if not DagRun.objects.filter(dag_id=dag_id, run_id=run_id).exists():
            raise exceptions.NotFound(
                f"DagRun with dag_id: `{dag_id}` and run_id: `{run_id}` was not found",
                reason="dag_run_not_found",
            )
        tis = tis.filter(dag_id=dag_id, run_id=run_id)
    elif dag_id != ALL:
        _check_dag(dag_id)
        tis = tis.filter(dag_id=dag_id)
    if f.task_group_id is not None:
        raise exceptions.NotFound(
            f"Task group {f.task_group_id} not found", reason="task_group_not_found"
        )
    q = (
        _ranges_q(f, TI_RANGES)
        & listing.pattern_q("task_id", f.task_display_name_pattern)
        & listing.prefix_q("task_id", f.task_display_name_prefix_pattern)
        & listing.pattern_q("dag_id", f.dag_id_pattern)
        & listing.prefix_q("dag_id", f.dag_id_prefix_pattern)
        & listing.pattern_q("run_id", f.run_id_pattern)
        & listing.prefix_q("run_id", f.run_id_prefix_pattern)
        & listing.constant_q(DEFAULT_POOL, f.pool)
        & listing.constant_q(DEFAULT_QUEUE, f.queue)
        & _constant_pattern(DEFAULT_POOL, f.pool_name_pattern, f.pool_name_prefix_pattern)
        & _constant_pattern(DEFAULT_QUEUE, f.queue_name_pattern, f.queue_name_prefix_pattern)
    )
    if f.task_id is not None:
        q &= Q(task_id=f.task_id)
    if f.task_ids is not None:
        q &= Q(task_id__in=list(f.task_ids))
    if f.dag_ids is not None:
        q &= Q(dag_id__in=list(f.dag_ids))
    if f.dag_run_ids is not None:
        q &= Q(run_id__in=list(f.dag_run_ids))
    if f.try_number:
        q &= Q(try_number__in=list(f.try_number))
    if f.map_index:
        q &= Q(map_index__in=list(f.map_index))
    if f.state:
        states, none = _states(
            [("none" if s is None else s) for s in f.state], AIRFLOW_TI_STATES, "state"
        )
        ours = [s for s, a in TI_STATE_TO_AIRFLOW.items() if a in states]
        unnamed = [s for s, a in TI_STATE_TO_AIRFLOW.items() if a is None]
        state_q = Q(state__in=ours)
        if none:
            state_q |= Q(state__isnull=True) | Q(state__in=unnamed)
        q &= state_q
    # No executors, operators, Dag versions or rendered map indexes: asking for one matches none.
    if f.executor or f.operator or f.version_number:
        q &= Q(pk__in=[])
    for pattern in (
        f.operator_name_pattern,
        f.operator_name_prefix_pattern,
        f.rendered_map_index_pattern,
        f.rendered_map_index_prefix_pattern,
    ):
        if pattern is not None:
            q &= Q(pk__in=[])
    return tis.filter(q)


def list_task_instances(
    *,
    dag_id: str,
    run_id: str,
    filters: TIFilters,
    order_by: Sequence[str] | None = None,
    limit: int = listing.DEFAULT_PAGE_LIMIT,
    offset: int = 0,
    cursor: str | None = None,
) -> listing.Page:
    """A page of TIs of one run (or, with `~`, of every run / Dag), each with its run loaded.
    NotFound for an unknown Dag or run; BadRequest for a run id with `~` as Dag. 3 queries
    (check, count, page); no locks."""
    tis = _ti_queryset(dag_id, run_id, filters)
    return listing.page_of(
        tis, TI_ORDERING, order_by=order_by, limit=limit, offset=offset, cursor=cursor
    )


def list_mapped_task_instances(
    *,
    dag_id: str,
    run_id: str,
    task_id: str,
    filters: TIFilters,
    order_by: Sequence[str] | None = None,
    limit: int = listing.DEFAULT_PAGE_LIMIT,
    offset: int = 0,
) -> listing.Page:
    """A page of a mapped task's map indexes in one run (Airflow 3.3.2's
    `GET .../taskInstances/{task_id}/listMapped`: ordered by map_index unless asked, the same
    filters). NotFound for an unknown run or task, and for a task that is not mapped (Airflow's
    "Task id ... is not mapped"); a mapped task not expanded yet, or expanded to nothing, is an
    empty page. 4 queries; no locks."""
    tis = _ti_queryset(dag_id, run_id, replace(filters, task_id=task_id, task_ids=None))
    task = Task.objects.filter(dag_id=dag_id, task_id=task_id).first()
    if task is None or not task.is_mapped:
        raise exceptions.NotFound(
            f"Task id {task_id} {'not found' if task is None else 'is not mapped'}",
            reason="task_not_found" if task is None else "task_not_mapped",
        )
    return listing.page_of(
        tis.filter(map_index__gte=0), TI_ORDERING, order_by=order_by, limit=limit, offset=offset
    )


def get_task_instance(
    *, dag_id: str, run_id: str, task_id: str, map_index: int = -1
) -> TaskInstance:
    ti = (
        TaskInstance.objects.select_related("dag_run", "trigger")
        .annotate(duration=_run_duration())
        .filter(dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=map_index)
        .first()
    )
    if ti is None:
        mapped = (
            map_index == -1
            and TaskInstance.objects.filter(
                dag_id=dag_id, run_id=run_id, task_id=task_id, map_index__gte=0
            ).exists()
        )
        raise exceptions.NotFound(
            # Airflow 3.3.2's words for a mapped task asked for without its map index.
            "Task instance is mapped, add the map_index value to the URL"
            if mapped
            else f"The Task Instance with dag_id: `{dag_id}`, run_id: `{run_id}`, task_id: "
            f"`{task_id}` and map_index: `{map_index}` was not found",
            reason="task_instance_not_found",
        )
    return ti


def task_instance_tries(
    *, dag_id: str, run_id: str, task_id: str, map_index: int = -1
) -> list[TaskInstance]:
    """Airflow's `GET .../taskInstances/{task_id}/tries`: its TaskInstanceHistory rows and the
    TI. Earlier tries are not kept here (a retry or a clear updates the TI row in place), so
    the list is the current try alone. None -> NotFound in Airflow's words."""
    tis = list(
        TaskInstance.objects.select_related("dag_run", "trigger").filter(
            dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=map_index
        )
    )
    if not tis:
        raise exceptions.NotFound(
            f"The Task Instance with dag_id: `{dag_id}`, run_id: `{run_id}`, task_id: "
            f"`{task_id}` and map_index: `{map_index}` was not found",
            reason="task_instance_not_found",
        )
    return tis


def task_instance_try(
    *, dag_id: str, run_id: str, task_id: str, try_number: int, map_index: int = -1
) -> TaskInstance:
    """One try of a TI (Airflow's `.../tries/{task_try_number}`): the current one; an earlier
    try is a 404 that says it is not kept (Airflow would answer its history row)."""
    ti = (
        TaskInstance.objects.select_related("dag_run", "trigger")
        .filter(dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=map_index)
        .first()
    )
    if ti is None or ti.try_number != try_number:
        earlier = ti is not None and 1 <= try_number < ti.try_number
        raise exceptions.NotFound(
            f"The Task Instance with dag_id: `{dag_id}`, run_id: `{run_id}`, task_id: "
            f"`{task_id}`, try_number: `{try_number}` and map_index: `{map_index}` was not found"
            + (" (earlier tries are not kept: only the current try is)" if earlier else ""),
            reason="task_instance_try_not_kept" if earlier else "task_instance_not_found",
        )
    return ti


def extra_links(
    *, dag_id: str, run_id: str, task_id: str, map_index: int = -1, try_number: int | None = None
) -> dict[str, str | None]:
    """Airflow's `GET .../taskInstances/{task_id}/links`: the task's operator extra links. No
    task here declares any (the service runs no operators), so an existing TI has none."""
    ti = (
        TaskInstance.objects.filter(
            dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=map_index
        )
        .values_list("try_number", flat=True)
        .first()
    )
    if ti is None:
        raise exceptions.NotFound("TaskInstance not found", reason="task_instance_not_found")
    if not Task.objects.filter(dag_id=dag_id, task_id=task_id).exists():
        raise exceptions.NotFound(f"Task with ID = {task_id} not found", reason="task_not_found")
    if try_number is not None and try_number != ti:
        raise exceptions.NotFound(
            f"TaskInstanceHistory not found for try_number={try_number}",
            reason="task_instance_try_not_kept",
        )
    return {}
