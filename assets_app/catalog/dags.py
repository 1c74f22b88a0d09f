"""Reading Dags and pausing them, for the public API (`/api/v2/dags`). Definitions are written by
`definitions.sync` only; this module changes nothing but `is_paused` (and, at an unpause, the
Dag's stored next run: `definitions.next_runs`).

Reads take no locks and a fixed number of queries. Each Dag is annotated with its latest run (the
run with the highest id, as Airflow picks it): `last_run_state`, `last_run_start_date`,
`last_run_end_date`, which Airflow's `dag_run_*` filters and `last_run_*` orderings use.
"""

import functools
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import (
    CharField,
    Count,
    Exists,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
)

from ..cluster import nudges
from ..definitions import next_runs, timetables
from ..guards import exceptions, limits
from ..models import (
    Asset,
    AssetAlias,
    Dag,
    DagFavorite,
    DagImportError,
    DagRun,
    DagRunState,
    DagScheduleAliasReference,
    DagScheduleAssetReference,
    DagVersion,
    ScheduleMode,
    Task,
    TaskUpstream,
)
from ..operations import audit
from ..sql import wakeups
from . import listing

DAG_ORDERING = listing.Ordering(
    keys={
        "dag_id": "dag_id",
        "dag_display_name": "dag_id",
        # A timetable's next run (issue 24; null for asset and manual Dags).
        "next_dagrun": "next_dagrun",
        "last_run_state": "last_run_state",
        "last_run_start_date": "last_run_start_date",
    },
    default=("dag_id",),
    pk="dag_id",
)
ACTIVE_RUN_STATES = (DagRunState.QUEUED, DagRunState.RUNNING)

# Airflow's timetable classes (its `timetable_type` filter: the class name) of the Dags this
# service runs; a Dag with a timetable is its kind's class (`timetables.AIRFLOW_CLASSES`).
ASSET_TIMETABLE = "AssetTriggeredTimetable"
NULL_TIMETABLE = "NullTimetable"
ASSET_OR_TIME_TIMETABLE = "AssetOrTimeSchedule"
# Not Airflow's (it has no such class): the service's asset-and-time Dags.
ASSET_AND_TIME_TIMETABLE = "AssetAndTimeSchedule"


def _timetable_type_q(kinds: set[str], scheduled: Q) -> Q:
    """Dags whose timetable class is one of `kinds`."""
    timed, untimed = Q(timetable__isnull=False), Q(timetable__isnull=True)
    both = timed & Q(schedule__isnull=False)
    match = Q(pk__in=[])
    if NULL_TIMETABLE in kinds:
        match |= untimed & ~scheduled
    if ASSET_TIMETABLE in kinds:
        match |= untimed & scheduled
    if ASSET_OR_TIME_TIMETABLE in kinds:
        match |= both & ~Q(schedule_mode=ScheduleMode.ASSET_AND_TIME)
    if ASSET_AND_TIME_TIMETABLE in kinds:
        match |= both & Q(schedule_mode=ScheduleMode.ASSET_AND_TIME)
    named = [kind for kind, name in timetables.AIRFLOW_CLASSES.items() if name in kinds]
    if named:
        match |= timed & Q(schedule__isnull=True) & Q(timetable__kind__in=named)
    return match


def _has_import_errors() -> Exists:
    """Whether the Dag's file did not import at the last sync that reported import errors."""
    return Exists(
        DagImportError.objects.filter(
            filename=OuterRef("fileloc"), bundle_name=OuterRef("bundle_name")
        )
    )


def _with_latest_run(dags: QuerySet[Dag]) -> QuerySet[Dag]:
    latest = DagRun.objects.filter(dag=OuterRef("pk")).order_by("-id")
    return dags.annotate(
        last_run_state=Subquery(latest.values("state")[:1]),
        last_run_start_date=Subquery(latest.values("start_date")[:1]),
        last_run_end_date=Subquery(latest.values("end_date")[:1]),
        has_import_errors=_has_import_errors(),
    )


@dataclass(frozen=True)
class DagFilters:
    """Airflow's `GET /dags` filters. `tags` match as Airflow's `_TagsFilter` (a Dag with any
    of them, or with all of them for `tags_match_mode` `all`), `owners` as its `_OwnersFilter`
    (an owner's text anywhere in the Dag's owners, case-insensitive, any of them). Those on
    concepts this service has no values for (bundle versions) match what Airflow matches when
    nothing has them: asking for a value matches no Dag, asking for its absence every Dag.
    `bundle_name` matches the bundle a Dag was synced from (`Dag.bundle_name`)."""

    tags: Sequence[str] = ()
    tags_match_mode: str | None = None
    owners: Sequence[str] = ()
    dag_id_pattern: str | None = None
    dag_id_prefix_pattern: str | None = None
    dag_display_name_pattern: str | None = None
    dag_display_name_prefix_pattern: str | None = None
    paused: bool | None = None
    has_import_errors: bool | None = None
    last_dag_run_state: str | None = None
    bundle_name: str | None = None
    bundle_version: str | None = None
    has_asset_schedule: bool | None = None
    asset_dependency: str | None = None
    dag_run_start_date_gte: datetime | None = None
    dag_run_start_date_gt: datetime | None = None
    dag_run_start_date_lte: datetime | None = None
    dag_run_start_date_lt: datetime | None = None
    dag_run_end_date_gte: datetime | None = None
    dag_run_end_date_gt: datetime | None = None
    dag_run_end_date_lte: datetime | None = None
    dag_run_end_date_lt: datetime | None = None
    dag_run_state: Sequence[str] = ()
    is_favorite: bool | None = None
    # Whose favorites `is_favorite` means (the caller, as Airflow's `_FavoriteFilter`).
    user_id: int | None = None
    timetable_type: Sequence[str] = ()


_NOTHING = Q(pk__in=[])


def _filter(dags: QuerySet[Dag], f: DagFilters) -> QuerySet[Dag]:
    q = (
        listing.pattern_q("dag_id", f.dag_id_pattern)
        & listing.prefix_q("dag_id", f.dag_id_prefix_pattern)
        & listing.pattern_q("dag_id", f.dag_display_name_pattern)
        & listing.prefix_q("dag_id", f.dag_display_name_prefix_pattern)
        & listing.range_q(
            "last_run_start_date",
            gte=f.dag_run_start_date_gte,
            gt=f.dag_run_start_date_gt,
            lte=f.dag_run_start_date_lte,
            lt=f.dag_run_start_date_lt,
            param="dag_run_start_date",
        )
        & listing.range_q(
            "last_run_end_date",
            gte=f.dag_run_end_date_gte,
            gt=f.dag_run_end_date_gt,
            lte=f.dag_run_end_date_lte,
            lt=f.dag_run_end_date_lt,
            param="dag_run_end_date",
        )
    )
    if f.tags:
        has = [Q(tags__contains=[tag]) for tag in f.tags]
        q &= functools.reduce(operator.and_ if f.tags_match_mode == "all" else operator.or_, has)
    if f.owners:
        q &= functools.reduce(operator.or_, (Q(owners__icontains=o) for o in f.owners))
    if f.is_favorite is not None:
        mine = DagFavorite.objects.filter(dag=OuterRef("pk"))
        mine = mine.filter(user_id=f.user_id) if f.user_id is not None else mine.none()
        q &= Q(Exists(mine)) if f.is_favorite else ~Q(Exists(mine))
    if f.has_import_errors is not None:
        q &= Q(_has_import_errors()) if f.has_import_errors else ~Q(_has_import_errors())
    if f.bundle_name is not None:
        q &= Q(bundle_name=f.bundle_name)
    if f.bundle_version is not None:  # no bundle versions here (Airflow's local bundle)
        q &= _NOTHING
    if f.paused is not None:
        q &= Q(is_paused=f.paused)
    if f.last_dag_run_state is not None:
        q &= Q(last_run_state=f.last_dag_run_state)
    if f.dag_run_state:
        states = [s for s in f.dag_run_state if s not in (None, "none")]
        state_q = Q(last_run_state__in=states)
        if len(states) < len(f.dag_run_state):
            state_q |= Q(last_run_state__isnull=True)
        q &= state_q
    scheduled = Q(Exists(DagScheduleAssetReference.objects.filter(dag=OuterRef("pk")))) | Q(
        Exists(DagScheduleAliasReference.objects.filter(dag=OuterRef("pk")))
    )
    if f.has_asset_schedule is not None:
        q &= scheduled if f.has_asset_schedule else ~scheduled
    if f.timetable_type:
        q &= _timetable_type_q(set(f.timetable_type), scheduled)
    if f.asset_dependency is not None:
        q &= Q(
            Exists(
                DagScheduleAssetReference.objects.filter(dag=OuterRef("pk")).filter(
                    Q(asset__name__icontains=f.asset_dependency)
                    | Q(asset__uri__icontains=f.asset_dependency)
                )
            )
        )
    return dags.filter(q)


def list_dags(
    *,
    filters: DagFilters,
    order_by: Sequence[str] | None = None,
    limit: int = listing.DEFAULT_PAGE_LIMIT,
    offset: int = 0,
) -> listing.Page:
    """A page of Dags, each with its latest run annotated. 2 queries (count, page); no locks."""
    dags = _filter(_with_latest_run(Dag.objects.all()), filters)
    return listing.offset_page(dags, DAG_ORDERING, order_by=order_by, limit=limit, offset=offset)


def get_dag(dag_id: str, *, details: bool = False) -> Dag:
    """One Dag with its latest run annotated; with `details`, also its number of active runs and
    the assets and aliases of its schedule (for `asset_expression`). NotFound otherwise.
    1 query (3 with details); no locks."""
    dags = _with_latest_run(Dag.objects.filter(dag_id=dag_id))
    if details:
        active = (
            DagRun.objects.filter(dag=OuterRef("pk"), state__in=ACTIVE_RUN_STATES)
            .order_by()
            .values("dag")
            .annotate(n=Count("*"))
            .values("n")
        )
        dags = dags.annotate(active_runs_count=Subquery(active)).prefetch_related(
            "schedule_asset_refs__asset", "schedule_alias_refs__alias"
        )
    dag = dags.first()
    if dag is None:
        raise exceptions.NotFound(
            f"Dag with id {dag_id} was not found", reason="dag_not_found", dag_id=dag_id
        )
    return dag


def asset_expression(dag: Dag) -> dict[str, Any] | None:
    """The Dag's schedule in Airflow's `asset_expression` form ({"asset": {uri, name, group}},
    {"alias": {name, group}}, {"all": [...]}, {"any": [...]}), from a Dag loaded by
    `get_dag(details=True)`; None for a Dag without a schedule."""
    if dag.schedule is None:
        return None
    if limits.too_deep_path(dag.schedule, limit=2 * limits.MAX_CONDITION_DEPTH) is not None:
        return None  # stored before the limit: a schedule no door accepts now nor evaluates
    groups: dict[tuple[str, str], str] = {}
    for ref in dag.schedule_asset_refs.all():
        asset: Asset = ref.asset
        groups[("asset", asset.name)] = asset.group
    for alias_ref in dag.schedule_alias_refs.all():
        alias: AssetAlias = alias_ref.alias
        groups[("alias", alias.name)] = alias.group

    def convert(node: Any) -> Any:
        if "asset" in node:
            name, uri = node["asset"]["name"], node["asset"]["uri"]
            return {"asset": {"uri": uri, "name": name, "group": groups.get(("asset", name))}}
        if "alias" in node:
            name = node["alias"]
            return {"alias": {"name": name, "group": groups.get(("alias", name), "asset")}}
        (op, children), *_ = node.items()
        return {op: [convert(child) for child in children]}

    return convert(dag.schedule)


# Airflow's `_SORTABLE_TASK_FIELDS` (`GET /dags/{dag_id}/tasks?order_by=`): those the service
# stores sort by their value; the others (Airflow's defaults here, the same for every task, or
# the Dag's dates) leave the order by task_id, as Airflow's stable sort of equal keys would.
TASK_ORDERING_STORED = {
    "task_id": "task_id",
    "task_display_name": "task_id",
    "owner": "owner",
    "trigger_rule": "trigger_rule",
    "retries": "retries",
    "retry_delay": "retry_delay_seconds",
    "retry_exponential_backoff": "retry_exponential_backoff",
}
TASK_ORDERING_CONSTANT = frozenset(
    {
        "start_date",
        "end_date",
        "depends_on_past",
        "wait_for_downstream",
        "queue",
        "pool",
        "pool_slots",
        "execution_timeout",
        "priority_weight",
        "weight_rule",
        "ui_color",
        "ui_fgcolor",
        "operator_name",
    }
)


@dataclass(frozen=True)
class DagTasks:
    """A Dag and its tasks (or the one asked for), each with `downstream_ids` set: the task_ids
    that run after it, sorted."""

    dag: Dag
    tasks: list[Task]


def get_tasks(dag_id: str, *, task_id: str | None = None, order_by: str = "task_id") -> DagTasks:
    """The tasks of a Dag as Airflow's `GET /dags/{dag_id}/tasks` lists them (sorted by
    `order_by`, `-` for descending; BadRequest `invalid_order_by` for a field Airflow does not
    sort on), or only `task_id` (`GET /dags/{dag_id}/tasks/{task_id}`). NotFound for an unknown
    Dag or task. 3 queries whatever the number of tasks; no locks."""
    dag = Dag.objects.filter(dag_id=dag_id).first()
    if dag is None:
        raise exceptions.NotFound(
            f"Dag with id {dag_id} was not found", reason="dag_not_found", dag_id=dag_id
        )
    field = order_by.lstrip("-")
    if field not in TASK_ORDERING_STORED and field not in TASK_ORDERING_CONSTANT:
        raise exceptions.BadRequest(
            f"Ordering with '{field}' is disallowed or the attribute does not exist on the model",
            reason="invalid_order_by",
            field=field,
        )
    tasks = Task.objects.filter(dag=dag)
    if task_id is not None:
        tasks = tasks.filter(task_id=task_id)
    column = TASK_ORDERING_STORED.get(field, "task_id")
    descending = order_by.startswith("-") and field in TASK_ORDERING_STORED
    found = list(tasks.order_by(f"-{column}" if descending else column, "task_id"))
    if task_id is not None and not found:
        raise exceptions.NotFound(
            f"Task with id {task_id} was not found", reason="task_not_found", task_id=task_id
        )
    links = TaskUpstream.objects.filter(upstream__dag=dag)
    if task_id is not None:
        links = links.filter(upstream__task_id=task_id)
    downstream: dict[int, list[str]] = {}
    for upstream_pk, downstream_id in links.order_by("task__task_id").values_list(
        "upstream_id", "task__task_id"
    ):
        downstream.setdefault(upstream_pk, []).append(downstream_id)
    for task in found:
        task.downstream_ids = downstream.get(task.pk, [])  # type: ignore[attr-defined]
    return DagTasks(dag=dag, tasks=found)


def after_unpause(dag_ids: Sequence[str]) -> None:
    """What follows the unpause of these Dags, in the caller's transaction: each one's next run
    of that instant is stored (`next_runs.store`, issue 40), the time scheduler woken to it and
    the asset scheduler nudged for their queued events (after commit), so that neither waits
    for a sweep; the run-timeout timer is woken too (a paused Dag's running runs past their
    timeout end now, `scheduling.timeouts`)."""
    next_runs.store(dag_ids)
    wakeups.wake(wakeups.TIME, wakeups.TIMEOUTS)
    nudges.scheduler_on_commit(dag_ids=dag_ids)


def audit_pause(*, dag_id: str, is_paused: bool, actor: audit.Actor) -> None:
    """The audit entry of one Dag's pause or unpause (`dag.pause` / `dag.unpause`), in the
    caller's transaction: `set_paused`'s, and the Dag page's form (`DagAdmin.save_model`)."""
    action = "dag.pause" if is_paused else "dag.unpause"
    audit.record(actor=actor, action=action, summary=f"{action} {dag_id}", dag_id=dag_id)


def set_paused(
    *,
    is_paused: bool,
    dag_id: str | None = None,
    filters: DagFilters | None = None,
    limit: int = listing.DEFAULT_PAGE_LIMIT,
    offset: int = 0,
    actor: audit.Actor | None = None,
) -> listing.Page:
    """Pause or unpause one Dag (`dag_id`; NotFound when unknown), or every Dag matching
    `filters` (Airflow's `PATCH /dags`: it needs `dag_id_pattern` or `dag_id_prefix_pattern`,
    `~` for all, or matches nothing) and return a page of them. Own durable transaction, one
    UPDATE (it waits for a scheduler pass holding one of those Dags, which is short). Idempotent:
    pausing a paused Dag changes nothing; audited when `actor` is given."""
    action = "dag.pause" if is_paused else "dag.unpause"
    with transaction.atomic(durable=True):
        if dag_id is not None:
            # An unpause stores the Dag's next run of that instant (`next_runs`, issue 40).
            unpaused = not is_paused and Dag.objects.filter(dag_id=dag_id, is_paused=True).update(
                is_paused=False
            )
            if unpaused:
                after_unpause([dag_id])
            elif not Dag.objects.filter(dag_id=dag_id).update(is_paused=is_paused):
                raise exceptions.NotFound(
                    f"Dag with id {dag_id} was not found", reason="dag_not_found", dag_id=dag_id
                )
            if actor is not None:
                audit_pause(dag_id=dag_id, is_paused=is_paused, actor=actor)
            return listing.Page(rows=[get_dag(dag_id)], total_entries=1)
        filters = filters or DagFilters()
        if filters.dag_id_pattern is None and filters.dag_id_prefix_pattern is None:
            return listing.Page(rows=[], total_entries=0)
        page = list_dags(filters=filters, limit=limit, offset=offset)
        matching = _filter(_with_latest_run(Dag.objects.all()), filters)
        selected = Dag.objects.filter(dag_id__in=matching.values("dag_id"))
        woken = (
            [] if is_paused else list(selected.filter(is_paused=True).values_list("pk", flat=True))
        )
        changed = selected.update(is_paused=is_paused)
        if woken:
            after_unpause(woken)
        if actor is not None and changed:
            audit.record(
                actor=actor,
                action=action,
                summary=f"{action} {changed} dag(s) matching {filters.dag_id_pattern!r} / "
                f"{filters.dag_id_prefix_pattern!r}",
            )
        for dag in page.rows:
            dag.is_paused = is_paused
        return page


# --- import errors (Airflow's `/api/v2/importErrors`) -----------------------------------------

IMPORT_ERROR_ORDERING = listing.Ordering(
    keys={
        "id": "id",
        "import_error_id": "id",
        "timestamp": "timestamp",
        "filename": "filename",
        "bundle_name": "bundle_name",
        "stacktrace": "stack_trace",
        "stack_trace": "stack_trace",
    },
    default=("id",),
)


def list_import_errors(
    *,
    limit: int,
    offset: int,
    order_by: Sequence[str] | None = None,
    filename: str | None = None,
    filename_pattern: str | None = None,
    filename_prefix_pattern: str | None = None,
    bundle_name: str | None = None,
) -> listing.Page:
    """The files that did not import at the last sync, a page by offset (Airflow's filters)."""
    q = listing.pattern_q("filename", filename_pattern) & listing.prefix_q(
        "filename", filename_prefix_pattern
    )
    if filename is not None:
        q &= Q(filename=filename)
    if bundle_name is not None:
        q &= Q(bundle_name=bundle_name)
    return listing.offset_page(
        DagImportError.objects.filter(q),
        IMPORT_ERROR_ORDERING,
        order_by=order_by,
        limit=limit,
        offset=offset,
    )


def get_import_error(*, import_error_id: int) -> DagImportError:
    error = DagImportError.objects.filter(pk=import_error_id).first()
    if error is None:
        raise exceptions.NotFound(
            f"The ImportError with import_error_id: `{import_error_id}` was not found",
            reason="import_error_not_found",
            import_error_id=import_error_id,
        )
    return error


# --- tags and run counts (Airflow 3.3.2 `routes/public/dag_tags.py`, `dag_stats.py`) ---------


def list_dag_tags(
    *,
    limit: int,
    offset: int,
    order_by: Sequence[str] | None = None,
    tag_name_pattern: str | None = None,
    tag_name_prefix_pattern: str | None = None,
) -> listing.Page:
    """The distinct tags of the Dags, by name (Airflow groups `DagTag.name` of the Dags that are
    not stale; no Dag is stale here), filtered and paged. One query; the tags are a JSON list on
    each Dag, so they are gathered and matched in Python (`listing.matches`)."""
    tags = {tag for dag_tags in Dag.objects.values_list("tags", flat=True) for tag in dag_tags}
    kept = [
        tag
        for tag in tags
        if listing.matches(tag, pattern=tag_name_pattern, prefix=tag_name_prefix_pattern)
    ]
    return listing.sorted_page(kept, order_by=order_by, names=("name",), limit=limit, offset=offset)


@dataclass(frozen=True)
class DagStats:
    dag_id: str
    counts: dict[str, int]  # every DagRunState, in Airflow's order, 0 when none


def dag_stats(*, dag_ids: Sequence[str] = ()) -> list[DagStats]:
    """Per Dag that has runs (those of `dag_ids` when given), how many runs are in each state
    (Airflow's `get_dag_stats`: runs grouped by Dag and state, Dags by id). One query."""
    runs = DagRun.objects.all()
    if dag_ids:
        runs = runs.filter(dag_id__in=dag_ids)
    counted: dict[str, dict[str, int]] = {}
    for row in runs.values("dag_id", "state").annotate(n=Count("*")).order_by("dag_id", "state"):
        counts = counted.setdefault(row["dag_id"], {state: 0 for state in DagRunState.values})
        counts[row["state"]] = row["n"]
    return [DagStats(dag_id=dag_id, counts=counts) for dag_id, counts in counted.items()]


def check_dag_exists(dag_id: str) -> None:
    """NotFound with Airflow's message (`get_latest_version_of_dag`) when no such Dag."""
    if not Dag.objects.filter(dag_id=dag_id).exists():
        raise exceptions.NotFound(
            f"The Dag with ID: `{dag_id}` was not found", reason="dag_not_found", dag_id=dag_id
        )


# --- favorites ----------------------------------------------------------------------------------


def _dag_for_favorite(dag_id: str) -> Dag:
    dag = Dag.objects.filter(dag_id=dag_id).first()
    if dag is None:
        raise exceptions.NotFound(f"Dag with id '{dag_id}' not found", reason="dag_not_found")
    return dag


def is_favorite(*, dag_id: str, user_id: int | None) -> bool:
    if user_id is None:
        return False
    return DagFavorite.objects.filter(dag_id=dag_id, user_id=user_id).exists()


def favorite_dag(*, dag_id: str, user_id: int, actor: audit.Actor) -> None:
    """Mark the Dag as the user's favorite (Airflow's `POST /dags/{dag_id}/favorite`): NotFound
    for an unknown Dag, Conflict when it already is one (Airflow's INSERT then violates the
    table's primary key: its 409). Audited, as Airflow's `action_logging` logs it."""
    with transaction.atomic():
        dag = _dag_for_favorite(dag_id)
        _, created = DagFavorite.objects.get_or_create(dag=dag, user_id=user_id)
        if not created:
            raise exceptions.Conflict(
                "Dag is already marked as favorite", reason="dag_already_favorite"
            )
        audit.record(actor=actor, action="favorite_dag", summary="favorite", dag_id=dag_id)


def unfavorite_dag(*, dag_id: str, user_id: int, actor: audit.Actor) -> None:
    """Airflow's `POST /dags/{dag_id}/unfavorite`: NotFound, Conflict when it is not one."""
    with transaction.atomic():
        _dag_for_favorite(dag_id)
        deleted, _ = DagFavorite.objects.filter(dag_id=dag_id, user_id=user_id).delete()
        if not deleted:
            raise exceptions.Conflict("Dag is not marked as favorite", reason="dag_not_favorite")
        audit.record(actor=actor, action="unfavorite_dag", summary="unfavorite", dag_id=dag_id)


# --- versions -------------------------------------------------------------------------------------

# Airflow orders by its uuid7 ids, which follow creation; ids here are uuid4, so `id` orders by
# the creation time (then the id, unique).
VERSION_ORDERING = listing.Ordering(
    keys={
        "id": "created_at",
        "version_number": "version_number",
        "bundle_name": Value(None, output_field=CharField()),
        "bundle_version": Value(None, output_field=CharField()),
    },
    default=("id",),
)


def list_dag_versions(
    *,
    dag_id: str,
    version_number: int | None = None,
    bundle_name: str | None = None,
    bundle_version: str | None = None,
    order_by: Sequence[str] | None = None,
    limit: int = listing.DEFAULT_PAGE_LIMIT,
    offset: int = 0,
) -> listing.Page:
    """A page of a Dag's versions (`~`: every Dag's), as Airflow's `GET .../dagVersions`:
    NotFound for an unknown Dag; no bundles here, so a bundle filter matches none. 3 queries."""
    versions = DagVersion.objects.all()
    if dag_id != "~":
        check_dag_exists(dag_id)
        versions = versions.filter(dag_id=dag_id)
    if version_number is not None:
        versions = versions.filter(version_number=version_number)
    if bundle_name is not None or bundle_version is not None:
        versions = versions.none()
    return listing.offset_page(
        versions, VERSION_ORDERING, order_by=order_by, limit=limit, offset=offset
    )


def get_dag_version(*, dag_id: str, version_number: int) -> DagVersion:
    found = DagVersion.objects.filter(dag_id=dag_id, version_number=version_number).first()
    if found is None:
        raise exceptions.NotFound(
            f"The DagVersion with dag_id: `{dag_id}` and version_number: `{version_number}` "
            "was not found",
            reason="dag_version_not_found",
        )
    return found


def latest_version(dag_id: str) -> DagVersion | None:
    return DagVersion.objects.filter(dag_id=dag_id).order_by("-version_number").first()


def versions_of_runs(runs: Sequence[DagRun]) -> dict[int, DagVersion]:
    """Each run's version: the Dag's latest version created at or before the run was last
    queued (its creation or its last clear, when its tasks took the definition then in force).
    One query for a page of runs, whatever its size."""
    dag_ids = {run.dag_id for run in runs}
    if not runs:
        return {}
    by_dag: dict[str, list[DagVersion]] = {}
    for version in DagVersion.objects.filter(dag_id__in=dag_ids).order_by("created_at"):
        by_dag.setdefault(version.dag_id, []).append(version)
    found = {}
    for run in runs:
        chosen = None
        for version in by_dag.get(run.dag_id, ()):
            if version.created_at > run.queued_at:
                break
            chosen = version
        if chosen is not None:
            found[run.pk] = chosen
    return found
