"""Airflow DAG files -> the service's definition JSON (README "DAG definitions").

Files are parsed with Airflow's own DagBag (the Task SDK's Dag objects); each Dag becomes one
definition document: its tasks with upstream, trigger rule, retries and retry delays, priority
weight and weight rule, pool and pool slots, queue, declared outlets (assets and aliases) and
inlets (assets), its task groups (`task_groups`: each group's tasks) and its asset schedule (`&`,
`|`, aliases). The service validates and syncs them exactly as `sync_dags` does; nothing here
writes anything.

Time schedules (issue 24) become the definition's `timetable` with the Dag's `timezone`,
`start_date`, `end_date` and `catchup`: a cron string or preset and a `timedelta` (Airflow 3
makes them CronTriggerTimetable / DeltaTriggerTimetable), CronTriggerTimetable,
CronDataIntervalTimetable, DeltaTriggerTimetable, DeltaDataIntervalTimetable,
MultipleCronTriggerTimetable, EventsTimetable and `@once`; an AssetOrTimeSchedule of one of
them becomes the asset `schedule` and that `timetable` with `schedule_mode` `asset_or_time`. A
schedule the service cannot run (a relativedelta, `@continuous`, partitions, a custom
timetable, an AssetOrTimeSchedule of one of those) is left out with a reason naming the Dag
and its file, reported as that file's import error, unless `manual_only` asks for such Dags to
be synced as manual-only (schedule null).

A Dag that sets an attribute the service does not honour to anything but Airflow's default is
left out too, naming the file, Dag, task and attribute (issue 39, `airflow_worker.ledger`).

What a Dag says about itself is carried to be shown as Airflow shows it (issue 39): its
`tags` (every one), `doc_md`, each task's `owner` and `doc_md`, and the zone, dates and
catchup of a Dag without a time schedule too. The folder is on `sys.path` while it is parsed,
as Airflow's dag-processor has it (a file may import a helper module beside it).

A file that does not import, or holds a Dag left out, is an import error (Airflow's
`importErrors`): the sync reports it and the folder's other files still sync.

Each synced file's text goes with its definitions (issue 45, Airflow's `DagCode`): the Dag's
code view and `GET /api/v2/dagSources/{dag_id}` show it as this sync read it. A file longer
than `SOURCE_MAX_BYTES` sends its first bytes and its whole size (the service stores it cut and
says so); the other files are not affected.

A Dag opts its task tokens into wider XCom reads (issue 26, the definition's `xcom_read_scope`)
with a tag: `tags=["xcom_read_scope:dag"]` (any run of this Dag) or `"xcom_read_scope:all"`
(any Dag's); without one they read their own run's XComs only.

How many queued events one asset-triggered run consumes (issue 28, the definition's
`consumption`) is a tag too: `tags=["consumption:per_event"]` (one run per event, in event
order), `"consumption:max_events=50"` (runs of at most 50 events) or `"consumption:batch"`
(every queued event, Airflow's behaviour and the default).

An `AssetWatcher` on an asset of the Dag's schedule whose trigger is a `MessageQueueTrigger` on
a RabbitMQ queue becomes the definition's `watchers` (issue 28): the service's queue watcher of
that name consumes the queue and registers an event on the asset for each message. The queue is
named by `queue="amqp://user:pass@host:5672/vhost/queue"` (the last path part is the queue, the
rest the broker; `amqp:///queue` uses the service's ASSET_WATCHER_BROKER_URL) or by
`scheme="amqp", queue_name="queue"` (with an optional `broker_url`); `routing_key` (a glob),
`body_field` and `body_value` narrow which messages count. One watcher name on several assets
is one consumer feeding them all. Any other trigger (Kafka, SQS, a custom one) is refused,
naming the watcher: the service would never see its events.
"""

import datetime
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from airflow_worker import ledger

# The definition format's task defaults (Airflow's: `all_success`, `retry_delay` 300 s, no
# backoff, no cap): keys left at them are not sent.
TASK_DEFAULTS: dict[str, Any] = {
    "upstream": [],
    "trigger_rule": "all_success",
    "retry_delay_seconds": 300.0,
    "retry_exponential_backoff": 0.0,
    "max_retry_delay_seconds": None,
    "depends_on_past": False,
    "ignore_first_depends_on_past": False,
    "wait_for_downstream": False,
    "priority_weight": 1,
    "weight_rule": "downstream",
    "pool": "default_pool",
    "pool_slots": 1,
    "queue": "default",
    "max_active_tis_per_dag": None,
    "max_active_tis_per_dagrun": None,
    "is_setup": False,
    "is_teardown": False,
    "on_failure_fail_dagrun": False,
}

# Airflow's own priority strategies, by the names a `weight_rule` may give them
# (`airflow/task/priority_strategy.py`: `get_airflow_priority_weight_strategies`).
WEIGHT_RULES = {
    "absolute": "absolute",
    "downstream": "downstream",
    "upstream": "upstream",
    "airflow.task.priority_strategy._AbsolutePriorityWeightStrategy": "absolute",
    "airflow.task.priority_strategy._DownstreamPriorityWeightStrategy": "downstream",
    "airflow.task.priority_strategy._UpstreamPriorityWeightStrategy": "upstream",
}


# Airflow's `[operators] default_owner`, the definition format's task owner default.
DEFAULT_OWNER = "airflow"

# `tags=["xcom_read_scope:dag"]`: the Dag's `xcom_read_scope` (run | dag | all).
XCOM_READ_SCOPE_TAG = "xcom_read_scope:"
# `tags=["consumption:per_event"]`, `"consumption:max_events=50"`: the Dag's `consumption`.
CONSUMPTION_TAG = "consumption:"


class DagFileError(ValueError):
    """A DAG file that cannot become a definition (import error, unsupported schedule)."""


@dataclass(frozen=True)
class DagFile:
    """One DAG file's definitions, with its path relative to the folder (Dag.fileloc)."""

    rel_path: str
    definitions: list[dict[str, Any]]
    # The file's text (at most SOURCE_MAX_BYTES of it, as UTF-8) and its whole size in bytes.
    source: str | None = None
    source_size: int = 0

    def payload(self) -> dict[str, Any]:
        """The file as the sync request carries it."""
        body: dict[str, Any] = {"file": self.rel_path, "definitions": self.definitions}
        if self.source is not None:
            body.update(source=self.source, source_size=self.source_size)
        return body


# The service's limit for a stored DAG file's source (`assets_app.models.dags.DAG_SOURCE_MAX_BYTES`,
# kept equal by a test): a longer file sends its first bytes only.
SOURCE_MAX_BYTES = 512 * 1024


def read_source(path: Path) -> tuple[str, int]:
    """A file's text (undecodable bytes replaced) cut at SOURCE_MAX_BYTES, at the start of a
    character, and its whole size in bytes."""
    data = path.read_bytes()
    cut = len(data)
    if cut > SOURCE_MAX_BYTES:
        cut = SOURCE_MAX_BYTES
        while cut > 0 and data[cut] & 0xC0 == 0x80:  # a UTF-8 continuation byte
            cut -= 1
    return data[:cut].decode("utf-8", errors="replace"), len(data)


def _asset(asset: Any) -> dict[str, str]:
    return {"name": asset.name, "uri": asset.uri}


def _condition(node: Any, *, where: str) -> Any:
    from airflow.sdk import Asset, AssetAlias
    from airflow.sdk.definitions.asset import AssetAll, AssetAny, AssetNameRef, AssetUriRef

    if isinstance(node, Asset):
        return _asset(node)
    if isinstance(node, AssetAlias):
        return {"alias": node.name}
    if isinstance(node, AssetNameRef):
        return {"name": node.name}
    if isinstance(node, AssetUriRef):
        return {"uri": node.uri}
    if isinstance(node, AssetAll):
        return {"all": [_condition(child, where=where) for child in node.objects]}
    if isinstance(node, AssetAny):
        return {"any": [_condition(child, where=where) for child in node.objects]}
    raise DagFileError(
        f"{where}: schedule uses {type(node).__name__}, which the service cannot run"
    )


WATCHER_RULE_KWARGS = ("routing_key", "body_field", "body_value")
AMQP_SCHEMES = ("amqp", "amqps")


def _scheduled_assets(node: Any) -> list[Any]:
    """The Asset objects of a schedule condition, in order (aliases and refs carry none)."""
    from airflow.sdk import Asset
    from airflow.sdk.definitions.asset import AssetAll, AssetAny

    if isinstance(node, Asset):
        return [node]
    if isinstance(node, AssetAll | AssetAny):
        return [asset for child in node.objects for asset in _scheduled_assets(child)]
    return []


def _queue_of(trigger: Any, *, what: str) -> dict[str, str]:
    """The queue, broker and match rule of an AssetWatcher's MessageQueueTrigger on RabbitMQ."""
    kwargs = dict(trigger.kwargs)
    if trigger.queue_uri is not None:
        parts = urlsplit(trigger.queue_uri)
        path = parts.path.split("/")[1:]
        if parts.scheme not in AMQP_SCHEMES or len(path) not in (1, 2) or not path[-1]:
            raise DagFileError(
                f"{what} has queue {trigger.queue_uri!r}: expected "
                "amqp://[user:pass@]host[:port][/vhost]/<queue> (or amqps://)"
            )
        if not parts.netloc and len(path) == 2:
            raise DagFileError(f"{what} has queue {trigger.queue_uri!r}: a vhost needs a host")
        broker = f"{parts.scheme}://{parts.netloc}" + (f"/{path[0]}" if len(path) == 2 else "")
        broker += f"?{parts.query}" if parts.query else ""
        found = {"queue": unquote(path[-1]), "broker_url": broker if parts.netloc else ""}
        allowed: tuple[str, ...] = WATCHER_RULE_KWARGS
    else:
        if trigger.scheme not in AMQP_SCHEMES or not kwargs.get("queue_name"):
            raise DagFileError(
                f"{what} has scheme {trigger.scheme!r}: the service consumes RabbitMQ queues, "
                "MessageQueueTrigger(scheme='amqp', queue_name=...)"
            )
        found = {"queue": str(kwargs.pop("queue_name")), "broker_url": ""}
        if "broker_url" in kwargs:
            found["broker_url"] = str(kwargs.pop("broker_url"))
        allowed = ("queue_name", "broker_url", *WATCHER_RULE_KWARGS)
    unknown = sorted(set(kwargs) - set(WATCHER_RULE_KWARGS))
    if unknown:
        raise DagFileError(
            f"{what}: MessageQueueTrigger argument(s) {', '.join(unknown)} are not understood "
            f"here (allowed: {', '.join(allowed)})"
        )
    return {**found, **{k: str(v) for k, v in kwargs.items()}}


def _watchers(dag: Any, *, where: str) -> list[dict[str, Any]]:
    """The definition's `watchers` from the AssetWatchers of the Dag's scheduled assets."""
    timetable = dag.timetable
    condition = getattr(timetable, "asset_condition", None)
    watched = (
        [a for a in _scheduled_assets(condition) if a.watchers] if condition is not None else []
    )
    if not watched:
        return []
    # requirements-airflow.txt installs the provider; imported only here, as importing it
    # initializes Airflow's providers manager.
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger

    by_name: dict[str, dict[str, Any]] = {}
    for asset in watched:
        for watcher in asset.watchers:
            what = f"{where}: Dag {dag.dag_id!r}: AssetWatcher {watcher.name!r} on {asset.name!r}"
            trigger = watcher.trigger
            if not isinstance(trigger, MessageQueueTrigger):
                raise DagFileError(
                    f"{what} uses {type(trigger).__name__}, which the service does not run: it "
                    "consumes RabbitMQ queues, MessageQueueTrigger(queue='amqp://host/vhost/"
                    "queue') or MessageQueueTrigger(scheme='amqp', queue_name='queue')"
                )
            config = {"name": watcher.name, **_queue_of(trigger, what=what)}
            entry = by_name.setdefault(watcher.name, {**config, "assets": []})
            if {k: v for k, v in entry.items() if k != "assets"} != config:
                raise DagFileError(
                    f"{what}: another AssetWatcher {watcher.name!r} of this Dag watches a "
                    "different queue or rule (one name is one watcher: give them two names)"
                )
            if _asset(asset) not in entry["assets"]:
                entry["assets"].append(_asset(asset))
    defaults = {"broker_url": "", "routing_key": "*", "body_field": "", "body_value": ""}
    return [
        {k: v for k, v in entry.items() if defaults.get(k) != v}
        for _, entry in sorted(by_name.items())
    ]


def _zone(tz: Any) -> str:
    return str(getattr(tz, "name", tz))


def _delta(value: Any, *, where: str, dag_id: str) -> float:
    if not isinstance(value, datetime.timedelta):
        raise DagFileError(
            f"{where}: Dag {dag_id!r} uses {value!r}; the service runs only fixed time deltas "
            "(a timedelta), not calendar ones (relativedelta)"
        )
    return value.total_seconds()


def _run_immediately(value: Any) -> bool | float | None:
    return value.total_seconds() if isinstance(value, datetime.timedelta) else value


def _get(timetable: Any, name: str) -> Any:
    """A timetable's parameter: the Task SDK's classes name it, core's keep it private."""
    return getattr(timetable, name) if hasattr(timetable, name) else getattr(timetable, "_" + name)


def _timetable(dag: Any, *, where: str) -> dict[str, Any] | str | None:
    """The definition's `timetable` for a time schedule (alone, or the time half of an
    AssetOrTimeSchedule), or None when the Dag has none."""
    timetable = dag.timetable
    if _is_asset_or_time(timetable):
        inner = _time_timetable(timetable.timetable, dag_id=dag.dag_id, where=where)
        if inner is None:
            raise DagFileError(
                f"{where}: Dag {dag.dag_id!r} has schedule AssetOrTimeSchedule with timetable "
                f"{type(timetable.timetable).__name__}, which the service cannot run"
            )
        return inner
    return _time_timetable(timetable, dag_id=dag.dag_id, where=where)


def _is_asset_or_time(timetable: Any) -> bool:
    kind = type(timetable)
    return kind.__name__ == "AssetOrTimeSchedule" and kind.__module__ in (
        "airflow.sdk.definitions.timetables.assets",
        "airflow.timetables.assets",
    )


def _time_timetable(timetable: Any, *, dag_id: str, where: str) -> dict[str, Any] | str | None:
    """A time timetable in the definition format, or None when it is not one. The Task SDK's
    timetable classes and core's (`airflow.timetables`, which DAG files import too) are read
    alike, by exact class (a subclass may change the semantics)."""
    kind = type(timetable)
    if not kind.__module__.startswith(
        ("airflow.sdk.definitions.timetables.", "airflow.timetables.")
    ):
        return None
    name = kind.__name__

    def delta(value: Any) -> float:
        return _delta(value, where=where, dag_id=dag_id)

    if name == "OnceTimetable":
        return "@once"
    if name == "CronTriggerTimetable":
        return {
            "kind": "cron_trigger",
            "cron": _get(timetable, "expression"),
            "timezone": _zone(_get(timetable, "timezone")),
            "interval": delta(_get(timetable, "interval")),
            "run_immediately": _run_immediately(_get(timetable, "run_immediately")),
        }
    if name == "CronDataIntervalTimetable":
        return {
            "kind": "cron_data_interval",
            "cron": _get(timetable, "expression"),
            "timezone": _zone(_get(timetable, "timezone")),
        }
    if name == "DeltaTriggerTimetable":
        return {
            "kind": "delta_trigger",
            "delta": delta(_get(timetable, "delta")),
            "interval": delta(_get(timetable, "interval")),
        }
    if name == "DeltaDataIntervalTimetable":
        return {"kind": "delta_data_interval", "delta": delta(_get(timetable, "delta"))}
    if name == "MultipleCronTriggerTimetable":
        crons = _get(timetable, "timetables")
        return {
            "kind": "multiple_cron_trigger",
            "crons": [_get(t, "expression") for t in crons],
            "timezone": _zone(_get(crons[0], "timezone")),
            "interval": delta(_get(crons[0], "interval")),
            "run_immediately": _run_immediately(_get(crons[0], "run_immediately")),
        }
    if name == "EventsTimetable":
        return {
            "kind": "events",
            "event_dates": [d.isoformat() for d in timetable.event_dates],
            "restrict_to_events": bool(timetable.restrict_to_events),
            "description": timetable.description,
        }
    return None


def _time_fields(dag: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {"timezone": _zone(dag.timezone), "catchup": bool(dag.catchup)}
    for name in ("start_date", "end_date"):
        value = getattr(dag, name)
        if value is not None:
            fields[name] = value.isoformat()
    return fields


def _shown_time_fields(dag: Any) -> dict[str, Any]:
    """`_time_fields` of a Dag without a time schedule, defaults left out. A zone that is no
    IANA name (a fixed offset) is left out too: the dates carry their offset, and the service
    would refuse the Dag for a field that changes nothing it runs."""
    import zoneinfo

    fields = {k: v for k, v in _time_fields(dag).items() if (k, v) not in _TIME_DEFAULTS}
    try:
        zoneinfo.ZoneInfo(fields.get("timezone", "UTC"))
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        fields.pop("timezone")
    return fields


_TIME_DEFAULTS = {("timezone", "UTC"), ("catchup", False)}


def _schedule(dag: Any, *, where: str, manual_only: bool) -> Any:
    from airflow.sdk.definitions.timetables.assets import AssetTriggeredTimetable
    from airflow.sdk.definitions.timetables.simple import NullTimetable

    timetable = dag.timetable
    if isinstance(timetable, NullTimetable):
        return None
    if type(timetable) is AssetTriggeredTimetable or _is_asset_or_time(timetable):
        return _condition(timetable.asset_condition, where=where)
    if manual_only:
        return None
    raise DagFileError(
        f"{where}: Dag {dag.dag_id!r} has schedule {timetable.__class__.__name__} "
        f"({getattr(timetable, 'summary', '') or dag.schedule!r}); the service runs "
        "asset-triggered, manual and Airflow's cron, delta, events and once schedules "
        "(--manual-only syncs it as manual-only)"
    )


def _seconds(value: Any) -> float | None:
    if value is None:
        return None
    return float(value.total_seconds()) if hasattr(value, "total_seconds") else float(value)


def _weight_rule(task: Any, *, where: str) -> str:
    """The definition's `weight_rule` of a task: one of Airflow's three strategies, named by
    its rule, its class's qualified name or an instance of it. A custom strategy (a plugin's
    `PriorityWeightStrategy`) is refused, naming the task: the service cannot run its code."""
    rule = task.weight_rule
    if isinstance(rule, str):
        name = str(getattr(rule, "value", rule))
    else:
        name = f"{type(rule).__module__}.{type(rule).__qualname__}"
    if name not in WEIGHT_RULES:
        raise DagFileError(
            f"{where}: Dag {task.dag_id!r}, task {task.task_id!r}: weight_rule {name!r} is a "
            "custom priority weight strategy, which the service cannot run (only downstream, "
            "upstream and absolute)"
        )
    return WEIGHT_RULES[name]


def _task(task: Any, *, where: str) -> dict[str, Any]:
    from airflow.sdk import Asset, AssetAlias

    outlets = [_asset(o) for o in task.outlets if isinstance(o, Asset)]
    aliases = [o.name for o in task.outlets if isinstance(o, AssetAlias)]
    # Its `Asset` inlets only, as Airflow's inlet check reads them (`validate_inlets_and_outlets`
    # in airflow/api_fastapi/execution_api/routes/task_instances.py).
    inlets = [_asset(i) for i in task.inlets if isinstance(i, Asset)]
    definition: dict[str, Any] = {"task_id": task.task_id, "retries": int(task.retries or 0)}
    # Only what differs from the definition format's defaults (which are Airflow's).
    optional = {
        "upstream": sorted(task.upstream_task_ids),
        "trigger_rule": str(getattr(task.trigger_rule, "value", task.trigger_rule)),
        "retry_delay_seconds": _seconds(task.retry_delay) or 0.0,
        "retry_exponential_backoff": float(task.retry_exponential_backoff or 0),
        "max_retry_delay_seconds": _seconds(task.max_retry_delay),
        "depends_on_past": bool(task.depends_on_past),
        "ignore_first_depends_on_past": bool(task.ignore_first_depends_on_past),
        "wait_for_downstream": bool(task.wait_for_downstream),
        "priority_weight": int(task.priority_weight),
        "weight_rule": _weight_rule(task, where=where),
        "pool": str(task.pool),
        "pool_slots": int(task.pool_slots),
        "queue": str(task.queue),
        "max_active_tis_per_dag": task.max_active_tis_per_dag,
        "max_active_tis_per_dagrun": task.max_active_tis_per_dagrun,
        # Setup and teardown tasks (issue 39), as Airflow's serialization keeps them.
        "is_setup": bool(task.is_setup),
        "is_teardown": bool(task.is_teardown),
        "on_failure_fail_dagrun": bool(task.on_failure_fail_dagrun),
    }
    definition.update({k: v for k, v in optional.items() if v != TASK_DEFAULTS[k]})
    # Shown only (issue 39): the owner Airflow's Dag owners are made of, and the doc.
    if task.owner and task.owner != DEFAULT_OWNER:
        definition["owner"] = str(task.owner)
    if task.doc_md:
        definition["doc_md"] = str(task.doc_md)
    if outlets:
        definition["outlets"] = outlets
    if aliases:
        definition["outlet_aliases"] = aliases
    if inlets:
        definition["inlets"] = inlets
    return definition


def _expand(task: Any, *, where: str, dag_id: str) -> dict[str, Any] | None:
    """The definition's `expand` of a task (issue 25; None: not mapped). The service needs only
    how many map indexes there are and where that number comes from; the worker resolves each
    map index's arguments itself, from this file and the upstream's XCom, as Airflow's Task SDK
    does. So:

    - `.expand(arg=...)` over a literal list or dict: that length (the values stand in as
      nulls); over several literals: the cross product's length (their lengths multiplied),
      under the first argument's name;
    - `.expand(arg=upstream())` over an upstream task's return value (a mapped one's too:
      second order): `{"xcom": ...}`, also through `.map(f)` (`upstream().map(f)`: the same
      length);
    - `.expand_kwargs(...)` over a literal list of dicts or an upstream's return value: the
      same, under the name `kwargs` (one map index per dict);
    - over `a.zip(b, ...)` (issue 39): `{"zip": [{"xcom": ...}, ...]}`, with `"fillvalue"`
      when the zip has one (its value when JSON holds it, else its repr: the service needs only
      that there is one, the Task SDK reads the value from this file); over `a.concat(b, ...)`:
      `{"concat": [...]}`; each of their parts an upstream's return value, also through `.map(f)`
      (a `.map(f)` of a zip or concat keeps its length too).

    A task in a mapped task group (`@task_group` ... `.expand(...)` / `.expand_kwargs(...)`)
    gets the group's `expand` by the same rules, from the group's expand input, and the
    group's id as its `map_group` (`_dag`).

    Anything else (an XCom among several arguments, a zip or concat inside another, a mapped
    task inside a mapped group or a mapped group inside another) is refused, naming the task."""
    from airflow.sdk.definitions._internal.expandinput import (
        DictOfListsExpandInput,
        ListOfDictsExpandInput,
    )
    from airflow.sdk.definitions._internal.types import is_arg_set
    from airflow.sdk.definitions.xcom_arg import (
        ConcatXComArg,
        MapXComArg,
        PlainXComArg,
        ZipXComArg,
    )

    def refuse(how: str) -> DagFileError:
        return DagFileError(
            f"{where}: Dag {dag_id!r} maps task {task.task_id!r} {how}, which the service "
            "does not run yet"
        )

    def output(value: Any) -> dict[str, str] | None:
        while isinstance(value, MapXComArg):
            # `.map(f)` keeps its value's length: one map index per item, as without it (the
            # Task SDK applies f to each item when it resolves a map index's arguments).
            value = value.arg
        if isinstance(value, PlainXComArg) and value.key == "return_value":
            # A mapped upstream's output too (second order): the service counts the return
            # values its map indexes pushed, and the Task SDK reads them as a LazyXComSequence.
            return {"xcom": value.operator.task_id}
        return None

    def source(value: Any) -> list[None] | dict[str, Any] | None:
        if isinstance(value, list | tuple | dict):
            return [None] * len(value)
        while isinstance(value, MapXComArg):
            value = value.arg
        if not isinstance(value, ZipXComArg | ConcatXComArg):
            return output(value)
        kind = "zip" if isinstance(value, ZipXComArg) else "concat"
        parts = [output(arg) for arg in value.args]
        for arg, part in zip(value.args, parts, strict=True):
            if part is None:
                raise refuse(
                    f"over a {kind} holding {type(arg).__name__} (only task outputs, also "
                    "through .map)"
                )
        combined: dict[str, Any] = {kind: parts}
        if isinstance(value, ZipXComArg) and is_arg_set(value.fillvalue):
            try:
                combined["fillvalue"] = json.loads(json.dumps(value.fillvalue))
            except (TypeError, ValueError):
                combined["fillvalue"] = repr(value.fillvalue)
        return combined

    group = task.get_closest_mapped_task_group()
    if group is not None:
        if getattr(task, "is_mapped", False):
            raise refuse(f"with .expand inside the mapped task group {group.group_id!r}")
        if len(list(task.iter_mapped_task_groups())) > 1:
            raise refuse(f"in the mapped task group {group.group_id!r} inside another one")
        expand_input = group._expand_input
    elif not getattr(task, "is_mapped", False):
        return None
    else:
        expand_input = task._get_specified_expand_input()
    if isinstance(expand_input, ListOfDictsExpandInput):
        found = source(expand_input.value)
        if found is None:
            raise refuse(
                f"with .expand_kwargs over {type(expand_input.value).__name__} (only a literal "
                "list or a task's output)"
            )
        return {"kwargs": found}
    if not isinstance(expand_input, DictOfListsExpandInput):
        raise refuse(f"with {type(expand_input).__name__}")
    sources = {argument: source(value) for argument, value in expand_input.value.items()}
    for argument, found in sources.items():
        if found is None:
            value = expand_input.value[argument]
            raise refuse(f"over {type(value).__name__} (only a literal or a task's output)")
    if len(sources) == 1:
        return sources
    if any(isinstance(found, dict) for found in sources.values()):
        raise refuse(
            f"over {len(sources)} arguments, one of them an XCom (a cross product the service "
            "can count only over literals)"
        )
    length = 1
    for found in sources.values():
        length *= len(found or [])
    return {next(iter(sources)): [None] * length}


def _dag(dag: Any, *, where: str, manual_only: bool) -> dict[str, Any]:
    refused = [f"{where}: {text}" for text in ledger.refusals(dag)]
    if refused:
        raise DagFileError("\n".join(refused))
    tasks = []
    for task in sorted(dag.tasks, key=lambda t: t.task_id):
        definition = _task(task, where=where)
        expand = _expand(task, where=where, dag_id=dag.dag_id)
        if expand is not None:
            definition["expand"] = expand
            group = task.get_closest_mapped_task_group()
            if group is not None:
                definition["map_group"] = group.group_id
        tasks.append(definition)
    timetable = _timetable(dag, where=where)
    with_assets = _is_asset_or_time(dag.timetable)
    definition: dict[str, Any] = {
        "dag_id": dag.dag_id,
        "schedule": (
            _schedule(dag, where=where, manual_only=manual_only)
            if timetable is None or with_assets
            else None
        ),
        "description": dag.description or "",
        "tasks": tasks,
    }
    # Shown as Airflow shows them (issue 39): every tag, the service's own
    # `xcom_read_scope:` / `consumption:` ones too (ordinary tags to Airflow), and the doc.
    if dag.tags:
        definition["tags"] = sorted(dag.tags)
    # Every task group (Airflow's `task_group_dict`, nested ones too) with the tasks in it, for
    # the reads by `task_group_id` (`get_task_states`, `get_ti_count`).
    groups = {
        group_id: sorted(task.task_id for task in group.iter_tasks())
        for group_id, group in sorted(dag.task_group_dict.items())
    }
    if groups:
        definition["task_groups"] = groups
    if dag.doc_md:
        definition["doc_md"] = str(dag.doc_md)
    if dag.is_paused_upon_creation is not None:
        # None: Airflow's dags_are_paused_at_creation decides, here the service's setting.
        definition["is_paused"] = bool(dag.is_paused_upon_creation)
    if dag.max_active_runs:
        definition["max_active_runs"] = int(dag.max_active_runs)
    if dag.max_consecutive_failed_dag_runs:
        definition["max_consecutive_failed_dag_runs"] = int(dag.max_consecutive_failed_dag_runs)
    if dag.dagrun_timeout is not None:
        definition["dagrun_timeout_seconds"] = _seconds(dag.dagrun_timeout)
    # Airflow's [core] max_active_tasks_per_dag fills it when the Dag sets none; the
    # definition's default is that setting's default, 16.
    if int(dag.max_active_tasks) != 16:
        definition["max_active_tasks"] = int(dag.max_active_tasks)
    scopes = sorted(
        t[len(XCOM_READ_SCOPE_TAG) :] for t in dag.tags if t.startswith(XCOM_READ_SCOPE_TAG)
    )
    if len(scopes) > 1:
        raise DagFileError(f"{where}: Dag {dag.dag_id!r} has more than one xcom_read_scope tag")
    if scopes:
        definition["xcom_read_scope"] = scopes[0]
    consumption = _consumption(dag, where=where)
    if consumption is not None:
        definition["consumption"] = consumption
    watchers = _watchers(dag, where=where)
    if watchers:
        definition["watchers"] = watchers
    params = _params(dag, where=where)
    if params:
        definition["params"] = params
    if dag.fail_fast:
        definition["fail_fast"] = True
    # Dag-level callbacks (issue 39): run by this worker from the file on a request the
    # service writes when a run finishes (`airflow_worker/dag_callbacks.py`).
    if dag.has_on_success_callback:
        definition["has_on_success_callback"] = True
    if dag.has_on_failure_callback:
        definition["has_on_failure_callback"] = True
    if dag.allowed_run_types:
        definition["allowed_run_types"] = sorted(str(t.value) for t in dag.allowed_run_types)
    if timetable is not None:
        definition["timetable"] = timetable
        definition.update(_time_fields(dag))
    else:
        # What Airflow's Dag details show of a Dag without a time schedule (issue 39): its
        # zone, dates and catchup, carried when they are not the defaults.
        definition.update(_shown_time_fields(dag))
    if with_assets:
        definition["schedule_mode"] = "asset_or_time"
    return definition


def _params(dag: Any, *, where: str) -> dict[str, dict[str, Any]]:
    """The Dag's params in order, as Airflow serializes them: each Param's default (no key when
    it has none), description, JSON Schema and source. The service checks a run's conf against
    them as Airflow does; the Task SDK resolves them for the tasks from this file."""
    from airflow.sdk.definitions._internal.types import is_arg_set

    params: dict[str, dict[str, Any]] = {}
    for name in dag.params:
        param = dag.params.get_param(name)
        spec: dict[str, Any] = {}
        if is_arg_set(param.value):
            spec["default"] = param.value
        if param.description is not None:
            spec["description"] = param.description
        if param.schema:
            spec["schema"] = param.schema
        if getattr(param, "source", None) is not None:
            spec["source"] = param.source
        try:
            json.dumps(spec)
        except (TypeError, ValueError) as exc:
            raise DagFileError(
                f"{where}: Dag {dag.dag_id!r}, param {name!r}: its schema is not JSON ({exc})"
            ) from None
        params[name] = spec
    return params


def _consumption(dag: Any, *, where: str) -> str | dict[str, int] | None:
    """The definition's `consumption` from the Dag's `consumption:` tag (None: none)."""
    tags = sorted(t[len(CONSUMPTION_TAG) :] for t in dag.tags if t.startswith(CONSUMPTION_TAG))
    if not tags:
        return None
    if len(tags) > 1:
        raise DagFileError(f"{where}: Dag {dag.dag_id!r} has more than one consumption tag")
    (tag,) = tags
    if tag in ("batch", "per_event"):
        return tag
    key, _, number = tag.partition("=")
    if key == "max_events" and number.isdigit() and int(number) >= 1:
        return {"max_events": int(number)}
    raise DagFileError(
        f"{where}: Dag {dag.dag_id!r} has the tag {CONSUMPTION_TAG + tag!r}: expected "
        "consumption:batch, consumption:per_event or consumption:max_events=N (N >= 1)"
    )


@dataclass(frozen=True)
class ImportFailure:
    """A file of the folder that did not import, or holds a Dag the service cannot run: its
    path relative to the folder and what went wrong (Airflow's stack trace, or our reason)."""

    rel_path: str
    error: str


@dataclass(frozen=True)
class Folder:
    """What a folder gives: the Dags of every file that imported, grouped by file (sorted),
    and the files that did not (Airflow's import errors; the other files still sync)."""

    files: list[DagFile]
    import_errors: list[ImportFailure]


def parse_folder(folder: Path, *, manual_only: bool = False) -> Folder:
    """Every Dag of the `*.py` files under `folder`. A file that does not import is an import
    error (Airflow's own stack trace); a Dag the service cannot run makes its file one too (the
    reason names the Dag), and that Dag is left out while the file's other Dags still sync, as
    Airflow serializes the Dags of a file that bagged and records the error beside them."""
    from airflow.dag_processing.dagbag import BundleDagBag

    folder = folder.resolve()
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    # Airflow's dag-processor parses with BundleDagBag, which puts the Dag folder on sys.path
    # (once): a file may import a helper module beside it. The Task SDK's task runner parses
    # with it too, so a task of that file runs with the same imports.
    bag = BundleDagBag(dag_folder=str(folder), bundle_path=folder)
    errors: dict[str, list[str]] = {
        str(file): [str(error).rstrip()] for file, error in bag.import_errors.items()
    }
    by_file: dict[str, list[dict[str, Any]]] = {}
    for dag_id in sorted(bag.dags):
        dag = bag.dags[dag_id]
        rel_path = str(Path(dag.fileloc).resolve().relative_to(folder))
        try:
            definition = _dag(dag, where=rel_path, manual_only=manual_only)
        except DagFileError as exc:
            errors.setdefault(rel_path, []).append(f"DagFileError: {exc}")
            continue
        by_file.setdefault(rel_path, []).append(definition)
    return Folder(
        files=[
            DagFile(rel_path=path, definitions=defs, **_source(folder / path))
            for path, defs in sorted(by_file.items())
        ],
        import_errors=[
            ImportFailure(rel_path=path, error="\n".join(lines))
            for path, lines in sorted(errors.items())
        ],
    )


def _source(path: Path) -> dict[str, Any]:
    try:
        source, size = read_source(path)
    except OSError:  # gone since it was parsed: its definitions still sync, without a source
        return {}
    return {"source": source, "source_size": size}
