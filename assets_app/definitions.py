"""DAG definitions (DESIGN 6.3): parse and validate JSON files, then sync them into the models.

A file holds one Dag object or a list of them:

    {"dag_id": "report", "schedule": {"all": ["orders", {"alias": "cleaned"}]},
     "max_active_runs": 16, "is_paused": false, "description": "...",
     "tasks": [{"task_id": "build", "retries": 2,
                "outlets": ["report", {"name": "r2", "uri": "s3://b/r2"}],
                "outlet_aliases": ["reports"]},
               {"task_id": "publish", "upstream": ["build"], "trigger_rule": "all_success",
                "retry_delay_seconds": 60, "retry_exponential_backoff": 2.0,
                "max_retry_delay_seconds": 600}]}

Only `dag_id` is required (a task needs `task_id`). Every problem is a `DefinitionError` naming the
file and the JSON path, e.g. `dags/report.json: [0].tasks[1].outlets[0].name: must be a string`.

Validation, before anything is written:
- JSON syntax; the document shape; unknown keys; types (booleans are not integers); empty or
  blank strings; ids limited to letters, digits, `_`, `.` and `-` (they appear in URLs);
  `max_active_runs >= 1`, `retries >= 0`; the schedule condition (`conditions.parse`, so an
  unknown operator is rejected there); duplicate task ids in a Dag, duplicate outlets in a task,
  duplicate `dag_id`s across all the files of one sync; `upstream` ids that name no task of the
  Dag, a task upstream of itself, and cycles among a Dag's tasks (the message names them);
  `trigger_rule` one of Airflow's (`TriggerRule`); retry delays finite numbers >= 0
  (`retry_exponential_backoff` is Airflow's multiplier, `true` meaning 2.0).
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
are written, so a second sync of the same files changes nothing (not even `updated_at`). Dags that
are stored but absent from the files are left alone: deleting a Dag deletes its runs, so that is an
operator's explicit act (the admin), never a side effect of syncing a subset of files.
"""

from __future__ import annotations

import graphlib
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import models, transaction
from django.db.models import Count, Exists, OuterRef

from . import conditions, exceptions, limits, locks
from .conditions import AliasRef, AllOf, AnyOf, AssetRef, Condition
from .models import (
    Asset,
    AssetAlias,
    AssetAliasAsset,
    AssetDagRunQueue,
    Dag,
    DagScheduleAliasReference,
    DagScheduleAssetReference,
    Task,
    TaskOutletAliasReference,
    TaskOutletAssetReference,
    TaskUpstream,
    TriggerRule,
)
from .models.assets import ASSET_KEY_MAX_LENGTH
from .models.dags import DAG_ID_MAX_LENGTH, DEFAULT_RETRY_DELAY_SECONDS

DAG_KEYS = ("dag_id", "schedule", "max_active_runs", "is_paused", "description", "tasks")
TASK_KEYS = (
    "task_id",
    "retries",
    "outlets",
    "outlet_aliases",
    "upstream",
    "trigger_rule",
    "retry_delay_seconds",
    "retry_exponential_backoff",
    "max_retry_delay_seconds",
)
DEFAULT_MAX_ACTIVE_RUNS = 16
ID_PATTERN = re.compile(r"[A-Za-z0-9_.-]+")
# Task columns a definition sets (besides its id, outlets and upstream links).
TASK_FIELDS = (
    "retries",
    "trigger_rule",
    "retry_delay_seconds",
    "retry_exponential_backoff",
    "max_retry_delay_seconds",
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
    upstream: tuple[str, ...] = ()
    trigger_rule: str = TriggerRule.ALL_SUCCESS
    retry_delay_seconds: float = DEFAULT_RETRY_DELAY_SECONDS
    retry_exponential_backoff: float = 0.0
    max_retry_delay_seconds: float | None = None
    path: str = field(default="", compare=False)


@dataclass(frozen=True)
class DagDefinition:
    dag_id: str
    schedule: Condition | None = None
    max_active_runs: int = DEFAULT_MAX_ACTIVE_RUNS
    is_paused: bool = False
    description: str = ""
    tasks: tuple[TaskDefinition, ...] = ()
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
    # Dags whose stored pause differs from their definition's `is_paused` and was kept (an
    # operator paused or unpaused them; `apply_pause` overrides), as (dag_id, kept value).
    pause_kept: tuple[tuple[str, bool], ...] = ()
    # Queued events left waiting on assets that are no longer in their Dag's schedule, per Dag.
    unscheduled_waiting: tuple[tuple[str, int], ...] = ()

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
        for dag_id, paused in self.pause_kept:
            lines.append(
                f"kept dag {dag_id} {'paused' if paused else 'unpaused'} as an operator set it "
                "(its definition says otherwise; --apply-pause applies the definition)"
            )
        for dag_id, count in self.unscheduled_waiting:
            lines.append(
                f"dag {dag_id}: {count} queued events wait on assets no longer in its schedule "
                "and will never be consumed (--clear-unscheduled clears them, or its queued "
                "events page in the admin)"
            )
        return "\n".join(lines)


# --- parsing -------------------------------------------------------------------------------


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class _Parser:
    """Validates one file's document; every error names `file` and the JSON path."""

    def __init__(self, *, file: str, fileloc: str) -> None:
        self.file = file
        self.fileloc = fileloc

    def error(self, path: str, message: str) -> DefinitionError:
        return DefinitionError(self.file, path, message)

    def object(self, raw: Any, path: str, allowed: Sequence[str], what: str) -> dict[str, Any]:
        if not isinstance(raw, dict):
            raise self.error(path, f"{what} must be an object, got {_type(raw)}")
        for key in raw:
            if key not in allowed:
                raise self.error(
                    _join(path, key),
                    f"unknown key {key!r} in {what} (allowed: {', '.join(allowed)})",
                )
        return raw

    def string(self, raw: Any, path: str, *, max_length: int, allow_empty: bool = False) -> str:
        if not isinstance(raw, str):
            raise self.error(path, f"must be a string, got {_type(raw)}")
        if not allow_empty and not raw.strip():
            raise self.error(path, "must not be empty")
        if len(raw) > max_length:
            raise self.error(path, f"is longer than {max_length} characters")
        return raw

    def identifier(self, raw: Any, path: str) -> str:
        value = self.string(raw, path, max_length=DAG_ID_MAX_LENGTH)
        if not ID_PATTERN.fullmatch(value):
            raise self.error(path, f"{value!r} may contain only letters, digits, '_', '.' and '-'")
        return value

    def integer(self, raw: Any, path: str, *, minimum: int) -> int:
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise self.error(path, f"must be an integer, got {_type(raw)}")
        if raw < minimum:
            raise self.error(path, f"must be at least {minimum}, got {raw}")
        return raw

    def as_list(self, raw: Any, path: str) -> list[Any]:
        if not isinstance(raw, list):
            raise self.error(path, f"must be a list, got {_type(raw)}")
        return raw

    def document(self, raw: Any) -> list[DagDefinition]:
        if isinstance(raw, list):
            return [self.dag(item, f"[{i}]") for i, item in enumerate(raw)]
        if isinstance(raw, dict):
            return [self.dag(raw, "")]
        raise self.error("", f"the file must hold a Dag object or a list of them, got {_type(raw)}")

    def dag(self, raw: Any, path: str) -> DagDefinition:
        obj = self.object(raw, path, DAG_KEYS, "a Dag")
        if "dag_id" not in obj:
            raise self.error(path, "a Dag needs a dag_id")
        dag_id = self.identifier(obj["dag_id"], _join(path, "dag_id"))
        schedule = None
        if obj.get("schedule") is not None:
            try:
                schedule = conditions.parse(obj["schedule"], path=_join(path, "schedule"))
            except conditions.ConditionError as exc:
                raise self.error(exc.path, exc.message) from exc
        max_active_runs = DEFAULT_MAX_ACTIVE_RUNS
        if "max_active_runs" in obj:
            max_active_runs = self.integer(
                obj["max_active_runs"], _join(path, "max_active_runs"), minimum=1
            )
        is_paused = obj.get("is_paused", False)
        if not isinstance(is_paused, bool):
            raise self.error(
                _join(path, "is_paused"), f"must be true or false, got {_type(is_paused)}"
            )
        description = ""
        if "description" in obj:
            description = self.string(
                obj["description"], _join(path, "description"), max_length=100_000, allow_empty=True
            )
        tasks: list[TaskDefinition] = []
        seen: dict[str, str] = {}
        tasks_path = _join(path, "tasks")
        for i, raw_task in enumerate(self.as_list(obj.get("tasks", []), tasks_path)):
            task = self.task(raw_task, f"{tasks_path}[{i}]")
            if task.task_id in seen:
                raise self.error(
                    _join(task.path, "task_id"),
                    f"duplicate task_id {task.task_id!r} in dag {dag_id!r} "
                    f"(first at {seen[task.task_id]})",
                )
            seen[task.task_id] = task.path
            tasks.append(task)
        self.check_upstream(tasks, dag_id)
        return DagDefinition(
            dag_id=dag_id,
            schedule=schedule,
            max_active_runs=max_active_runs,
            is_paused=is_paused,
            description=description,
            tasks=tuple(tasks),
            file=self.file,
            fileloc=self.fileloc,
            path=path,
        )

    def task(self, raw: Any, path: str) -> TaskDefinition:
        obj = self.object(raw, path, TASK_KEYS, "a task")
        if "task_id" not in obj:
            raise self.error(path, "a task needs a task_id")
        task_id = self.identifier(obj["task_id"], _join(path, "task_id"))
        retries = 0
        if "retries" in obj:
            retries = self.integer(obj["retries"], _join(path, "retries"), minimum=0)
        outlets: list[AssetRef] = []
        outlets_path = _join(path, "outlets")
        for i, raw_ref in enumerate(self.as_list(obj.get("outlets", []), outlets_path)):
            item_path = f"{outlets_path}[{i}]"
            try:
                ref = conditions.parse_asset_ref(raw_ref, path=item_path)
            except conditions.ConditionError as exc:
                raise self.error(exc.path, exc.message) from exc
            if ref in outlets:
                raise self.error(item_path, f"duplicate outlet asset {ref.name!r}")
            outlets.append(ref)
        aliases: list[str] = []
        aliases_path = _join(path, "outlet_aliases")
        for i, raw_name in enumerate(self.as_list(obj.get("outlet_aliases", []), aliases_path)):
            item_path = f"{aliases_path}[{i}]"
            name = self.string(raw_name, item_path, max_length=ASSET_KEY_MAX_LENGTH)
            if name in aliases:
                raise self.error(item_path, f"duplicate outlet alias {name!r}")
            aliases.append(name)
        upstream: list[str] = []
        upstream_path = _join(path, "upstream")
        for i, raw_id in enumerate(self.as_list(obj.get("upstream", []), upstream_path)):
            item_path = f"{upstream_path}[{i}]"
            upstream_id = self.identifier(raw_id, item_path)
            if upstream_id in upstream:
                raise self.error(item_path, f"duplicate upstream task {upstream_id!r}")
            if upstream_id == task_id:
                raise self.error(item_path, f"task {task_id!r} cannot be its own upstream")
            upstream.append(upstream_id)
        trigger_rule = obj.get("trigger_rule", TriggerRule.ALL_SUCCESS)
        if not isinstance(trigger_rule, str) or trigger_rule not in TriggerRule.values:
            raise self.error(
                _join(path, "trigger_rule"),
                f"unknown trigger rule {trigger_rule!r} (allowed: {', '.join(TriggerRule.values)})",
            )
        delay = DEFAULT_RETRY_DELAY_SECONDS
        if "retry_delay_seconds" in obj:
            delay = self.number(obj["retry_delay_seconds"], _join(path, "retry_delay_seconds"))
        backoff = 0.0
        if "retry_exponential_backoff" in obj:
            raw = obj["retry_exponential_backoff"]
            key = _join(path, "retry_exponential_backoff")
            # Airflow's multiplier; true is its "standard" exponential backoff (2.0).
            backoff = (2.0 if raw else 0.0) if isinstance(raw, bool) else self.number(raw, key)
        max_delay = None
        if obj.get("max_retry_delay_seconds") is not None:
            max_delay = self.number(
                obj["max_retry_delay_seconds"], _join(path, "max_retry_delay_seconds")
            )
        return TaskDefinition(
            task_id=task_id,
            retries=retries,
            outlets=tuple(outlets),
            outlet_aliases=tuple(aliases),
            upstream=tuple(upstream),
            trigger_rule=trigger_rule,
            retry_delay_seconds=delay,
            retry_exponential_backoff=backoff,
            max_retry_delay_seconds=max_delay,
            path=path,
        )

    def number(self, raw: Any, path: str) -> float:
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            raise self.error(path, f"must be a number, got {_type(raw)}")
        if raw < 0 or raw != raw or raw == float("inf"):
            raise self.error(path, f"must be a finite number of at least 0, got {raw}")
        return float(raw)

    def check_upstream(self, tasks: Sequence[TaskDefinition], dag_id: str) -> None:
        """Every upstream id names a task of the Dag, and the tasks have no cycle (named)."""
        by_id = {task.task_id: task for task in tasks}
        for task in tasks:
            for i, upstream_id in enumerate(task.upstream):
                if upstream_id not in by_id:
                    raise self.error(
                        f"{_join(task.path, 'upstream')}[{i}]",
                        f"unknown upstream task {upstream_id!r} (dag {dag_id!r} has no such task)",
                    )
        order = {task.task_id: i for i, task in enumerate(tasks)}
        cycle = _cycle({task.task_id: task.upstream for task in tasks}, order)
        if cycle:
            raise self.error(
                _join(by_id[cycle[0]].path, "upstream"),
                f"the tasks of dag {dag_id!r} form a cycle: "
                + " -> ".join([*cycle, cycle[0]])
                + " (each runs after the one before it)",
            )


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


def _type(value: Any) -> str:
    return {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


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
    return _Parser(file=file, fileloc=fileloc).document(raw)


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
        for ref, path in _condition_refs(dag.schedule, _join(dag.path, "schedule")):
            if isinstance(ref, AssetRef):
                yield ref, path
    for task in dag.tasks:
        for i, ref in enumerate(task.outlets):
            yield ref, f"{_join(task.path, 'outlets')}[{i}]"


def check_definitions(dags: Sequence[DagDefinition]) -> None:
    """Checks that span Dags: unique dag_ids, one uri per asset name and one name per uri."""
    first: dict[str, DagDefinition] = {}
    for dag in dags:
        if dag.dag_id in first:
            other = first[dag.dag_id]
            raise DefinitionError(
                dag.file,
                _join(dag.path, "dag_id"),
                f"duplicate dag_id {dag.dag_id!r} (also at {other.file}: "
                f"{_join(other.path, 'dag_id')})",
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
            _join(dag.path, "schedule"),
            f"dag {cycle[0]!r} would trigger itself: " + "; ".join(whys),
        )


# --- sync ----------------------------------------------------------------------------------


def sync_dags(*, paths: Sequence[str | Path], apply_pause: bool = False) -> SyncResult:
    """Validate every file, then write all their Dags in one durable transaction.

    Nothing is written unless every file is valid (DefinitionError otherwise). Idempotent: a second
    run over the same files writes nothing. Concurrent syncs serialize on `locks.lock_dag_sync`.
    A definition's `is_paused` is Airflow's `is_paused_upon_creation`: it sets a new Dag's pause
    and leaves a stored Dag's pause (an operator's choice) alone, unless `apply_pause`.
    """
    return sync_definitions(dags=load_paths(paths), apply_pause=apply_pause)


def sync_definitions(*, dags: Sequence[DagDefinition], apply_pause: bool = False) -> SyncResult:
    """Write already-parsed definitions (see `sync_dags`); one durable transaction."""
    check_definitions(dags)
    with transaction.atomic(durable=True):
        # Concurrent syncs (several hosts at start-up) run one after the other; every read below
        # happens after the lock, so it sees what an earlier sync committed.
        locks.lock_dag_sync()
        return _Sync(dags, apply_pause=apply_pause).run()


def sync_documents(
    *, documents: Sequence[tuple[str, Any]], apply_pause: bool = False
) -> SyncResult:
    """Sync definition documents that arrive decoded, as (file, document) pairs: the Dags of an
    Airflow DAG file, converted by `bin/airflow-worker` (`file` is its path relative to the Dag
    folder, stored as the Dag's fileloc: the worker finds the file there again). The same
    parsing, cross-checks and single transaction as `sync_dags`; an invalid document is
    InvalidInput (`invalid_definition`, naming the file and the path in it) and writes nothing."""
    try:
        dags = [
            dag for file, raw in documents for dag in _Parser(file=file, fileloc=file).document(raw)
        ]
        return sync_definitions(dags=dags, apply_pause=apply_pause)
    except DefinitionError as exc:
        raise exceptions.InvalidInput(
            str(exc), reason="invalid_definition", file=exc.file, json_path=exc.path
        ) from exc


class _Sync:
    """One sync inside the transaction. A fixed number of queries per step, not per Dag."""

    def __init__(self, dags: Sequence[DagDefinition], *, apply_pause: bool = False) -> None:
        self.dags = list(dags)
        self.apply_pause = apply_pause
        self.changed_dags: set[str] = set()
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
        self._schedule_refs(assets, aliases)
        unscheduled = self._unscheduled_waiting()
        created = set(dags_created)
        updated = (self.changed_dags | set(dags_updated)) - created
        return SyncResult(
            dag_ids=tuple(dag.dag_id for dag in self.dags),
            dags_created=len(created),
            dags_updated=len(updated),
            dags_unchanged=len(self.dags) - len(created) - len(updated),
            assets_created=assets_created,
            aliases_created=aliases_created,
            pause_kept=tuple(self.pause_kept),
            unscheduled_waiting=unscheduled,
            **task_counts,
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
                "is_paused": definition.is_paused,
                "max_active_runs": definition.max_active_runs,
                "schedule": (
                    conditions.to_json(definition.schedule)
                    if definition.schedule is not None
                    else None
                ),
                "fileloc": definition.fileloc,
            }
            dag = stored.get(definition.dag_id)
            if dag is None:
                created.append(Dag(dag_id=definition.dag_id, **values))
                continue
            if not self.apply_pause:
                # Airflow's is_paused_upon_creation: the stored pause is the operator's.
                del values["is_paused"]
                if dag.is_paused != definition.is_paused:
                    self.pause_kept.append((dag.dag_id, dag.is_paused))
            changed = [name for name, value in values.items() if getattr(dag, name) != value]
            if "schedule" in changed and dag.schedule_error:
                # A new schedule (every door checked it): the scheduler's old verdict is void.
                values.update(schedule_error="", schedule_error_at=None)
                changed += ["schedule_error", "schedule_error_at"]
            if changed:
                for name in changed:
                    setattr(dag, name, values[name])
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

    def _match(
        self,
        model: type[models.Model],
        scope: dict[str, Any],
        fields: tuple[str, str],
        wanted: set[tuple[Any, Any]],
        dag_of_key: Callable[[tuple[Any, Any]], str],
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
