"""DAG definitions (DESIGN 6.3): parse and validate JSON files, then sync them into the models.

A file holds one Dag object or a list of them:

    {"dag_id": "report", "schedule": {"all": ["orders", {"alias": "cleaned"}]},
     "max_active_runs": 16, "is_paused": false, "description": "...",
     "tasks": [{"task_id": "build", "retries": 2,
                "outlets": ["report", {"name": "r2", "uri": "s3://b/r2"}],
                "outlet_aliases": ["reports"]},
               {"task_id": "publish", "upstream": ["build"], "trigger_rule": "all_success",
                "retry_delay_seconds": 60, "retry_exponential_backoff": 2.0,
                "max_retry_delay_seconds": 600},
               {"task_id": "per_file", "upstream": ["build"],
                "expand": {"path": {"xcom": "build"}}}]}

Only `dag_id` is required (a task needs `task_id`). Every problem is a `DefinitionError` naming the
file, the JSON path and the Dag, e.g.
`dags/report.json: [0].tasks[1].outlets[0].name: must be a string, got an integer (dag 'report')`.

Validation, before anything is written:
- JSON syntax, then the document's shape by its schema (`dag_schema`, pydantic models; the same
  models give the JSON Schema published for DAG authors): unknown keys; types (booleans are not
  integers); empty or blank strings; ids limited to letters, digits, `_`, `.` and `-` (they
  appear in URLs); `max_active_runs >= 1`, `retries >= 0`; the schedule condition (its kinds,
  its depth limit); `trigger_rule` one of Airflow's (`TriggerRule`); retry delays finite numbers
  >= 0 (`retry_exponential_backoff` is Airflow's multiplier, `true` meaning 2.0).
- Then what a schema cannot say (`_check_tasks`, `check_definitions`): duplicate task ids in a
  Dag, duplicate outlets or upstream ids in a task, duplicate `dag_id`s across all the files of
  one sync; `upstream` ids that name no task of the Dag, a task upstream of itself, and cycles
  among a Dag's tasks (the message names them; `graphlib` finds them); a mapped task's `expand`
  (`_check_mapping`): at most MAX_MAP_LENGTH literal values, or `{"xcom": id}` (or a `zip` /
  `concat` of them) naming its own upstream tasks, none in a mapped group; the tasks of a mapped
  group (`map_group`) all expand over the group's one source, return values listed upstream by
  the group's roots (`_check_map_groups`).
- Asset identity: one name means one uri (and one uri one name) across the files and against the
  assets already stored, since both are unique.
- Trigger cycles ("cycles of aliases" in DESIGN 6.3). Aliases here resolve only to assets, so an
  alias cannot point at another alias; the loop that matters is a Dag that triggers itself. Dag A
  *feeds* Dag B when a task of A declares an outlet asset, or an outlet alias, that B's schedule
  references, or an outlet asset that an alias in B's schedule already resolves to (stored alias
  links). A cycle in "feeds" among the Dags of one sync, a Dag feeding itself included, is
  rejected: every run would queue the next one forever. Dags outside the sync are not considered.

Sync (`sync_dags`) writes everything in one durable transaction: Dags are upserted by `dag_id`,
tasks by (Dag, task_id); tasks missing from a Dag's definition are deleted; task outlets and the
schedule references (`DagScheduleAssetReference` / `DagScheduleAliasReference`) and the upstream
links (`TaskUpstream`) are made to match
the definition exactly; referenced assets and aliases are created if missing. Only rows that differ
are written, so a second sync of the same files changes nothing (not even `updated_at`). A Dag's
`watchers` (queue watchers feeding its scheduled assets; Airflow's AssetWatcher) create the
watcher when missing and make the Dag's routes on it exactly the definition's (`_Sync._watchers`
says what is refused and what an operator keeps). Dags that
are stored but absent from the files are left alone: deleting a Dag deletes its runs, so that is an
operator's explicit act (the admin), never a side effect of syncing a subset of files.
"""

from __future__ import annotations

import graphlib
import json
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import models, transaction
from django.db.models import Count, Exists, Max, OuterRef
from django.utils import timezone
from pydantic import BaseModel, ValidationError

from ..guards import encryption, exceptions, limits, masking
from ..models import (
    DEFAULT_POOL_NAME,
    Asset,
    AssetAlias,
    AssetAliasAsset,
    AssetDagRunQueue,
    Dag,
    DagImportError,
    DagScheduleAliasReference,
    DagScheduleAssetReference,
    DagVersion,
    MapCombine,
    QueueWatcher,
    ScheduleMode,
    Task,
    TaskOutletAliasReference,
    TaskOutletAssetReference,
    TaskSetupLink,
    TaskUpstream,
    TriggerRule,
    WatcherRoute,
    WeightRule,
)
from ..models.dags import (
    DEFAULT_BUNDLE_NAME,
    DEFAULT_OWNER,
    DEFAULT_QUEUE,
    DEFAULT_RETRY_DELAY_SECONDS,
    OWNERS_MAX_LENGTH,
    PRIORITY_WEIGHT_MAX,
    PRIORITY_WEIGHT_MIN,
)
from ..operations import audit
from ..sql import locks, wakeups
from . import conditions, next_runs, setup_teardown, sources, timetables
from . import params as dag_params
from . import schema as dag_schema
from .conditions import AliasRef, AllOf, AnyOf, AssetRef, Condition
from .schema import join

# Task columns a definition sets (besides its id, outlets and upstream links).
TASK_FIELDS = (
    "retries",
    "trigger_rule",
    "retry_delay_seconds",
    "retry_exponential_backoff",
    "max_retry_delay_seconds",
    "priority_weight",
    "weight_rule",
    "priority_weight_total",
    "pool",
    "pool_slots",
    "queue",
    "max_active_tis_per_dag",
    "max_active_tis_per_dagrun",
    "map_length",
    "map_upstream",
    "map_combine",
    "map_sources",
    "map_group",
    "owner",
    "doc_md",
    "depends_on_past",
    "ignore_first_depends_on_past",
    "wait_for_downstream",
    "inlets",
    "is_setup",
    "is_teardown",
    "on_failure_fail_dagrun",
    "run_state_leaf",
)


class DefinitionError(ValueError):
    """A definition that cannot be synced: `file`, JSON `path` in it, and a human `message`."""

    def __init__(self, file: str, path: str, message: str) -> None:
        self.file = file
        self.path = path or "$"
        self.message = message
        super().__init__(f"{file}: {self.path}: {message}")


@dataclass(frozen=True)
class TaskDefinition:
    task_id: str
    retries: int = 0
    outlets: tuple[AssetRef, ...] = ()
    outlet_aliases: tuple[str, ...] = ()
    inlet_refs: tuple[AssetRef, ...] = ()
    upstream: tuple[str, ...] = ()
    trigger_rule: str = TriggerRule.ALL_SUCCESS
    retry_delay_seconds: float = DEFAULT_RETRY_DELAY_SECONDS
    retry_exponential_backoff: float = 0.0
    max_retry_delay_seconds: float | None = None
    priority_weight: int = 1
    weight_rule: str = WeightRule.DOWNSTREAM
    # The effective weight (`_with_weights`), as Airflow's priority strategy computes it.
    priority_weight_total: int = 1
    pool: str = DEFAULT_POOL_NAME
    pool_slots: int = 1
    queue: str = DEFAULT_QUEUE
    max_active_tis_per_dag: int | None = None
    max_active_tis_per_dagrun: int | None = None
    # Mapped (issue 25): over a literal list of `map_length` values, or over the return value
    # of the upstream task `map_upstream`; `expand_path` is the JSON path of what it expands.
    map_length: int | None = None
    map_upstream: str = ""
    # Over several return values (issue 39, Airflow's zip / concat): how they combine and every
    # source in order (`map_upstream` is the first); "" and () over one source.
    map_combine: str = ""
    map_source_ids: tuple[str, ...] = ()
    expand_path: str = field(default="", compare=False)
    # A task of the mapped task group of this id (its source the one above, as for every task
    # of the group); "" when not in one.
    map_group: str = ""
    # Shown only (issue 39): Airflow's task `owner` and `doc_md` ("" for none).
    owner: str = DEFAULT_OWNER
    doc_md: str = ""
    # Airflow's depends_on_past family (issue 39); wait_for_downstream implies depends_on_past.
    depends_on_past: bool = False
    ignore_first_depends_on_past: bool = False
    wait_for_downstream: bool = False
    # Airflow's setup and teardown tasks (issue 39); `run_state_leaf` and `setup_links` are
    # derived from them and the upstream links (`_with_setups`, `setup_teardown.derive`).
    is_setup: bool = False
    is_teardown: bool = False
    on_failure_fail_dagrun: bool = False
    run_state_leaf: bool = True
    setup_links: frozenset[tuple[str, str]] = frozenset()
    path: str = field(default="", compare=False)

    @property
    def inlets(self) -> list[list[str]]:
        """The inlets as Task.inlets stores them."""
        return [[ref.name, ref.uri] for ref in self.inlet_refs]

    @property
    def map_sources(self) -> list[str]:
        """The sources as Task.map_sources stores them."""
        return list(self.map_source_ids)

    @property
    def xcom_sources(self) -> tuple[str, ...]:
        """Every upstream task whose return value it maps over (none over a literal)."""
        return self.map_source_ids or ((self.map_upstream,) if self.map_upstream else ())


@dataclass(frozen=True)
class WatcherDefinition:
    """A Dag's queue watcher (the definition's `watchers`; an Airflow AssetWatcher on a queue):
    one route of the watcher `name`, to assets of the Dag's schedule (canonical refs)."""

    name: str
    queue: str
    broker_url: str = ""
    assets: tuple[AssetRef, ...] = ()
    routing_key: str = "*"
    body_field: str = ""
    body_value: str = ""
    path: str = field(default="", compare=False)


@dataclass(frozen=True)
class DagDefinition:
    dag_id: str
    schedule: Condition | None = None
    max_active_runs: int = dag_schema.DEFAULT_MAX_ACTIVE_RUNS
    max_active_tasks: int = dag_schema.DEFAULT_MAX_ACTIVE_TASKS
    # None: the definition says nothing (DAGS_ARE_PAUSED_AT_CREATION for a new Dag).
    is_paused: bool | None = None
    description: str = ""
    # Shown only (issue 39): its tags (sorted, unique), its owners as Airflow's
    # `DagModel.owners` (its tasks' owners joined), its `doc_md` ("" for none).
    tags: tuple[str, ...] = ()
    owners: str = DEFAULT_OWNER
    doc_md: str = ""
    tasks: tuple[TaskDefinition, ...] = ()
    # A time schedule (issue 24): `Timetable.spec()` of the definition's timetable, the zone,
    # the bounds (aware UTC) and catchup.
    timetable: dict | None = None
    timezone: str = "UTC"
    start_date: datetime | None = None
    end_date: datetime | None = None
    catchup: bool = False
    # Airflow's dagrun_timeout (issue 39), None: none.
    dagrun_timeout: timedelta | None = None
    max_consecutive_failed_dag_runs: int = 0
    # With both a schedule and a timetable: asset_or_time (Airflow's) or asset_and_time.
    schedule_mode: str = ScheduleMode.ASSET_OR_TIME
    xcom_read_scope: str = "run"
    # Events one asset-triggered run consumes at most (issue 28): None is `batch`, 1
    # `per_event`, N `{"max_events": N}`.
    max_events_per_run: int | None = None
    watchers: tuple[WatcherDefinition, ...] = ()
    # Dag params (issue 39): `dag_params.dump` of the definition's, "" for none.
    params: str = ""
    # Airflow's allowed_run_types, sorted (None: every type).
    allowed_run_types: tuple[str, ...] | None = None
    fail_fast: bool = False
    has_on_success_callback: bool = False
    has_on_failure_callback: bool = False
    # Airflow's task groups (`task_group_dict`): group id -> its task ids (nested included),
    # sorted; `runtime.requests` answers the reads by `task_group_id` from them.
    task_groups: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # Where it came from: the file as given (for messages), its resolved path (stored), the JSON
    # path of the object in the file ("" or "[i]").
    file: str = field(default="", compare=False)
    fileloc: str = field(default="", compare=False)
    path: str = field(default="", compare=False)


@dataclass(frozen=True)
class SyncResult:
    """What a sync did. A Dag counts as updated when any of its fields, tasks or refs changed."""

    dag_ids: tuple[str, ...]
    dags_created: int
    dags_updated: int
    dags_unchanged: int
    tasks_created: int
    tasks_updated: int
    tasks_deleted: int
    tasks_unchanged: int
    assets_created: int
    aliases_created: int
    # Queue watchers the definitions' `watchers` created, or whose queue or broker they changed.
    watchers_created: int = 0
    watchers_updated: int = 0
    # Dags whose stored pause differs from their definition's `is_paused` and was kept (an
    # operator paused or unpaused them; `apply_pause` overrides), as (dag_id, kept value).
    pause_kept: tuple[tuple[str, bool], ...] = ()
    # Queued events left waiting on assets that are no longer in their Dag's schedule, per Dag.
    unscheduled_waiting: tuple[tuple[str, int], ...] = ()
    # The files the sync reported as not importing (None: it reported none, the stored set was
    # left alone), and whether the stored set changed.
    import_errors: tuple[str, ...] | None = None
    import_errors_changed: bool = False
    # DAG file sources (`sources`) created, replaced or deleted, and the files whose source was
    # longer than the limit and stored cut.
    sources_changed: int = 0
    sources_truncated: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.dags_created or self.dags_updated)

    def summary(self) -> str:
        lines = [
            f"{len(self.dag_ids)} dags: {self.dags_created} created, {self.dags_updated} updated, "
            f"{self.dags_unchanged} unchanged; tasks: {self.tasks_created} created, "
            f"{self.tasks_updated} updated, {self.tasks_deleted} deleted, "
            f"{self.tasks_unchanged} unchanged; {self.assets_created} assets and "
            f"{self.aliases_created} aliases created"
        ]
        if self.watchers_created or self.watchers_updated:
            lines.append(
                f"queue watchers: {self.watchers_created} created, {self.watchers_updated} "
                "updated (their queue or broker)"
            )
        for dag_id, paused in self.pause_kept:
            lines.append(
                f"kept dag {dag_id} {'paused' if paused else 'unpaused'} as an operator set it "
                "(its definition says otherwise; --apply-pause applies the definition)"
            )
        if self.import_errors:
            lines.append(
                f"{len(self.import_errors)} files did not import, their Dags kept as last synced: "
                + ", ".join(self.import_errors)
            )
        for fileloc in self.sources_truncated:
            lines.append(
                f"{fileloc}: its source is longer than {sources.DAG_SOURCE_MAX_BYTES:,} bytes; "
                "only its first bytes are stored (the Dag's code view says so)"
            )
        for dag_id, count in self.unscheduled_waiting:
            lines.append(
                f"dag {dag_id}: {count} queued events wait on assets no longer in its schedule "
                "and will never be consumed (--clear-unscheduled clears them, or its queued "
                "events page in the admin)"
            )
        return "\n".join(lines)


# --- parsing -------------------------------------------------------------------------------


def parse_document(raw: Any, *, file: str, fileloc: str = "") -> list[DagDefinition]:
    """The Dags of one decoded file: its shape by the schema (`dag_schema`), then the checks
    between its tasks. Raises DefinitionError naming `file`, the JSON path and the Dag."""
    try:
        models = dag_schema.validate_file(raw)
    except ValidationError as exc:
        path, message = dag_schema.problem(exc)
        raise DefinitionError(file, path, message + _naming_dag(raw, path)) from None
    dags = [
        _definition(
            model, file=file, fileloc=fileloc, path=f"[{i}]" if isinstance(raw, list) else ""
        )
        for i, model in enumerate(models)
    ]
    for dag in dags:
        _check_tasks(dag)
        _check_consumption(dag)
    return [_with_setups(_with_weights(_check_watchers(dag))) for dag in dags]


def _naming_dag(raw: Any, path: str) -> str:
    """` (dag 'x')` for a problem inside the Dag object `x` of the file, when it has an id."""
    match = re.match(r"\[(\d+)\]", path)
    dag = raw[int(match[1])] if isinstance(raw, list) and match else raw
    dag_id = dag.get("dag_id") if isinstance(dag, dict) else None
    if not isinstance(dag_id, str) or path.endswith("dag_id"):
        return ""
    return f" (dag {dag_id!r})"


def _definition(model: dag_schema.Dag, *, file: str, fileloc: str, path: str) -> DagDefinition:
    tasks = tuple(
        TaskDefinition(
            task_id=task.task_id,
            retries=task.retries,
            outlets=tuple(conditions.asset_ref(ref) for ref in task.outlets),
            outlet_aliases=tuple(task.outlet_aliases),
            # As declared, once each (Task.inlets).
            inlet_refs=tuple(dict.fromkeys(conditions.asset_ref(ref) for ref in task.inlets)),
            upstream=tuple(task.upstream),
            trigger_rule=task.trigger_rule.value,
            retry_delay_seconds=task.retry_delay_seconds,
            # Airflow's multiplier; true is its "standard" exponential backoff (2.0).
            retry_exponential_backoff=(
                (2.0 if backoff else 0.0)
                if isinstance(backoff := task.retry_exponential_backoff, bool)
                else backoff
            ),
            max_retry_delay_seconds=task.max_retry_delay_seconds,
            priority_weight=task.priority_weight,
            weight_rule=task.weight_rule.value,
            pool=task.pool,
            pool_slots=task.pool_slots,
            queue=task.queue,
            max_active_tis_per_dag=task.max_active_tis_per_dag,
            max_active_tis_per_dagrun=task.max_active_tis_per_dagrun,
            **_mapping(task.expand, path=f"{join(path, 'tasks')}[{i}]"),
            map_group=task.map_group or "",
            owner=task.owner,
            doc_md=task.doc_md or "",
            depends_on_past=task.depends_on_past or task.wait_for_downstream,
            ignore_first_depends_on_past=task.ignore_first_depends_on_past,
            wait_for_downstream=task.wait_for_downstream,
            is_setup=task.is_setup,
            is_teardown=task.is_teardown,
            on_failure_fail_dagrun=task.on_failure_fail_dagrun,
            path=f"{join(path, 'tasks')}[{i}]",
        )
        for i, task in enumerate(model.tasks)
    )
    return DagDefinition(
        dag_id=model.dag_id,
        schedule=conditions.from_model(model.schedule) if model.schedule is not None else None,
        max_active_runs=model.max_active_runs,
        max_consecutive_failed_dag_runs=model.max_consecutive_failed_dag_runs,
        max_active_tasks=model.max_active_tasks,
        is_paused=model.is_paused,
        dagrun_timeout=(
            None
            if model.dagrun_timeout_seconds is None
            else timedelta(seconds=model.dagrun_timeout_seconds)
        ),
        description=model.description,
        tags=tuple(sorted(set(model.tags))),
        owners=owners(task.owner for task in model.tasks),
        doc_md=model.doc_md or "",
        tasks=tasks,
        xcom_read_scope=model.xcom_read_scope,
        max_events_per_run=_max_events_per_run(model.consumption),
        params=dag_params.dump(model.param_specs()),
        fail_fast=model.fail_fast,
        has_on_success_callback=model.has_on_success_callback,
        has_on_failure_callback=model.has_on_failure_callback,
        task_groups=tuple(
            (group_id, tuple(sorted(set(members))))
            for group_id, members in sorted(model.task_groups.items())
        ),
        allowed_run_types=(
            # Airflow stores an empty list as null: every type.
            tuple(sorted(set(model.allowed_run_types))) if model.allowed_run_types else None
        ),
        watchers=tuple(
            WatcherDefinition(
                name=w.name,
                queue=w.queue,
                broker_url=w.broker_url,
                assets=tuple(conditions.asset_ref(ref) for ref in w.assets),
                routing_key=w.routing_key,
                body_field=w.body_field,
                body_value=w.body_value,
                path=f"{join(path, 'watchers')}[{i}]",
            )
            for i, w in enumerate(model.watchers)
        ),
        **_time_schedule(model),
        file=file,
        fileloc=fileloc,
        path=path,
    )


def owners(task_owners: Iterable[str]) -> str:
    """A Dag's owners as Airflow's `DagModel.owners`: its tasks' owners joined by ", " (sorted,
    where Airflow joins a set), `[operators] default_owner` for a Dag without tasks."""
    return ", ".join(sorted(set(task_owners))) or DEFAULT_OWNER


def _mapping(expand: dict[str, Any] | None, *, path: str) -> dict[str, Any]:
    """What the service keeps of a task's `expand` (one argument, `dag_schema`): the literal's
    length, or the upstream task whose return value it maps over, or (zip, concat) how several
    combine and which, the first of them also as `map_upstream`. The values themselves are the
    worker's (it reads them from the Dag's own file)."""
    if expand is None:
        return {}
    ((argument, value),) = expand.items()
    where = join(join(path, "expand"), argument)
    if isinstance(value, dag_schema.XComArg):
        return {"map_upstream": value.xcom, "expand_path": join(where, "xcom")}
    if isinstance(value, dag_schema.ZipArg | dag_schema.ConcatArg):
        if isinstance(value, dag_schema.ZipArg):
            key, sources = "zip", value.zip
            combine = MapCombine.ZIP_LONGEST if value.longest else MapCombine.ZIP
        else:
            key, sources, combine = "concat", value.concat, MapCombine.CONCAT
        return {
            "map_upstream": sources[0].xcom,
            "map_combine": combine.value,
            "map_source_ids": tuple(source.xcom for source in sources),
            "expand_path": join(where, key),
        }
    return {"map_length": len(value), "expand_path": where}


def _max_events_per_run(consumption: str | dag_schema.MaxEvents) -> int | None:
    if isinstance(consumption, dag_schema.MaxEvents):
        return consumption.max_events
    return 1 if consumption == "per_event" else None


def _time_schedule(model: dag_schema.Dag) -> dict[str, Any]:
    """The definition's time schedule, normalized (dag_schema has checked it parses)."""

    def date(value: str | None) -> datetime | None:
        return None if value is None else timetables.parse_date(value, timezone=model.timezone)

    spec = model.timetable
    timetable = None
    if spec is not None:
        raw = spec.model_dump() if isinstance(spec, BaseModel) else spec
        timetable = timetables.Timetable.from_spec(raw, timezone=model.timezone).spec()
    return {
        "timetable": timetable,
        "timezone": model.timezone,
        "start_date": date(model.start_date),
        "end_date": date(model.end_date),
        "catchup": model.catchup,
        "schedule_mode": model.schedule_mode,
    }


def _check_consumption(dag: DagDefinition) -> None:
    """A bounded consumption (`per_event`, `max_events`) needs events that asset-triggered runs
    consume, one of which meets the schedule alone (`conditions.met_by_any_one_event`): with
    `all` of two assets a run of one event could never be met, and the events would wait."""
    if dag.max_events_per_run is None:
        return
    shown = "per_event" if dag.max_events_per_run == 1 else "max_events"
    if dag.schedule is None:
        problem = "needs a schedule (the assets whose events its runs consume)"
    elif dag.timetable is not None and dag.schedule_mode == ScheduleMode.ASSET_AND_TIME:
        problem = "cannot be used with schedule_mode 'asset_and_time' (a tick consumes them all)"
    elif not conditions.met_by_any_one_event(dag.schedule):
        problem = (
            "needs a schedule that one event meets alone (an asset, an alias, or `any` of "
            "them): under `all` of different assets a run of one event could never be met"
        )
    else:
        return
    raise DefinitionError(
        dag.file,
        join(dag.path, "consumption"),
        f"consumption {shown!r} {problem} (dag {dag.dag_id!r})",
    )


def _check_watchers(dag: DagDefinition) -> DagDefinition:
    """A watcher feeds assets the Dag waits on: each of its assets must be one of the schedule's
    (by name or uri; the Dag returned carries the schedule's refs), listed once; a watcher name
    appears once per Dag (one route each: a message matching it gets an event on each asset)."""
    if not dag.watchers:
        return dag
    scheduled = conditions.referenced_assets(dag.schedule) if dag.schedule is not None else []
    names: set[str] = set()
    watchers = []
    for watcher in dag.watchers:
        if watcher.name in names:
            raise DefinitionError(
                dag.file,
                join(watcher.path, "name"),
                f"watcher {watcher.name!r} is declared twice in dag {dag.dag_id!r} (give one "
                "watcher all its assets, or two watchers two names)",
            )
        names.add(watcher.name)
        refs: list[AssetRef] = []
        for i, ref in enumerate(watcher.assets):
            match = next((s for s in scheduled if ref.name == s.name or ref.uri == s.uri), None)
            if match is None:
                raise DefinitionError(
                    dag.file,
                    f"{join(watcher.path, 'assets')}[{i}]",
                    f"watcher {watcher.name!r} feeds asset {ref.name!r}, which the schedule of "
                    f"dag {dag.dag_id!r} does not name (a watcher feeds the assets its Dag "
                    "waits on)",
                )
            if match in refs:
                raise DefinitionError(
                    dag.file,
                    f"{join(watcher.path, 'assets')}[{i}]",
                    f"watcher {watcher.name!r} lists asset {match.name!r} twice",
                )
            refs.append(match)
        watchers.append(replace(watcher, assets=tuple(refs)))
    return replace(dag, watchers=tuple(watchers))


def _check_tasks(dag: DagDefinition) -> None:
    """What the schema cannot say about a Dag's tasks: no duplicate task ids, outlets, aliases
    or upstream ids; every upstream id names another task of the Dag; no cycle (named); their
    owners joined fit the Dag's `owners`."""

    def error(path: str, message: str) -> DefinitionError:
        named = f"dag {dag.dag_id!r}"
        return DefinitionError(
            dag.file, path, message if named in message else f"{message} ({named})"
        )

    first: dict[str, str] = {}
    for task in dag.tasks:
        if task.task_id in first:
            raise error(
                join(task.path, "task_id"),
                f"duplicate task_id {task.task_id!r} in dag {dag.dag_id!r} "
                f"(first at {first[task.task_id]})",
            )
        first[task.task_id] = task.path
        for key, what, items in (
            ("outlets", "outlet asset", [(ref, ref.name) for ref in task.outlets]),
            ("outlet_aliases", "outlet alias", [(name, name) for name in task.outlet_aliases]),
            ("upstream", "upstream task", [(id_, id_) for id_ in task.upstream]),
        ):
            seen: set[object] = set()
            for i, (item, name) in enumerate(items):
                if item in seen:
                    raise error(f"{join(task.path, key)}[{i}]", f"duplicate {what} {name!r}")
                seen.add(item)
        if task.task_id in task.upstream:
            raise error(
                f"{join(task.path, 'upstream')}[{task.upstream.index(task.task_id)}]",
                f"task {task.task_id!r} cannot be its own upstream",
            )
    for task in dag.tasks:
        for i, upstream_id in enumerate(task.upstream):
            if upstream_id not in first:
                raise error(
                    f"{join(task.path, 'upstream')}[{i}]",
                    f"unknown upstream task {upstream_id!r} (dag {dag.dag_id!r} has no such task)",
                )
    if len(dag.owners) > OWNERS_MAX_LENGTH:
        raise error(
            join(dag.path, "tasks"),
            f"the tasks' owners joined ({dag.owners[:60]!r}...) are longer than the "
            f"{OWNERS_MAX_LENGTH} characters of a Dag's owners (Airflow's DagModel.owners)",
        )
    _check_mapping(dag, error)
    _check_setup_teardown(dag, error)
    order = {task.task_id: i for i, task in enumerate(dag.tasks)}
    cycle = _cycle({task.task_id: task.upstream for task in dag.tasks}, order)
    if cycle:
        raise error(
            join(first[cycle[0]], "upstream"),
            f"the tasks of dag {dag.dag_id!r} form a cycle: "
            + " -> ".join([*cycle, cycle[0]])
            + " (each runs after the one before it)",
        )


def _with_weights(dag: DagDefinition) -> DagDefinition:
    """`dag` with each task's effective priority weight (`priority_weight_total`), as Airflow's
    priority strategies compute it (`airflow/task/priority_strategy.py`): `absolute` its own
    `priority_weight`; `downstream` (`upstream`) its own plus that of every task downstream
    (upstream) of it, each counted once however many paths lead there
    (`get_flat_relative_ids`); clamped to a 32-bit integer as Airflow's `db_safe_priority`.
    Runs after `_check_tasks` (ids known, no cycle)."""
    upstream = {task.task_id: set(task.upstream) for task in dag.tasks}
    downstream: dict[str, set[str]] = {task.task_id: set() for task in dag.tasks}
    for task_id, ups in upstream.items():
        for up in ups:
            downstream[up].add(task_id)
    weights = {task.task_id: task.priority_weight for task in dag.tasks}

    def relatives(task_id: str, links: dict[str, set[str]]) -> set[str]:
        seen: set[str] = set()
        stack = list(links[task_id])
        while stack:
            current = stack.pop()
            if current not in seen:
                seen.add(current)
                stack.extend(links[current])
        return seen

    def total(task: TaskDefinition) -> int:
        if task.weight_rule == WeightRule.ABSOLUTE:
            found = task.priority_weight
        else:
            links = downstream if task.weight_rule == WeightRule.DOWNSTREAM else upstream
            found = task.priority_weight + sum(weights[i] for i in relatives(task.task_id, links))
        return max(PRIORITY_WEIGHT_MIN, min(PRIORITY_WEIGHT_MAX, found))

    return replace(
        dag, tasks=tuple(replace(task, priority_weight_total=total(task)) for task in dag.tasks)
    )


def _with_setups(dag: DagDefinition) -> DagDefinition:
    """`dag` with what its setup and teardown tasks derive (issue 39, `setup_teardown.derive`):
    each task's `setup_links` and `run_state_leaf`. Runs after `_check_tasks`."""
    derived = setup_teardown.derive(
        [
            setup_teardown.Node(
                task_id=task.task_id,
                upstream=task.upstream,
                is_setup=task.is_setup,
                is_teardown=task.is_teardown,
                on_failure_fail_dagrun=task.on_failure_fail_dagrun,
            )
            for task in dag.tasks
        ]
    )
    return replace(
        dag,
        tasks=tuple(
            replace(
                task,
                run_state_leaf=derived.run_state_leaf[task.task_id],
                setup_links=derived.links.get(task.task_id, frozenset()),
            )
            for task in dag.tasks
        ),
    )


def _check_setup_teardown(dag: DagDefinition, error: Callable[[str, str], DefinitionError]) -> None:
    """Airflow's own refusal of `on_failure_fail_dagrun` on a task not a teardown, and the
    service's of what it does not run as Airflow (issue 39): a setup or teardown task that is
    mapped or in a mapped task group (Airflow relates its map indexes one by one)."""
    for task in dag.tasks:
        if task.on_failure_fail_dagrun and not task.is_teardown:
            raise error(
                join(task.path, "on_failure_fail_dagrun"),
                f"Cannot set task on_failure_fail_dagrun for {task.task_id!r} because it is "
                "not a teardown task.",
            )
        if (task.is_setup or task.is_teardown) and (
            task.map_length is not None or task.map_upstream or task.map_group
        ):
            kind = "setup" if task.is_setup else "teardown"
            raise error(
                join(task.path, "is_setup" if task.is_setup else "is_teardown"),
                f"refused by the asset service (Dag {dag.dag_id!r}, task {task.task_id!r}, "
                f"attribute 'is_{kind}'): a mapped {kind} task or one in a mapped task group "
                "is not supported",
            )


def _check_mapping(dag: DagDefinition, error: Callable[[str, str], DefinitionError]) -> None:
    """A mapped task expands over at most MAX_MAP_LENGTH literal values (Airflow's
    max_map_length, which Airflow applies to pushed values only), or over the return values of
    its own upstream tasks (one, or several zipped or concatenated): unmapped ones, or mapped
    ones outside a mapped group (second order: one value per return value its map indexes
    pushed, for a mapped group's tasks too). The tasks of a mapped group are checked as one
    (`_check_map_groups`): there the return values are upstream of the group's roots."""
    tasks = {task.task_id: task for task in dag.tasks}
    grouped = _check_map_groups(dag, error)
    for task in dag.tasks:
        if task.map_length is not None and task.map_length > settings.MAX_MAP_LENGTH:
            raise error(
                task.expand_path,
                f"expand over {task.map_length} values, more than max_map_length "
                f"{settings.MAX_MAP_LENGTH} (MAX_MAP_LENGTH)",
            )
        for i, source in enumerate(task.xcom_sources):
            where = (
                join(join(task.expand_path, f"[{i}]"), "xcom")
                if task.map_combine
                else task.expand_path
            )
            if source not in task.upstream and task.task_id not in grouped:
                known = "" if source in tasks else " (dag has no such task)"
                raise error(
                    where,
                    f"task {task.task_id!r} expands over the return value of {source!r}, "
                    f"which is not one of its upstream tasks{known}: list it in upstream",
                )
            if tasks[source].map_group:
                raise error(
                    where,
                    f"task {task.task_id!r} expands over the return values of {source!r}, a "
                    f"task of the mapped group {tasks[source].map_group!r}: not served yet",
                )


def _check_map_groups(dag: DagDefinition, error: Callable[[str, str], DefinitionError]) -> set[str]:
    """The tasks of each mapped group (`map_group`) expand over one source, the group's: all
    the same literal length, or all the same upstream return value, which every root of the
    group (a task with no upstream in it) lists upstream, as Airflow's `MappedTaskGroup` makes
    it upstream of the group. Over a return value, no task of the group has the trigger rule
    `always` (Airflow refuses it: "Task-generated mapping within a mapped task group is not
    allowed with trigger rule 'always'"). Returns the ids of the tasks in a group whose other
    upstream need not list the source."""
    members: dict[str, list[TaskDefinition]] = {}
    for task in dag.tasks:
        if task.map_group:
            if task.map_length is None and not task.map_upstream:
                raise error(
                    join(task.path, "map_group"),
                    f"task {task.task_id!r} is in the mapped group {task.map_group!r} but has "
                    "no expand: give it the group's expand",
                )
            members.setdefault(task.map_group, []).append(task)
    grouped: set[str] = set()
    for group, tasks in members.items():
        first = tasks[0]
        ids = {task.task_id for task in tasks}
        for task in tasks:
            grouped.add(task.task_id)
            if _source(task) != _source(first):
                raise error(
                    task.expand_path,
                    f"task {task.task_id!r} of the mapped group {group!r} expands over "
                    f"{_source(task)}, task {first.task_id!r} of the group over "
                    f"{_source(first)}: a group's tasks expand over one source",
                )
            if first.map_upstream and task.trigger_rule == TriggerRule.ALWAYS:
                raise error(
                    join(task.path, "trigger_rule"),
                    f"task {task.task_id!r} of the mapped group {group!r}, mapped over a "
                    "return value, cannot have the trigger rule 'always' (as in Airflow)",
                )
            for source in first.xcom_sources:
                if source in ids:
                    raise error(
                        task.expand_path,
                        f"the mapped group {group!r} expands over the return value of its own "
                        f"task {source!r}: it must come from a task outside the group",
                    )
                is_root = not ids.intersection(task.upstream)
                if is_root and source not in task.upstream:
                    raise error(
                        join(task.path, "upstream"),
                        f"task {task.task_id!r} is a root of the mapped group {group!r} (no "
                        f"upstream in it), which expands over the return value of {source!r}: "
                        "list it in upstream",
                    )
    return grouped


def _source(task: TaskDefinition) -> str:
    if task.map_combine:
        kind = "concat" if task.map_combine == MapCombine.CONCAT else "zip"
        longest = " with a fillvalue" if task.map_combine == MapCombine.ZIP_LONGEST else ""
        return f"the {kind} of {', '.join(map(repr, task.map_source_ids))}{longest}"
    if task.map_upstream:
        return f"the return value of {task.map_upstream!r}"
    return f"{task.map_length} literal values"


def _cycle(predecessors: Mapping[str, Iterable[str]], order: Mapping[str, int]) -> list[str]:
    """A cycle of the graph (`predecessors[n]`: the nodes with an edge into n), as its nodes in
    edge order starting from the one first in `order` (so the message is the same every time);
    [] when there is none. The standard library finds it (`graphlib`)."""
    try:
        graphlib.TopologicalSorter(predecessors).prepare()
    except graphlib.CycleError as exc:
        found: list[str] = exc.args[1][:-1]  # [a, b, ..., a]: each an edge into the next
        first = min(range(len(found)), key=lambda i: order[found[i]])
        return found[first:] + found[:first]
    return []


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_text(text: str, *, file: str, fileloc: str = "") -> list[DagDefinition]:
    """Parse one file's text into Dag definitions. Raises DefinitionError; no database access."""
    try:
        raw = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        # Python's parser gives up around 1,000 levels; name where the document goes too deep.
        deep = limits.document_too_deep(text) or ""
        raise DefinitionError(
            file,
            limits.abbreviate(deep.lstrip(".")),
            f"JSON nests deeper than {limits.MAX_DOCUMENT_DEPTH} levels (a schedule condition "
            f"may nest {limits.MAX_CONDITION_DEPTH} levels)",
        ) from None
    except json.JSONDecodeError as exc:
        raise DefinitionError(
            file, f"line {exc.lineno} column {exc.colno}", f"invalid JSON: {exc.msg}"
        ) from exc
    except ValueError as exc:
        raise DefinitionError(file, "", f"invalid JSON: {exc}") from exc
    return parse_document(raw, file=file, fileloc=fileloc)


def expand_paths(paths: Sequence[str | Path]) -> list[Path]:
    """Files as given, and for directories their `*.json` files sorted by name (not recursive)."""
    files: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            found = sorted(p for p in path.glob("*.json") if p.is_file())
            if not found:
                raise DefinitionError(str(path), "", "directory holds no *.json files")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise DefinitionError(str(path), "", "no such file or directory")
    return list(dict.fromkeys(files))


def load_paths(paths: Sequence[str | Path]) -> list[DagDefinition]:
    """Read, parse and cross-check every file; raise the first DefinitionError. No writes."""
    dags: list[DagDefinition] = []
    for path in expand_paths(paths):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise DefinitionError(str(path), "", f"cannot read the file: {exc}") from exc
        dags.extend(parse_text(text, file=str(path), fileloc=str(path.resolve())))
    check_definitions(dags)
    return dags


# --- cross-file checks ---------------------------------------------------------------------


def _condition_refs(condition: Condition, path: str) -> Iterator[tuple[AssetRef | AliasRef, str]]:
    """Each asset/alias reference of a condition with the JSON path of its node."""
    if isinstance(condition, AllOf | AnyOf):
        operator = "all" if isinstance(condition, AllOf) else "any"
        for i, child in enumerate(condition.children):
            yield from _condition_refs(child, f"{path}.{operator}[{i}]")
    else:
        yield condition, path


def _asset_refs(dag: DagDefinition) -> Iterator[tuple[AssetRef, str]]:
    if dag.schedule is not None:
        for ref, path in _condition_refs(dag.schedule, join(dag.path, "schedule")):
            if isinstance(ref, AssetRef):
                yield ref, path
    for task in dag.tasks:
        for i, ref in enumerate(task.outlets):
            yield ref, f"{join(task.path, 'outlets')}[{i}]"


def check_definitions(dags: Sequence[DagDefinition]) -> None:
    """Checks that span Dags: unique dag_ids, one uri per asset name and one name per uri, one
    queue and broker per watcher name."""
    first: dict[str, DagDefinition] = {}
    for dag in dags:
        if dag.dag_id in first:
            other = first[dag.dag_id]
            raise DefinitionError(
                dag.file,
                join(dag.path, "dag_id"),
                f"duplicate dag_id {dag.dag_id!r} (also at {other.file}: "
                f"{join(other.path, 'dag_id')})",
            )
        first[dag.dag_id] = dag
    uri_of: dict[str, tuple[str, str, str]] = {}
    name_of: dict[str, tuple[str, str, str]] = {}
    for dag in dags:
        for ref, path in _asset_refs(dag):
            seen = uri_of.setdefault(ref.name, (ref.uri, dag.file, path))
            if seen[0] != ref.uri:
                raise DefinitionError(
                    dag.file,
                    path,
                    f"asset {ref.name!r} has uri {ref.uri!r} here but {seen[0]!r} at "
                    f"{seen[1]}: {seen[2]}",
                )
            seen = name_of.setdefault(ref.uri, (ref.name, dag.file, path))
            if seen[0] != ref.name:
                raise DefinitionError(
                    dag.file,
                    path,
                    f"uri {ref.uri!r} is named {ref.name!r} here but {seen[0]!r} at "
                    f"{seen[1]}: {seen[2]}",
                )
    _check_watcher_consumers(dags)


def _check_watcher_consumers(dags: Sequence[DagDefinition]) -> None:
    """One watcher name is one consumer of one queue: the Dags naming it agree on its queue and
    broker."""
    first: dict[str, tuple[WatcherDefinition, DagDefinition]] = {}
    for dag in dags:
        for watcher in dag.watchers:
            seen, seen_dag = first.setdefault(watcher.name, (watcher, dag))
            for key in ("queue", "broker_url"):
                if getattr(seen, key) != getattr(watcher, key):
                    raise DefinitionError(
                        dag.file,
                        join(watcher.path, key),
                        f"watcher {watcher.name!r} has {key} "
                        f"{_shown(getattr(watcher, key))} here but "
                        f"{_shown(getattr(seen, key))} at {seen_dag.file}: {seen.path} (one "
                        "watcher is one consumer of one queue)",
                    )


def _shown(value: str) -> str:
    """A queue or broker URL in a message, its password hidden."""
    return repr(masking.url_without_password(value))


def _check_trigger_cycles(dags: Sequence[DagDefinition], alias_assets: dict[str, set[str]]) -> None:
    """Reject Dags that (transitively) trigger themselves; see the module docstring."""
    by_asset: dict[str, list[DagDefinition]] = {}
    by_alias: dict[str, list[DagDefinition]] = {}
    for dag in dags:
        if dag.schedule is None:
            continue
        for ref in conditions.referenced_assets(dag.schedule):
            by_asset.setdefault(ref.name, []).append(dag)
        for alias in conditions.referenced_aliases(dag.schedule):
            by_alias.setdefault(alias, []).append(dag)
            for asset_name in alias_assets.get(alias, ()):
                by_asset.setdefault(asset_name, []).append(dag)
    # feeds[a] = [(b, "why")]
    feeds: dict[str, list[tuple[str, str]]] = {dag.dag_id: [] for dag in dags}
    for dag in dags:
        for task in dag.tasks:
            for ref in task.outlets:
                for consumer in by_asset.get(ref.name, ()):
                    feeds[dag.dag_id].append(
                        (
                            consumer.dag_id,
                            f"{dag.dag_id}.{task.task_id} produces asset {ref.name!r}",
                        )
                    )
            for alias in task.outlet_aliases:
                for consumer in by_alias.get(alias, ()):
                    feeds[dag.dag_id].append(
                        (consumer.dag_id, f"{dag.dag_id}.{task.task_id} emits alias {alias!r}")
                    )
    triggered_by: dict[str, set[str]] = {dag_id: set() for dag_id in feeds}
    for source, edges in feeds.items():
        for target, _ in edges:
            triggered_by[target].add(source)
    cycle = _cycle(triggered_by, {dag.dag_id: i for i, dag in enumerate(dags)})
    if cycle:
        whys = [
            next(why for target, why in feeds[source] if target == cycle[(i + 1) % len(cycle)])
            for i, source in enumerate(cycle)
        ]
        dag = next(dag for dag in dags if dag.dag_id == cycle[0])
        raise DefinitionError(
            dag.file,
            join(dag.path, "schedule"),
            f"dag {cycle[0]!r} would trigger itself: " + "; ".join(whys),
        )


# --- sync ----------------------------------------------------------------------------------


def sync_dags(
    *, paths: Sequence[str | Path], apply_pause: bool = False, actor: audit.Actor | None = None
) -> SyncResult:
    """Validate every file, then write all their Dags in one durable transaction.

    Nothing is written unless every file is valid (DefinitionError otherwise). Idempotent: a second
    run over the same files writes nothing. Concurrent syncs serialize on `locks.lock_dag_sync`.
    A definition's `is_paused` is Airflow's `is_paused_upon_creation`: it sets a new Dag's pause
    and leaves a stored Dag's pause (an operator's choice) alone, unless `apply_pause`; without
    one, a new Dag's pause is DAGS_ARE_PAUSED_AT_CREATION and a stored Dag's never changes.
    A sync that changed anything is audited (`sync_dags`, by `actor`).
    """
    return sync_definitions(dags=load_paths(paths), apply_pause=apply_pause, actor=actor)


def sync_definitions(
    *,
    dags: Sequence[DagDefinition],
    apply_pause: bool = False,
    actor: audit.Actor | None = None,
    import_errors: Sequence[ImportErrorReport] | None = None,
    refused: Sequence[ImportErrorReport] = (),
    file_sources: Sequence[sources.FileSource] = (),
    folder_files: Collection[str] | None = None,
    bundle_name: str | None = None,
) -> SyncResult:
    """Write already-parsed definitions (see `sync_dags`); one durable transaction. Each Dag
    records `bundle_name`, the Dag bundle it came from (None: a JSON definition). With
    `import_errors` (the files of the folder that did not import), the stored import errors of
    that bundle become exactly those, in the same transaction; another bundle's stay. `refused`:
    the files the service refused itself (`sync_documents`), import errors too; with
    `import_errors` None they are added to the bundle's stored ones (replacing only their own
    files' errors). `file_sources`: the files' text, stored in the same transaction
    (`sources.record_sources`); with `folder_files` (every file of a whole-folder sync) the
    stored sources of the bundle's other files are deleted."""
    errors_bundle = bundle_name or DEFAULT_BUNDLE_NAME
    check_definitions(dags)
    with transaction.atomic(durable=True):
        # Concurrent syncs (several hosts at start-up) run one after the other; every read below
        # happens after the lock, so it sees what an earlier sync committed.
        locks.lock_dag_sync()
        if refused:
            if import_errors is None:
                files = {report.filename for report in refused}
                import_errors = [
                    ImportErrorReport(filename=f, stack_trace=trace)
                    for f, trace in DagImportError.objects.filter(
                        bundle_name=errors_bundle
                    ).values_list("filename", "stack_trace")
                    if f not in files
                ]
            import_errors = [*import_errors, *refused]
        syncing = _Sync(dags, apply_pause=apply_pause, bundle_name=bundle_name)
        result = syncing.run()
        if result.changed:  # a timetable, a pause or a next run may have changed (at commit)
            wakeups.wake(wakeups.TIME)
        if syncing.timeout_changed:
            # Running runs time out by the Dag's new dagrun_timeout (issue 39): the timeout
            # timer recomputes their due times when woken.
            wakeups.wake(wakeups.TIMEOUTS)
        if import_errors is not None:
            result = replace(
                result,
                import_errors=tuple(sorted({e.filename for e in import_errors})),
                import_errors_changed=record_import_errors(
                    import_errors, bundle_name=errors_bundle
                ),
            )
        if file_sources or folder_files is not None:
            result = replace(
                result,
                sources_changed=sources.record_sources(
                    file_sources, keep=folder_files, bundle_name=errors_bundle
                ),
                sources_truncated=tuple(s.fileloc for s in file_sources if s.truncated),
            )
        if result.changed or result.import_errors_changed or result.sources_changed:
            audit.record(
                actor=actor,
                action="sync_dags",
                summary=result.summary().split("\n")[0],
                targets=[audit.Target(kind="dag", object_id=d) for d in result.dag_ids],
                detail={
                    "apply_pause": apply_pause,
                    "import_errors": result.import_errors,
                    **(
                        {"sources_changed": result.sources_changed}
                        if result.sources_changed
                        else {}
                    ),
                    "bundle_name": bundle_name,
                },
            )
        return result


@dataclass(frozen=True)
class ImportErrorReport:
    """A file of the synced folder that did not import: its path relative to the folder (as a
    Dag's fileloc) and what went wrong (Airflow's stack trace, or why a Dag cannot run here)."""

    filename: str
    stack_trace: str


IMPORT_ERROR_MAX_CHARS = 100_000  # a stack trace is cut to its last characters beyond this


def record_import_errors(
    reports: Sequence[ImportErrorReport],
    *,
    bundle_name: str = DEFAULT_BUNDLE_NAME,
    now: datetime | None = None,
) -> bool:
    """Make the stored import errors of `bundle_name` exactly `reports` (one row per file; the
    caller holds the sync lock; other bundles' errors are left alone, as Airflow's dag processor
    replaces only the errors of the bundle it parsed): a file that imports again loses its row,
    a file whose error is unchanged keeps its row and timestamp (a replayed sync writes
    nothing), a new or changed error is written with `now`. Returns whether anything changed.
    Three statements at most."""
    now = now or timezone.now()
    wanted: dict[str, str] = {}
    for report in reports:
        trace = report.stack_trace[-IMPORT_ERROR_MAX_CHARS:]
        wanted[report.filename] = (
            wanted[report.filename] + "\n" + trace if report.filename in wanted else trace
        )
    own = DagImportError.objects.filter(bundle_name=bundle_name)
    stored = dict(own.values_list("filename", "stack_trace"))
    stale = [f for f, trace in stored.items() if wanted.get(f) != trace]
    fresh = sorted(f for f, trace in wanted.items() if stored.get(f) != trace)
    if stale:
        own.filter(filename__in=stale).delete()
    if fresh:
        DagImportError.objects.bulk_create(
            DagImportError(
                filename=f, bundle_name=bundle_name, timestamp=now, stack_trace=wanted[f]
            )
            for f in fresh
        )
    return bool(stale or fresh)


_TASK_PATH = re.compile(r"^(?:\[(\d+)\])?\.?tasks\[(\d+)\](?:\.(\w+))?")
_DAG_PATH = re.compile(r"^(?:\[(\d+)\])?\.?(\w+)?")


def refusal_text(raw: Any, exc: DefinitionError) -> str:
    """An import error's text for a document the service refuses: the Dag, task and attribute
    it names (from the error's JSON path into `raw`), then the reason."""
    documents = raw if isinstance(raw, list) else [raw]
    where = []
    task = _TASK_PATH.match(exc.path or "")
    found = _DAG_PATH.match(exc.path or "")
    matched = task or found
    index = int(matched.group(1) or 0) if matched is not None else 0
    document = documents[index] if 0 <= index < len(documents) else None
    if isinstance(document, dict) and document.get("dag_id"):
        where.append(f"Dag {document['dag_id']!r}")
    if task is not None and isinstance(document, dict):
        tasks = document.get("tasks")
        position = int(task.group(2))
        if isinstance(tasks, list) and position < len(tasks) and isinstance(tasks[position], dict):
            where.append(f"task {tasks[position].get('task_id')!r}")
        if task.group(3):
            where.append(f"attribute {task.group(3)!r}")
    elif found is not None and found.group(2):
        where.append(f"attribute {found.group(2)!r}")
    head = ", ".join(where)
    return f"refused by the asset service ({head}): {exc}" if head else f"refused: {exc}"


def sync_documents(
    *,
    documents: Sequence[tuple[str, Any]],
    apply_pause: bool = False,
    actor: audit.Actor | None = None,
    import_errors: Sequence[ImportErrorReport] | None = None,
    file_sources: Sequence[sources.FileSource] = (),
    bundle_name: str = DEFAULT_BUNDLE_NAME,
) -> SyncResult:
    """Sync definition documents that arrive decoded, as (file, document) pairs: the Dags of an
    Airflow DAG file, converted by `bin/airflow-worker` (`file` is its path relative to the Dag
    folder, stored as the Dag's fileloc: the worker finds the file there again). The same
    parsing, cross-checks and single transaction as `sync_dags`. A file whose document the
    service refuses (an attribute it does not know, a value out of its bounds) is an import
    error of that file (`refusal_text`: its Dag, task and attribute) and the other files sync
    (issue 39); a refusal across files (two files disagreeing on an asset) is still
    InvalidInput (`invalid_definition`, naming the file and the path in it) and writes nothing.
    Each `file` must be a relative path inside the bundle (`check_fileloc`): workers hand it to
    the Task SDK as `dag_rel_path`, which loads the file it names. `import_errors` (the worker's
    files that did not import, same path rule) replace the stored ones of `bundle_name`, the
    worker's Dag bundle, which its Dags record (`record_import_errors`); None leaves them
    alone. `file_sources`: the files' text (`sources`), stored for the files that synced; a
    file refused or that did not import keeps its stored source, and with `import_errors` (a
    whole folder) the sources of the bundle's files not in it are deleted."""
    for file, _ in documents:
        check_fileloc(file)
    for source in file_sources:
        check_fileloc(source.fileloc)
    for report in import_errors or ():
        check_fileloc(report.filename)
    # Per-file isolation (issue 39): a file whose Dags the service refuses becomes an import
    # error of that file naming its Dag, task and attribute, and every other file syncs.
    dags: list[DagDefinition] = []
    refused: list[ImportErrorReport] = []
    for file, raw in documents:
        try:
            dags.extend(parse_document(raw, file=file, fileloc=file))
        except DefinitionError as exc:
            refused.append(ImportErrorReport(filename=file, stack_trace=refusal_text(raw, exc)))
    refused_files = {report.filename for report in refused}
    try:
        return sync_definitions(
            dags=dags,
            apply_pause=apply_pause,
            actor=actor,
            import_errors=import_errors,
            refused=refused,
            file_sources=[s for s in file_sources if s.fileloc not in refused_files],
            folder_files=None
            if import_errors is None
            else {file for file, _ in documents} | {e.filename for e in import_errors},
            bundle_name=bundle_name,
        )
    except DefinitionError as exc:
        raise exceptions.InvalidInput(
            str(exc), reason="invalid_definition", file=exc.file, json_path=exc.path
        ) from exc


# A Dag file's place in its bundle: relative, forward slashes, no empty, `.` or `..` part.
_FILELOC_PART = re.compile(r"[^/\\\x00-\x1f:]+")
FILELOC_MAX_LENGTH = 2000  # Dag.fileloc's column


def check_fileloc(fileloc: Any) -> None:
    """Refuse (InvalidInput `invalid_fileloc`) a fileloc that is not a plain relative path inside
    the bundle: empty, absolute (`/x`, `//host/x`, `C:x`), with `..` or `.` or empty parts, a
    backslash, a colon or a control character, or longer than the column."""
    parts = fileloc.split("/") if isinstance(fileloc, str) else []
    if (
        not parts
        or len(fileloc) > FILELOC_MAX_LENGTH
        or any(p in ("", ".", "..") or not _FILELOC_PART.fullmatch(p) for p in parts)
    ):
        raise exceptions.InvalidInput(
            f"file {str(fileloc)[:200]!r} is not a relative path inside the Dag bundle (no "
            "leading '/', no '..' or '.' parts, no backslash, colon or control character, at "
            f"most {FILELOC_MAX_LENGTH} characters)",
            reason="invalid_fileloc",
            file=str(fileloc)[:200],
        )


TIME_FIELDS = ("timetable", "timezone", "start_date", "end_date", "catchup", "schedule_mode")
NEXT_RUN_FIELDS = next_runs.FIELDS


def _record_versions(dag_ids: set[str]) -> None:
    """The next version of each Dag whose definition the sync created or changed (Airflow's
    `dag_version`, one per definition change). Two queries whatever the number of Dags; runs
    under the sync's lock, so two syncs never write the same number."""
    if not dag_ids:
        return
    latest = dict(
        DagVersion.objects.filter(dag_id__in=dag_ids)
        .values("dag_id")
        .annotate(n=Max("version_number"))
        .values_list("dag_id", "n")
    )
    DagVersion.objects.bulk_create(
        DagVersion(dag_id=dag_id, version_number=latest.get(dag_id, 0) + 1)
        for dag_id in sorted(dag_ids)
    )


class _Sync:
    """One sync inside the transaction. A fixed number of queries per step, not per Dag."""

    def __init__(
        self,
        dags: Sequence[DagDefinition],
        *,
        apply_pause: bool = False,
        bundle_name: str | None = None,
    ) -> None:
        self.dags = list(dags)
        self.apply_pause = apply_pause
        self.bundle_name = bundle_name
        self.changed_dags: set[str] = set()
        # An existing Dag's dagrun_timeout changed (issue 39).
        self.timeout_changed = False
        self.pause_kept: list[tuple[str, bool]] = []

    def run(self) -> SyncResult:
        # Checks that read stored rows come first: nothing is written before all have passed.
        alias_assets: dict[str, set[str]] = {}
        for alias_name, asset_name in AssetAliasAsset.objects.filter(
            alias__name__in=self._alias_names()
        ).values_list("alias__name", "asset__name"):
            alias_assets.setdefault(alias_name, set()).add(asset_name)
        _check_trigger_cycles(self.dags, alias_assets)
        assets, assets_created = self._assets()
        aliases, aliases_created = self._aliases()
        dags_created, dags_updated = self._dags()
        tasks, task_counts = self._tasks()
        self._outlet_refs(tasks, assets, aliases)
        self._upstream_links(tasks)
        self._setup_links(tasks)
        self._schedule_refs(assets, aliases)
        watchers_created, watchers_updated = self._watchers(assets)
        unscheduled = self._unscheduled_waiting()
        created = set(dags_created)
        updated = (self.changed_dags | set(dags_updated)) - created
        _record_versions(created | updated)
        return SyncResult(
            dag_ids=tuple(dag.dag_id for dag in self.dags),
            dags_created=len(created),
            dags_updated=len(updated),
            dags_unchanged=len(self.dags) - len(created) - len(updated),
            assets_created=assets_created,
            aliases_created=aliases_created,
            watchers_created=watchers_created,
            watchers_updated=watchers_updated,
            pause_kept=tuple(self.pause_kept),
            unscheduled_waiting=unscheduled,
            tasks_created=task_counts["tasks_created"],
            tasks_updated=task_counts["tasks_updated"],
            tasks_deleted=task_counts["tasks_deleted"],
            tasks_unchanged=task_counts["tasks_unchanged"],
        )

    def _unscheduled_waiting(self) -> tuple[tuple[str, int], ...]:
        """ADRQ rows of the synced Dags whose asset is neither in the Dag's schedule nor behind
        one of its aliases any more: nothing will consume them. One query."""
        dag_ids = [dag.dag_id for dag in self.dags]
        scheduled = DagScheduleAssetReference.objects.filter(
            dag_id=OuterRef("target_dag_id"), asset_id=OuterRef("asset_id")
        )
        via_alias = AssetAliasAsset.objects.filter(
            asset_id=OuterRef("asset_id"),
            alias__schedule_dag_refs__dag_id=OuterRef("target_dag_id"),
        )
        rows = (
            AssetDagRunQueue.objects.filter(target_dag_id__in=dag_ids)
            .filter(~Exists(scheduled), ~Exists(via_alias))
            .order_by("target_dag_id")
            .values_list("target_dag_id")
            .annotate(n=Count("id"))
        )
        return tuple((dag_id, n) for dag_id, n in rows)

    def _assets(self) -> tuple[dict[str, Asset], int]:
        wanted: dict[str, tuple[AssetRef, DagDefinition, str]] = {}
        for dag in self.dags:
            for ref, path in _asset_refs(dag):
                wanted.setdefault(ref.name, (ref, dag, path))
        if not wanted:
            return {}, 0
        uris = [ref.uri for ref, _, _ in wanted.values()]
        existing = list(
            Asset.objects.filter(name__in=list(wanted)) | Asset.objects.filter(uri__in=uris)
        )
        by_name = {asset.name: asset for asset in existing}
        by_uri = {asset.uri: asset for asset in existing}
        for name, (ref, dag, path) in wanted.items():
            stored = by_name.get(name) or by_uri.get(ref.uri)
            if stored is not None and (stored.name, stored.uri) != (ref.name, ref.uri):
                raise DefinitionError(
                    dag.file,
                    path,
                    f"asset {ref.name!r} with uri {ref.uri!r} conflicts with the stored asset "
                    f"{stored.name!r} with uri {stored.uri!r} (names and uris are unique)",
                )
        # Sorted, so concurrent syncs take the unique-index locks in one order (no deadlock).
        missing = [
            Asset(name=ref.name, uri=ref.uri)
            for n, (ref, _, _) in sorted(wanted.items())
            if n not in by_name
        ]
        if missing:
            # ignore_conflicts: a concurrent sync may insert the same asset; re-read below.
            Asset.objects.bulk_create(missing, ignore_conflicts=True)
        assets = {asset.name: asset for asset in Asset.objects.filter(name__in=list(wanted))}
        for name, (ref, dag, path) in wanted.items():
            if name not in assets or assets[name].uri != ref.uri:
                raise DefinitionError(
                    dag.file, path, f"asset {name!r} was created concurrently with another uri"
                )
        return assets, len(missing)

    def _alias_names(self) -> set[str]:
        names: set[str] = set()
        for dag in self.dags:
            if dag.schedule is not None:
                names.update(conditions.referenced_aliases(dag.schedule))
            for task in dag.tasks:
                names.update(task.outlet_aliases)
        return names

    def _aliases(self) -> tuple[dict[str, AssetAlias], int]:
        names = self._alias_names()
        if not names:
            return {}, 0
        existing = set(AssetAlias.objects.filter(name__in=names).values_list("name", flat=True))
        missing = [AssetAlias(name=name) for name in sorted(names - existing)]
        if missing:
            AssetAlias.objects.bulk_create(missing, ignore_conflicts=True)
        return {alias.name: alias for alias in AssetAlias.objects.filter(name__in=names)}, len(
            missing
        )

    def _dags(self) -> tuple[list[str], list[str]]:
        stored = Dag.objects.in_bulk([dag.dag_id for dag in self.dags])
        created: list[Dag] = []
        updated: list[str] = []
        for definition in self.dags:
            values = {
                "description": definition.description,
                "tags": list(definition.tags),
                "owners": definition.owners,
                "doc_md": definition.doc_md,
                "is_paused": definition.is_paused,
                "max_active_runs": definition.max_active_runs,
                "max_active_tasks": definition.max_active_tasks,
                "schedule": (
                    conditions.to_json(definition.schedule)
                    if definition.schedule is not None
                    else None
                ),
                "fileloc": definition.fileloc,
                "bundle_name": self.bundle_name,
                "xcom_read_scope": definition.xcom_read_scope,
                "max_events_per_run": definition.max_events_per_run,
                "params": definition.params,
                "fail_fast": definition.fail_fast,
                "has_on_success_callback": definition.has_on_success_callback,
                "has_on_failure_callback": definition.has_on_failure_callback,
                "task_groups": {
                    group_id: list(members) for group_id, members in definition.task_groups
                },
                "allowed_run_types": (
                    list(definition.allowed_run_types)
                    if definition.allowed_run_types is not None
                    else None
                ),
                "dagrun_timeout": definition.dagrun_timeout,
                "max_consecutive_failed_dag_runs": definition.max_consecutive_failed_dag_runs,
                **{name: getattr(definition, name) for name in TIME_FIELDS},
            }
            dag = stored.get(definition.dag_id)
            if dag is None:
                if definition.is_paused is None:
                    values["is_paused"] = settings.DAGS_ARE_PAUSED_AT_CREATION
                dag = Dag(dag_id=definition.dag_id, **values)
                for name, value in next_runs.after(dag, last=None, now=timezone.now()).items():
                    setattr(dag, name, value)
                created.append(dag)
                continue
            if definition.is_paused is None:
                # The definition says nothing: a stored Dag's pause stays (`apply_pause` too).
                del values["is_paused"]
            elif not self.apply_pause:
                # Airflow's is_paused_upon_creation: the stored pause is the operator's.
                del values["is_paused"]
                if dag.is_paused != definition.is_paused:
                    self.pause_kept.append((dag.dag_id, dag.is_paused))
            changed = [name for name, value in values.items() if getattr(dag, name) != value]
            self.timeout_changed |= "dagrun_timeout" in changed
            if "schedule" in changed and dag.schedule_error:
                # A new schedule (every door checked it): the scheduler's old verdict is void.
                values.update(schedule_error="", schedule_error_at=None)
                changed += ["schedule_error", "schedule_error_at"]
            if changed:
                for name in changed:
                    setattr(dag, name, values[name])
                unpaused = "is_paused" in changed and not dag.is_paused
                if set(changed) & set(TIME_FIELDS) or unpaused:
                    # A new time schedule, or an unpause (`apply_pause`): its next run from the
                    # Dag's latest automated run, now (`next_runs`).
                    next_runs.refresh([dag])
                    changed += list(NEXT_RUN_FIELDS)
                dag.save(update_fields=[*changed, "updated_at"])
                updated.append(dag.dag_id)
        Dag.objects.bulk_create(created)
        return [dag.dag_id for dag in created], updated

    def _tasks(self) -> tuple[dict[tuple[str, str], Task], dict[str, int]]:
        dag_ids = [dag.dag_id for dag in self.dags]
        stored = {(t.dag_id, t.task_id): t for t in Task.objects.filter(dag_id__in=dag_ids)}
        wanted = {(dag.dag_id, task.task_id): task for dag in self.dags for task in dag.tasks}
        created: list[Task] = []
        updated: list[Task] = []
        for key, definition in wanted.items():
            task = stored.get(key)
            values = {name: getattr(definition, name) for name in TASK_FIELDS}
            if task is None:
                created.append(Task(dag_id=key[0], task_id=definition.task_id, **values))
                continue
            changed = [name for name, value in values.items() if getattr(task, name) != value]
            if changed:
                for name in changed:
                    setattr(task, name, values[name])
                updated.append(task)
        removed = [task.pk for key, task in stored.items() if key not in wanted]
        if removed:
            Task.objects.filter(pk__in=removed).delete()
        if updated:
            Task.objects.bulk_update(updated, list(TASK_FIELDS))
        Task.objects.bulk_create(created)
        for dag_id, _ in [*(k for k in stored if k not in wanted)]:
            self.changed_dags.add(dag_id)
        for task in [*created, *updated]:
            self.changed_dags.add(task.dag_id)
        tasks = {key: task for key, task in stored.items() if key in wanted}
        tasks.update({(task.dag_id, task.task_id): task for task in created})
        counts = {
            "tasks_created": len(created),
            "tasks_updated": len(updated),
            "tasks_deleted": len(removed),
            "tasks_unchanged": len(wanted) - len(created) - len(updated),
        }
        return tasks, counts

    def _outlet_refs(
        self,
        tasks: dict[tuple[str, str], Task],
        assets: dict[str, Asset],
        aliases: dict[str, AssetAlias],
    ) -> None:
        dag_of = {task.pk: task.dag_id for task in tasks.values()}
        want_assets: set[tuple[int, int]] = set()
        want_aliases: set[tuple[int, int]] = set()
        for dag in self.dags:
            for definition in dag.tasks:
                task = tasks[(dag.dag_id, definition.task_id)]
                want_assets.update((task.pk, assets[ref.name].pk) for ref in definition.outlets)
                want_aliases.update(
                    (task.pk, aliases[name].pk) for name in definition.outlet_aliases
                )
        self._match(
            TaskOutletAssetReference,
            {"task_id__in": list(dag_of)},
            ("task_id", "asset_id"),
            want_assets,
            lambda key: dag_of[key[0]],
        )
        self._match(
            TaskOutletAliasReference,
            {"task_id__in": list(dag_of)},
            ("task_id", "alias_id"),
            want_aliases,
            lambda key: dag_of[key[0]],
        )

    def _upstream_links(self, tasks: dict[tuple[str, str], Task]) -> None:
        dag_of = {task.pk: task.dag_id for task in tasks.values()}
        wanted = {
            (tasks[(dag.dag_id, definition.task_id)].pk, tasks[(dag.dag_id, upstream_id)].pk)
            for dag in self.dags
            for definition in dag.tasks
            for upstream_id in definition.upstream
        }
        self._match(
            TaskUpstream,
            {"task_id__in": list(dag_of)},
            ("task_id", "upstream_id"),
            wanted,
            lambda key: dag_of[key[0]],
        )

    def _setup_links(self, tasks: dict[tuple[str, str], Task]) -> None:
        dag_of = {task.pk: task.dag_id for task in tasks.values()}
        wanted = {
            (tasks[(dag.dag_id, definition.task_id)].pk, tasks[(dag.dag_id, other)].pk, kind)
            for dag in self.dags
            for definition in dag.tasks
            for other, kind in definition.setup_links
        }
        self._match(
            TaskSetupLink,
            {"task_id__in": list(dag_of)},
            ("task_id", "other_id", "kind"),
            wanted,
            lambda key: dag_of[key[0]],
        )

    def _schedule_refs(self, assets: dict[str, Asset], aliases: dict[str, AssetAlias]) -> None:
        want_assets: set[tuple[str, int]] = set()
        want_aliases: set[tuple[str, int]] = set()
        for dag in self.dags:
            if dag.schedule is None:
                continue
            want_assets.update(
                (dag.dag_id, assets[ref.name].pk)
                for ref in conditions.referenced_assets(dag.schedule)
            )
            want_aliases.update(
                (dag.dag_id, aliases[name].pk)
                for name in conditions.referenced_aliases(dag.schedule)
            )
        dag_ids = [dag.dag_id for dag in self.dags]
        self._match(
            DagScheduleAssetReference,
            {"dag_id__in": dag_ids},
            ("dag_id", "asset_id"),
            want_assets,
            lambda key: key[0],
        )
        self._match(
            DagScheduleAliasReference,
            {"dag_id__in": dag_ids},
            ("dag_id", "alias_id"),
            want_aliases,
            lambda key: key[0],
        )

    def _watchers(self, assets: dict[str, Asset]) -> tuple[int, int]:
        """The definitions' queue watchers (each Dag's `watchers`): (created, updated).

        A watcher name is one consumer. One the sync creates is `from_definitions`; its queue
        and broker follow the definitions, changed only when no Dag outside this sync routes
        through it (that Dag's definition says otherwise). A name taken by a watcher made in
        the admin is refused: it is the operator's. The routes a synced Dag declared
        (`WatcherRoute.dag`) become exactly its definition's; routes made in the admin stay.
        A definitions' watcher left without routes is disabled (every message would park as
        unroutable) and enabled again when a sync gives it routes. Two queries for Dags
        without watchers."""
        declared: dict[str, tuple[WatcherDefinition, DagDefinition]] = {}
        for dag in self.dags:
            for watcher in dag.watchers:
                declared.setdefault(watcher.name, (watcher, dag))
        if any(urlsplit(w.broker_url).password for w, _ in declared.values()):
            # Broker passwords are written encrypted (`models.fields`): the key first.
            encryption.check_key_reads_stored()
        dag_ids = [dag.dag_id for dag in self.dags]
        stored_routes = list(WatcherRoute.objects.filter(dag_id__in=dag_ids).order_by("id"))
        stored_by_name = {w.name: w for w in QueueWatcher.objects.filter(name__in=list(declared))}
        created: list[QueueWatcher] = []
        updated: list[QueueWatcher] = []
        for name, (definition, dag) in sorted(declared.items()):
            stored = stored_by_name.get(name)
            config = {"queue": definition.queue, "broker_url": definition.broker_url}
            if stored is None:
                created.append(QueueWatcher(name=name, from_definitions=True, **config))
                continue
            if not stored.from_definitions:
                raise DefinitionError(
                    dag.file,
                    join(definition.path, "name"),
                    f"watcher {name!r} is configured in the admin (queue {stored.queue!r}); a "
                    "definition cannot take it over: rename this watcher, or delete that one",
                )
            if (stored.queue, stored.broker_url) == (definition.queue, definition.broker_url):
                continue
            other = (
                WatcherRoute.objects.filter(watcher=stored, dag__isnull=False)
                .exclude(dag_id__in=dag_ids)
                .values_list("dag_id", flat=True)
                .first()
            )
            if other is not None:
                raise DefinitionError(
                    dag.file,
                    definition.path,
                    f"watcher {name!r} consumes queue {stored.queue!r} at "
                    f"{_shown(stored.broker_url)} for dag {other!r} (not in this sync); this "
                    f"definition says queue {definition.queue!r} at "
                    f"{_shown(definition.broker_url)} (one watcher is one consumer of one "
                    "queue: sync both Dags together, or rename one)",
                )
            for key, value in config.items():
                setattr(stored, key, value)
            stored.updated_at = timezone.now()  # bulk_update does not touch auto_now
            updated.append(stored)
        if updated:
            QueueWatcher.objects.bulk_update(updated, ["queue", "broker_url", "updated_at"])
        if created:
            QueueWatcher.objects.bulk_create(created)
        if not declared and not stored_routes:
            return 0, 0
        ids = {w.name: w.pk for w in QueueWatcher.objects.filter(name__in=list(declared))}
        self._watcher_routes(stored_routes, ids, assets)
        return len(created), len(updated)

    def _watcher_routes(
        self, stored: list[WatcherRoute], ids: dict[str, int], assets: dict[str, Asset]
    ) -> None:
        """Make the synced Dags' watcher routes exactly their definitions'; enable or disable
        the definitions' watchers whose routes came or went (see `_watchers`)."""
        RouteKey = tuple[int, str, str, str, str, frozenset[int]]
        through = WatcherRoute.assets.through
        links: dict[int, set[int]] = {}
        for route_id, asset_id in through.objects.filter(
            watcherroute_id__in=[r.pk for r in stored]
        ).values_list("watcherroute_id", "asset_id"):
            links.setdefault(route_id, set()).add(asset_id)

        def key(route: WatcherRoute) -> RouteKey:
            return (
                route.watcher_id,
                str(route.dag_id),
                route.routing_key_pattern,
                route.body_field,
                route.body_value,
                frozenset(links.get(route.pk, ())),
            )

        wanted: dict[RouteKey, WatcherDefinition] = {
            (
                ids[w.name],
                dag.dag_id,
                w.routing_key,
                w.body_field,
                w.body_value,
                frozenset(assets[ref.name].pk for ref in w.assets),
            ): w
            for dag in self.dags
            for w in dag.watchers
        }
        have = {key(route): route for route in stored}
        stale = [route for k, route in have.items() if k not in wanted]
        missing = sorted(k for k in wanted if k not in have)
        touched = {route.watcher_id for route in stale} | {k[0] for k in missing}
        if not touched:
            return
        before = dict(
            WatcherRoute.objects.filter(watcher_id__in=touched)
            .values_list("watcher_id")
            .annotate(n=Count("id"))
            .order_by()
        )
        if stale:
            WatcherRoute.objects.filter(pk__in=[route.pk for route in stale]).delete()
        routes = WatcherRoute.objects.bulk_create(
            WatcherRoute(
                watcher_id=k[0],
                dag_id=k[1],
                routing_key_pattern=k[2],
                body_field=k[3],
                body_value=k[4],
            )
            for k in missing
        )
        through.objects.bulk_create(
            through(watcherroute_id=route.pk, asset_id=asset_id)
            for route, k in zip(routes, missing, strict=True)
            for asset_id in sorted(k[5])
        )
        after = dict(before)
        for route in stale:
            after[route.watcher_id] -= 1
        for k in missing:
            after[k[0]] = after.get(k[0], 0) + 1
        emptied = [w for w in touched if after.get(w, 0) == 0]
        refilled = [w for w in touched if after.get(w, 0) > 0 and before.get(w, 0) == 0]
        QueueWatcher.objects.filter(pk__in=emptied, from_definitions=True, enabled=True).update(
            enabled=False, updated_at=timezone.now()
        )
        QueueWatcher.objects.filter(pk__in=refilled, from_definitions=True, enabled=False).update(
            enabled=True, updated_at=timezone.now()
        )
        for route in stale:
            self.changed_dags.add(str(route.dag_id))
        for k in missing:
            self.changed_dags.add(k[1])

    def _match(
        self,
        model: type[models.Model],
        scope: dict[str, Any],
        fields: tuple[str, ...],
        wanted: set[tuple[Any, ...]],
        dag_of_key: Callable[[tuple[Any, ...]], str],
    ) -> None:
        """Make the link rows of `model` within `scope` exactly `wanted` (tuples of `fields`)."""
        stored = {
            tuple(row[1:]): row[0]
            for row in model._default_manager.filter(**scope).values_list("pk", *fields)
        }
        stale = [pk for key, pk in stored.items() if key not in wanted]
        if stale:
            model._default_manager.filter(pk__in=stale).delete()
        missing = sorted(key for key in wanted if key not in stored)
        if missing:
            model._default_manager.bulk_create(
                model(**dict(zip(fields, key, strict=True))) for key in missing
            )
        for key in [*missing, *(k for k in stored if k not in wanted)]:
            self.changed_dags.add(dag_of_key(key))
