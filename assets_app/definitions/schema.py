"""The DAG definition document as pydantic models: its structural validation and the JSON Schema
published for DAG authors (`docs/dag-definition.schema.json`, `python manage.py dag_schema`).

The models say what a document may hold: the keys of each object (`extra="forbid"`), their types
(strict: a boolean is not an integer, `"3"` not a number), lengths, patterns and bounds. Where a
value has kinds (a Dag file, an asset reference, a schedule condition, the backoff) the union is
tagged by a function of the value, so a bad value gets one error from the member it meant to be,
not one from every member. `problem` turns pydantic's first error (a misspelt key before the key
it leaves missing) into the JSON path users see (`[0].tasks[1].outlets[0].name`: tags dropped,
indexes in brackets) and a short message.

What a schema cannot say stays in plain functions after this validation: references between
tasks and Dags, duplicates, cycles (`definitions`), the condition depth limit (`limits`, checked
before pydantic walks the tree, so a deep condition never reaches its recursion).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ..guards import limits
from ..models.assets import ASSET_KEY_MAX_LENGTH
from ..models.dags import (
    DAG_ID_MAX_LENGTH,
    DEFAULT_OWNER,
    DEFAULT_QUEUE,
    DEFAULT_RETRY_DELAY_SECONDS,
    OWNERS_MAX_LENGTH,
    PRIORITY_WEIGHT_MAX,
    PRIORITY_WEIGHT_MIN,
    TAG_MAX_LENGTH,
    TASK_QUEUE_MAX_LENGTH,
    TriggerRule,
    WeightRule,
)
from ..models.pools import DEFAULT_POOL_NAME, POOL_NAME_MAX_LENGTH
from ..models.watchers import (
    BODY_FIELD_MAX_LENGTH,
    BODY_VALUE_MAX_LENGTH,
    BROKER_URL_MAX_LENGTH,
    PATTERN_MAX_LENGTH,
    QUEUE_NAME_MAX_LENGTH,
    WATCHER_NAME_MAX_LENGTH,
)
from . import params as dag_params
from . import timetables

ID_PATTERN = r"^[A-Za-z0-9_.-]+$"
NOT_BLANK = r"\S"
DEFAULT_MAX_ACTIVE_RUNS = 16
# Airflow's `[core] max_active_tasks_per_dag`.
DEFAULT_MAX_ACTIVE_TASKS = 16

# A dag_id, task_id or upstream id: it appears in URLs.
Identifier = Annotated[str, Field(min_length=1, max_length=DAG_ID_MAX_LENGTH, pattern=ID_PATTERN)]
AssetKey = Annotated[str, Field(min_length=1, max_length=ASSET_KEY_MAX_LENGTH, pattern=NOT_BLANK)]
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _Object(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    # How a message names this object, and what an unknown key in it is called.
    what: ClassVar[str] = "an object"
    unknown_key: ClassVar[str] = "unknown key {key!r} in {what} (allowed: {allowed})"


def _no_default(schema: dict[str, Any]) -> None:
    del schema["default"]


class AssetObject(_Object):
    """An asset as `{"name", "uri"}`; one of them given: the other equals it."""

    model_config = ConfigDict(
        json_schema_extra={"anyOf": [{"required": ["name"]}, {"required": ["uri"]}]}
    )

    what: ClassVar[str] = "an asset reference"
    empty: ClassVar[str] = "asset reference needs a name or a uri"
    # "" is only "not given": the keys' values must not be empty (nor null).
    name: AssetKey = Field("", json_schema_extra=_no_default)
    uri: AssetKey = Field("", json_schema_extra=_no_default)

    @model_validator(mode="after")
    def _name_or_uri(self) -> AssetObject:
        if not self.name and not self.uri:
            raise PydanticCustomError("asset_ref_empty", self.empty)
        return self


def _tagger(kinds: dict[type, str], error: str, message: str) -> Discriminator:
    """A union tagged by the value's Python type (`kinds`); any other type is `error`."""

    def tag(value: Any) -> str | None:
        return next((t for kind, t in kinds.items() if type(value) is kind), None)

    return Discriminator(tag, custom_error_type=error, custom_error_message=message)


AssetRef = Annotated[
    Annotated[AssetKey, Tag("~asset_name")] | Annotated[AssetObject, Tag("~asset_ref")],
    _tagger(
        {str: "~asset_name", dict: "~asset_ref"},
        "asset_ref_type",
        "asset reference must be a string or an object",
    ),
    Field(description='An asset: its name (the uri equals it) or {"name", "uri"}.'),
]


# --- schedule conditions -------------------------------------------------------------------

CONDITION_OPERATORS = ("all", "any", "alias", "asset")


class ConditionAsset(AssetObject):
    """Met when the asset `{"name", "uri"}` has new events."""

    what: ClassVar[str] = "a condition"
    empty: ClassVar[str] = "condition must not be empty"
    unknown_key: ClassVar[str] = (
        "unknown condition operator {key!r} (expected all, any, alias, asset, name, uri)"
    )


class _Operator(_Object):
    unknown_key: ClassVar[str] = "{allowed!r} must be the only key of its condition, got {key!r}"


class AllCondition(_Operator):
    """Met when every condition of the list is."""

    what: ClassVar[str] = "an 'all' condition"
    all: list[Condition] = Field(min_length=1)


class AnyCondition(_Operator):
    """Met when any condition of the list is."""

    what: ClassVar[str] = "an 'any' condition"
    any: list[Condition] = Field(min_length=1)


class AliasCondition(_Operator):
    """Met when any asset the alias resolves to has new events."""

    what: ClassVar[str] = "an 'alias' condition"
    alias: AssetKey


class AssetCondition(_Operator):
    """An asset reference, the normalized form stored on a Dag's schedule."""

    what: ClassVar[str] = "an 'asset' condition"
    asset: AssetRef


def _condition_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "~asset_name"
    if isinstance(value, dict):
        operator = next((key for key in CONDITION_OPERATORS if key in value), "condition_ref")
        return f"~{operator}"
    return None


Condition = Annotated[
    Union[  # noqa: UP007 (a forward reference inside: `|` would evaluate it)
        Annotated[AssetKey, Tag("~asset_name")],
        Annotated[ConditionAsset, Tag("~condition_ref")],
        Annotated[AllCondition, Tag("~all")],
        Annotated[AnyCondition, Tag("~any")],
        Annotated[AliasCondition, Tag("~alias")],
        Annotated[AssetCondition, Tag("~asset")],
    ],
    Discriminator(
        _condition_kind,
        custom_error_type="condition_type",
        custom_error_message="condition must be a string or an object",
    ),
]
AllCondition.model_rebuild()
AnyCondition.model_rebuild()


def _shallow_condition(value: Any) -> Any:
    path = limits.condition_too_deep(value)
    if path is not None:
        raise PydanticCustomError(
            "condition_too_deep",
            f"conditions nest deeper than the {limits.MAX_CONDITION_DEPTH} levels allowed",
            {"subpath": path},
        )
    return value


# A whole schedule: the depth limit first, so pydantic never recurses into a deeper tree.
Schedule = Annotated[
    Condition,
    BeforeValidator(_shallow_condition),
    Field(
        description='An asset name, {"name", "uri"}, {"asset": {...}}, {"alias": name}, '
        f'or {{"all": [...]}} / {{"any": [...]}}, nested at most {limits.MAX_CONDITION_DEPTH} '
        "levels."
    ),
]
SCHEDULE = TypeAdapter(Schedule)


# --- time schedules (issue 24) ------------------------------------------------------------
# Airflow 3.3.2's timetables with their parameters and defaults; `timetables` computes them.

CronText = Annotated[
    str,
    Field(
        min_length=1,
        max_length=200,
        pattern=NOT_BLANK,
        description="A cron expression of 5 fields, or 6 with the seconds last (as Airflow's "
        "croniter reads it), or a preset (@hourly, @daily, @weekly, @monthly, @quarterly, "
        "@yearly).",
    ),
]
ZoneName = Annotated[
    str, Field(min_length=1, max_length=64, description="An IANA time zone, e.g. Europe/Zurich.")
]
PositiveSeconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
# An ISO 8601 date-time; without an offset it is a wall time in the Dag's time zone.
DateTimeText = Annotated[
    str,
    Field(
        min_length=10,
        max_length=40,
        pattern=r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?(Z|[+-]\d{2}:?\d{2})?$",
        description="ISO 8601; without an offset, a wall time in the Dag's time zone.",
    ),
]
RunImmediately = Annotated[
    bool | Seconds | None,
    Field(
        description="CronTriggerTimetable's run_immediately: the first run of a Dag without a "
        "start date is the latest past tick if true, or if that tick is at most this many "
        "seconds old; false or null: 10% of the gap between ticks (at least 5 minutes), as "
        "Airflow's code does."
    ),
]


class _Timetable(_Object):
    what: ClassVar[str] = "a timetable"


class CronTrigger(_Timetable):
    """CronTriggerTimetable: a run at each tick; logical date = tick - interval."""

    kind: Literal["cron_trigger"]
    cron: CronText
    timezone: ZoneName | None = Field(None, description="Default: the Dag's.")
    interval: Seconds = 0.0
    run_immediately: RunImmediately = False


class CronDataInterval(_Timetable):
    """CronDataIntervalTimetable: a run at the end of each interval between ticks."""

    kind: Literal["cron_data_interval"]
    cron: CronText
    timezone: ZoneName | None = Field(None, description="Default: the Dag's.")


class DeltaTrigger(_Timetable):
    """DeltaTriggerTimetable: a run every `delta` seconds; logical date = run - interval."""

    kind: Literal["delta_trigger"]
    delta: PositiveSeconds
    interval: Seconds = 0.0


class DeltaDataInterval(_Timetable):
    """DeltaDataIntervalTimetable: intervals of `delta` seconds, a run at the end of each."""

    kind: Literal["delta_data_interval"]
    delta: PositiveSeconds


class MultipleCronTrigger(_Timetable):
    """MultipleCronTriggerTimetable: a run when any cron ticks, one per time."""

    kind: Literal["multiple_cron_trigger"]
    crons: list[CronText] = Field(min_length=1)
    timezone: ZoneName | None = Field(None, description="Default: the Dag's.")
    interval: Seconds = 0.0
    run_immediately: RunImmediately = False


class Events(_Timetable):
    """EventsTimetable: a run at each listed date."""

    kind: Literal["events"]
    event_dates: list[DateTimeText] = Field(max_length=10_000)
    restrict_to_events: bool = False
    description: str | None = Field(None, max_length=1000)


class Once(_Timetable):
    """OnceTimetable (`@once`): one run, at the start date."""

    kind: Literal["once"]


TIMETABLE_KINDS: dict[str, type[_Timetable]] = {
    "cron_trigger": CronTrigger,
    "cron_data_interval": CronDataInterval,
    "delta_trigger": DeltaTrigger,
    "delta_data_interval": DeltaDataInterval,
    "multiple_cron_trigger": MultipleCronTrigger,
    "events": Events,
    "once": Once,
}


def _timetable_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "~cron_text"
    if isinstance(value, dict):
        kind = value.get("kind")
        return f"~{kind}" if kind in TIMETABLE_KINDS else "~timetable_kind"
    return None


def _unknown_kind(value: Any) -> Any:
    kind = value.get("kind")
    if kind is None:
        raise PydanticCustomError("timetable_kind", "a timetable object needs a kind")
    allowed = ", ".join(TIMETABLE_KINDS)
    raise PydanticCustomError(
        "timetable_kind", f"unknown timetable kind {kind!r} (allowed: {allowed})"
    )


TimetableSpec = Annotated[
    Union[  # noqa: UP007 (the tagged members read as a table)
        Annotated[CronText, Tag("~cron_text")],
        Annotated[CronTrigger, Tag("~cron_trigger")],
        Annotated[CronDataInterval, Tag("~cron_data_interval")],
        Annotated[DeltaTrigger, Tag("~delta_trigger")],
        Annotated[DeltaDataInterval, Tag("~delta_data_interval")],
        Annotated[MultipleCronTrigger, Tag("~multiple_cron_trigger")],
        Annotated[Events, Tag("~events")],
        Annotated[Once, Tag("~once")],
        Annotated[dict, BeforeValidator(_unknown_kind), Tag("~timetable_kind")],
    ],
    Discriminator(
        _timetable_kind,
        custom_error_type="timetable_type",
        custom_error_message="timetable must be a cron string, a preset or an object with a kind",
    ),
    Field(
        description='A time schedule: a cron expression or preset ("@daily", "0 3 * * *", '
        '"@once"; a CronTriggerTimetable, as in Airflow 3), or {"kind": ...} for the other '
        "timetables."
    ),
]


# --- Dags ----------------------------------------------------------------------------------

Backoff = Annotated[
    Annotated[bool, Tag("~bool")] | Annotated[Seconds, Tag("~number")],
    Discriminator(lambda value: "~bool" if isinstance(value, bool) else "~number"),
    Field(description="Airflow's retry delay multiplier; true means 2.0, false 0."),
]


# --- dynamic task mapping (issue 25) --------------------------------------------------------

ArgumentName = Annotated[
    str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
]


class XComArg(_Object):
    """The return value of an upstream task (its XCom `return_value`), as the list to map over."""

    what: ClassVar[str] = "an expand reference"
    xcom: Identifier = Field(description="task_id of an upstream task (listed in `upstream`).")


class ZipArg(_Object):
    """Airflow's `a.zip(b, ...)` of upstream return values: map index i gets their i-th values
    together (the Task SDK's tuple); as many map indexes as the shortest has values, or, with
    `fillvalue`, the longest (Airflow's `get_task_map_length`)."""

    what: ClassVar[str] = "a zip"
    zip: list[XComArg] = Field(
        min_length=1, description="The upstream return values zipped, in order."
    )
    fillvalue: Any = Field(
        None,
        json_schema_extra=_no_default,
        description="Airflow's fillvalue: given (null too), the longest one's length counts; "
        "the value itself is the worker's (it reads it from the Dag's file).",
    )

    @property
    def longest(self) -> bool:
        return "fillvalue" in self.model_fields_set


class ConcatArg(_Object):
    """Airflow's `a.concat(b, ...)` of upstream return values: one map index per value of each,
    in order (the sum of their lengths)."""

    what: ClassVar[str] = "a concat"
    concat: list[XComArg] = Field(
        min_length=1, description="The upstream return values concatenated, in order."
    )


EXPAND_SHAPES = (
    'a list of values, {"xcom": "<upstream task_id>"}, {"zip": [{"xcom": ...}, ...]} '
    '(optionally with "fillvalue") or {"concat": [{"xcom": ...}, ...]}'
)


def _expand_tag(value: Any) -> str | None:
    if type(value) is list:
        return "~literal"
    if type(value) is not dict:
        return None
    if "zip" in value:
        return "~zip"
    return "~concat" if "concat" in value else "~xcom"


ExpandValue = Annotated[
    Annotated[list[Any], Tag("~literal")]
    | Annotated[XComArg, Tag("~xcom")]
    | Annotated[ZipArg, Tag("~zip")]
    | Annotated[ConcatArg, Tag("~concat")],
    Discriminator(
        _expand_tag,
        custom_error_type="expand_type",
        custom_error_message=f"an expand argument must be {EXPAND_SHAPES}",
    ),
]


def _one_argument(value: Any) -> Any:
    if isinstance(value, dict) and not value:
        raise PydanticCustomError("expand_arguments", "expand needs one argument, got none")
    if isinstance(value, dict) and len(value) > 1:
        raise PydanticCustomError(
            "expand_arguments",
            "expand over one argument only (the cross product of several is not served yet), "
            "got {got}",
            {"got": ", ".join(sorted(map(str, value)))},
        )
    return value


Expand = Annotated[
    dict[ArgumentName, ExpandValue],
    BeforeValidator(_one_argument),
    Field(
        json_schema_extra={"minProperties": 1, "maxProperties": 1, "additionalProperties": False},
        description="Airflow's `.expand(arg=...)`: the task runs once per value, each run a "
        f"map index. One argument: {EXPAND_SHAPES} (the values they returned, known when they "
        "succeed; of a mapped upstream, one value per return value its map indexes pushed). "
        "At most MAX_MAP_LENGTH values (Airflow's max_map_length, 1024).",
    ),
]


DOC_MD_MAX_LENGTH = 100_000
DagTag = Annotated[str, Field(min_length=1, max_length=TAG_MAX_LENGTH)]


class Task(_Object):
    """A task of a Dag."""

    what: ClassVar[str] = "a task"
    task_id: Identifier
    retries: int = Field(0, ge=0)
    outlets: list[AssetRef] = Field(default_factory=list, description="Assets it produces.")
    inlets: list[AssetRef] = Field(
        default_factory=list,
        description=(
            "Assets it reads (Airflow's inlets). The task fails before it runs when one is "
            "inactive: its name or uri held by another asset (Airflow's "
            "AirflowInactiveAssetInInletOrOutletException)."
        ),
    )
    outlet_aliases: list[AssetKey] = Field(
        default_factory=list, description="Aliases it emits events through."
    )
    upstream: list[Identifier] = Field(
        default_factory=list, description="task_ids of this Dag it runs after."
    )
    trigger_rule: TriggerRule = Field(
        TriggerRule.ALL_SUCCESS,
        strict=False,  # the enum's values, as in JSON
        description="Airflow's rule for when the task runs, given its upstream tasks' states.",
    )
    retry_delay_seconds: Seconds = Field(
        DEFAULT_RETRY_DELAY_SECONDS, description="Airflow's retry_delay, in seconds."
    )
    retry_exponential_backoff: Backoff = 0.0
    max_retry_delay_seconds: Seconds | None = None
    priority_weight: int = Field(
        1,
        ge=PRIORITY_WEIGHT_MIN,
        le=PRIORITY_WEIGHT_MAX,
        description="Airflow's priority_weight: claims take heavier tasks first.",
    )
    weight_rule: WeightRule = Field(
        WeightRule.DOWNSTREAM,
        strict=False,  # the enum's values, as in JSON
        description="Airflow's weight_rule: the effective weight is the task's own "
        "priority_weight plus those of all its downstream tasks (downstream), all its upstream "
        "tasks (upstream), or its own only (absolute).",
    )
    pool: str = Field(
        DEFAULT_POOL_NAME,
        min_length=1,
        max_length=POOL_NAME_MAX_LENGTH,
        description="Airflow's pool: the pool whose slots the task's claimed and running TIs "
        "hold. A pool that does not exist keeps its TIs from being claimed until it is "
        "created, as Airflow's scheduler does not queue them.",
    )
    pool_slots: int = Field(1, ge=1, description="Airflow's pool_slots: the slots one TI holds.")
    max_active_tis_per_dag: int | None = Field(
        None,
        ge=0,
        le=PRIORITY_WEIGHT_MAX,
        description="Airflow's: at most this many TIs of the task, over all runs, claimed or "
        "running at once (null: no limit).",
    )
    max_active_tis_per_dagrun: int | None = Field(
        None,
        ge=0,
        le=PRIORITY_WEIGHT_MAX,
        description="Airflow's: at most this many TIs of the task in one run (its map "
        "indexes) claimed or running at once (null: no limit).",
    )
    queue: str = Field(
        DEFAULT_QUEUE,
        min_length=1,
        max_length=TASK_QUEUE_MAX_LENGTH,
        description="Airflow's queue: only workers claiming from it take the task's TIs.",
    )
    expand: Expand | None = None
    map_group: Identifier | None = Field(
        None,
        description="Airflow's mapped task group (`@task_group` ... `.expand(...)`): the "
        "group's id. Every task of the group carries it with the group's `expand` (the same "
        "source for all of them); map index i of a task runs after map index i of its "
        "upstream tasks in the group. Its roots (the tasks with no upstream in the group) "
        'list the `{"xcom": ...}` task upstream.',
    )
    owner: str = Field(
        DEFAULT_OWNER,
        min_length=1,
        max_length=OWNERS_MAX_LENGTH,
        description="Airflow's task `owner` (shown only); the Dag's owners are its tasks'.",
    )
    doc_md: str | None = Field(
        None, max_length=DOC_MD_MAX_LENGTH, description="Airflow's task `doc_md` (shown only)."
    )
    depends_on_past: bool = Field(
        False,
        description="Airflow's depends_on_past: a TI runs only once the task's TIs in the Dag's "
        "previous run (by logical date) are success or skipped.",
    )
    ignore_first_depends_on_past: bool = Field(
        False, description="Airflow's: depends_on_past does not hold back the task's first TI."
    )
    wait_for_downstream: bool = Field(
        False,
        description="Airflow's wait_for_downstream: depends_on_past, and the task's direct "
        "downstream TIs in the previous run are success or skipped too.",
    )
    is_setup: bool = Field(
        False,
        description="Airflow's setup task (`@setup`, `.as_setup()`): a task downstream of it "
        "that is not its direct downstream waits for it to succeed while one of its teardowns "
        "is downstream of that task (or it has none); a run's state is not changed by it.",
    )
    is_teardown: bool = Field(
        False,
        description="Airflow's teardown task (`@teardown`, `.as_teardown(setups=...)`, whose "
        "trigger rule is all_done_setup_success): it waits for the tasks between its setups "
        "and itself, and its failure does not fail the run unless on_failure_fail_dagrun.",
    )
    on_failure_fail_dagrun: bool = Field(
        False,
        description="Airflow's: a teardown whose failure fails the run (only on a teardown).",
    )


# What a task token may read beyond its own run (issue 26; Airflow lets any token read any XCom).
XComReadScope = Literal["run", "dag", "all"]


class MaxEvents(_Object):
    """Runs of at most `max_events` queued events each (issue 28)."""

    what: ClassVar[str] = "a consumption"
    max_events: int = Field(ge=1, le=limits.MAX_EVENTS_PER_RUN)


CONSUMPTION_SHAPES = """'batch', 'per_event' or {"max_events": N}"""


def _consumption_word(value: Any) -> Any:
    if value not in ("batch", "per_event"):
        raise PydanticCustomError(
            "consumption_word",
            "consumption must be {shapes}, got {got}",
            {"shapes": CONSUMPTION_SHAPES, "got": json.dumps(value)[:80]},
        )
    return value


def _consumption_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "~mode"
    return "~max_events" if isinstance(value, dict | MaxEvents) else None


Consumption = Annotated[
    Annotated[Literal["batch", "per_event"], BeforeValidator(_consumption_word), Tag("~mode")]
    | Annotated[MaxEvents, Tag("~max_events")],
    Discriminator(
        _consumption_kind,
        custom_error_type="consumption_type",
        custom_error_message=f"consumption must be {CONSUMPTION_SHAPES}",
    ),
    Field(
        description="How many queued events one asset-triggered run consumes: `batch` (every "
        "event queued when the condition is met, Airflow's behaviour, the default), "
        "`per_event` (one run per event, in event order, each consuming exactly that event, "
        'as many at once as max_active_runs allows), or {"max_events": N} (runs of at most N '
        "events, oldest first). The bounded ones need a schedule that one event meets alone "
        "(an asset, an alias or `any` of them)."
    ),
]


WATCHER_NAME_PATTERN = re.compile(r"[-a-zA-Z0-9_]+")


def _watcher_name(value: Any) -> Any:
    if isinstance(value, str) and value and not WATCHER_NAME_PATTERN.fullmatch(value):
        raise PydanticCustomError(
            "watcher_name",
            "watcher name {name} may contain only letters, digits, '_' and '-'",
            {"name": json.dumps(value)[:80]},
        )
    return value


class Watcher(_Object):
    """A queue watcher (issue 28) feeding assets this Dag waits on: what Airflow declares as an
    `AssetWatcher` with a `MessageQueueTrigger` on an `amqp://` queue. Every message on `queue`
    that matches `routing_key` (a glob) and, with `body_field`, whose JSON body has `body_value`
    at that dotted path, registers one event on each of `assets`. Dags naming the same watcher
    share one consumer of its queue (same queue and broker), each with its own routes."""

    what: ClassVar[str] = "a watcher"
    name: Annotated[
        str,
        BeforeValidator(_watcher_name),
        Field(min_length=1, max_length=WATCHER_NAME_MAX_LENGTH),
    ] = Field(description="The watcher's name (letters, digits, '_', '-'): one consumer.")
    queue: str = Field(
        min_length=1, max_length=QUEUE_NAME_MAX_LENGTH, description="The RabbitMQ queue."
    )
    broker_url: str = Field(
        "",
        max_length=BROKER_URL_MAX_LENGTH,
        description="amqp:// or amqps:// URL; empty: the ASSET_WATCHER_BROKER_URL setting.",
    )
    assets: list[AssetRef] = Field(
        min_length=1,
        description="Assets of this Dag's schedule that each message gets an event on.",
    )
    routing_key: str = Field(
        "*",
        min_length=1,
        max_length=PATTERN_MAX_LENGTH,
        description="A glob (`*`, `?`, `[...]`) the message's routing key must match.",
    )
    body_field: str = Field(
        "",
        max_length=BODY_FIELD_MAX_LENGTH,
        description="A dotted path into the JSON body; with body_value, a match rule.",
    )
    body_value: str = Field(
        "",
        max_length=BODY_VALUE_MAX_LENGTH,
        description="The value (as JSON text for numbers, booleans, null) body_field must have.",
    )

    @model_validator(mode="after")
    def _rule(self) -> Watcher:
        def invalid(subpath: str, message: str) -> PydanticCustomError:
            return PydanticCustomError("watcher_invalid", message, {"subpath": subpath})

        if self.broker_url and not self.broker_url.startswith(("amqp://", "amqps://")):
            raise invalid(
                "broker_url",
                f"broker_url must be an amqp:// or amqps:// URL, got {self.broker_url[:80]!r}",
            )
        if self.body_value and not self.body_field:
            raise invalid("body_value", "body_value needs a body_field (the path it is read at)")
        return self


RunType = Literal[
    "manual",
    "scheduled",
    "asset_triggered",
    "asset_materialization",
    "operator_triggered",
    "backfill",
]


class Param(_Object):
    """One Dag param (Airflow's `Param`): a default (absent: none, a conf must give the value),
    a description, a JSON Schema its value must meet, and where Airflow says it came from."""

    what: ClassVar[str] = "a param"
    default: Any = Field(None, json_schema_extra=_no_default)
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    source: Literal["dag", "task"] | None = None

    def spec(self) -> dict[str, Any]:
        """As `dag_params.ParamSpecs` holds it: no "default" key when the document gives none."""
        spec: dict[str, Any] = {}
        if "default" in self.model_fields_set:
            spec["default"] = self.default
        if self.description is not None:
            spec["description"] = self.description
        if self.schema_:
            spec["schema"] = self.schema_
        if self.source is not None:
            spec["source"] = self.source
        return spec


class Dag(_Object):
    """A Dag: its schedule (the assets it waits for), its timetable, or both (`schedule_mode`),
    and its tasks."""

    what: ClassVar[str] = "a Dag"
    dag_id: Identifier
    schedule: Schedule | None = None
    max_active_runs: int = Field(DEFAULT_MAX_ACTIVE_RUNS, ge=1)
    max_active_tasks: int = Field(
        DEFAULT_MAX_ACTIVE_TASKS,
        ge=0,
        le=PRIORITY_WEIGHT_MAX,
        description="Airflow's max_active_tasks: at most this many TIs of one run claimed or "
        "running at once.",
    )
    is_paused: bool | None = Field(
        None,
        description="Paused when first synced (Airflow's is_paused_upon_creation); null or "
        "absent: the service's DAGS_ARE_PAUSED_AT_CREATION (true by default, as Airflow).",
    )
    description: str = Field("", max_length=100_000)
    tags: list[DagTag] = Field(
        default_factory=list,
        max_length=1000,
        description="Airflow's Dag `tags` (shown, and filtered on by the API's `tags`).",
    )
    doc_md: str | None = Field(
        None, max_length=DOC_MD_MAX_LENGTH, description="Airflow's Dag `doc_md` (shown only)."
    )
    tasks: list[Task] = Field(default_factory=list)
    timetable: TimetableSpec | None = None
    timezone: ZoneName = Field("UTC", description="The Dag's IANA time zone (cron ticks, dates).")
    start_date: DateTimeText | None = None
    end_date: DateTimeText | None = None
    catchup: bool = Field(False, description="Create the runs missed since the start date.")
    max_consecutive_failed_dag_runs: int = Field(
        0,
        ge=0,
        description="Airflow's max_consecutive_failed_dag_runs: the Dag is paused when this "
        "many of its last runs failed; 0: never.",
    )
    dagrun_timeout_seconds: Seconds | None = Field(
        None,
        description="Airflow's dagrun_timeout, in seconds: a running run older than this (from "
        "its start) fails and its unfinished task instances are skipped.",
    )
    schedule_mode: Literal["asset_or_time", "asset_and_time"] = Field(
        "asset_or_time",
        description="A Dag with both a schedule and a timetable: asset_or_time (Airflow's "
        "AssetOrTimeSchedule) runs on each tick and whenever the assets' condition is met; "
        "asset_and_time runs on a tick only when the condition was met by the events queued up "
        "to that tick, and consumes them (a tick without it creates no run).",
    )
    xcom_read_scope: XComReadScope = Field(
        "run",
        description=(
            "Whose XComs this Dag's task tokens may read: `run` (its own run only, the "
            "default), `dag` (any run of this Dag), `all` (any Dag's). Writes are always the "
            "token's own task only."
        ),
    )

    consumption: Consumption = "batch"
    fail_fast: bool = Field(
        False,
        description="Airflow's fail_fast: a task that fails for good fails the run's running "
        "tasks and skips the others (every task must keep the all_success trigger rule).",
    )
    has_on_success_callback: bool = Field(
        False,
        description="The Dag file has Airflow's `on_success_callback` (set by "
        "`bin/airflow-worker`'s conversion): a run that succeeds gets a callback request, run "
        "by `bin/airflow-worker` from the file.",
    )
    has_on_failure_callback: bool = Field(
        False,
        description="The Dag file has Airflow's `on_failure_callback` (set by the conversion): "
        "a run that fails (a task failure or its dagrun_timeout) gets a callback request.",
    )
    allowed_run_types: list[RunType] | None = Field(
        None,
        description="The run types this Dag allows (Airflow's `allowed_run_types`; null: "
        "every one). A door asked for another one refuses the run (400).",
    )
    params: dict[str, Param] = Field(
        default_factory=dict,
        description="Dag params (Airflow's `DAG(params=...)`), in order: a manual run's conf "
        "is checked against them as Airflow checks it (400 naming the param).",
    )
    watchers: list[Watcher] = Field(
        default_factory=list,
        description="Queue watchers feeding this Dag's scheduled assets (Airflow's "
        "AssetWatcher on a message queue).",
    )
    task_groups: dict[Identifier, list[Identifier]] = Field(
        default_factory=dict,
        description="Airflow's task groups (its `task_group_dict`): each group's id and the "
        "task ids in it, its nested groups' included. A task's reads by `task_group_id` (the "
        "ExternalTaskSensor's) find them; another group id is a 404, as on Airflow.",
    )

    @model_validator(mode="after")
    def _time_schedule(self) -> Dag:
        """What the schema cannot say about a time schedule: a zone, crons and dates that parse,
        the start date catchup needs (as Airflow's Dag refuses catchup without one)."""

        def invalid(subpath: str, message: str) -> PydanticCustomError:
            return PydanticCustomError("timetable_invalid", message, {"subpath": subpath})

        try:
            timetables.zone(self.timezone)
        except timetables.TimetableError as exc:
            raise invalid("timezone", str(exc)) from None
        if self.timetable is not None:
            spec = self.timetable
            try:
                timetables.Timetable.from_spec(
                    spec.model_dump() if isinstance(spec, BaseModel) else spec,
                    timezone=self.timezone,
                )
            except timetables.TimetableError as exc:
                raise invalid("timetable", str(exc)) from None
        for name in ("start_date", "end_date"):
            value = getattr(self, name)
            try:
                if value is not None:
                    timetables.parse_date(value, timezone=self.timezone)
            except timetables.TimetableError as exc:
                raise invalid(name, str(exc)) from None
        if self.schedule_mode != "asset_or_time" and (
            self.timetable is None or self.schedule is None
        ):
            raise invalid(
                "schedule_mode",
                f"schedule_mode {self.schedule_mode!r} needs both a schedule and a timetable",
            )
        if self.catchup and self.timetable is not None and self.start_date is None:
            raise invalid("catchup", "catchup needs a start_date (as Airflow requires)")
        if self.fail_fast:
            for i, task in enumerate(self.tasks):
                if task.trigger_rule != TriggerRule.ALL_SUCCESS:
                    # Airflow's FailFastDagInvalidTriggerRule, raised while the Dag is built.
                    raise invalid(
                        f"tasks[{i}].trigger_rule",
                        "A 'fail_fast' dag can only have TriggerRule.ALL_SUCCESS trigger rule",
                    )
        if self.allowed_run_types is not None:
            error = self._run_types_error(set(self.allowed_run_types))
            if error is not None:
                raise invalid("allowed_run_types", error)
        task_ids = {task.task_id for task in self.tasks}
        for group_id, members in self.task_groups.items():
            unknown = sorted(set(members) - task_ids)
            if unknown:
                raise invalid(
                    f"task_groups.{group_id}",
                    f"task group {group_id!r} lists {unknown[0]!r}, not a task of the Dag",
                )
        if self.schedule is not None or self.timetable is not None:
            error = dag_params.schedule_error(self.dag_id, self.param_specs())
            if error is not None:
                raise invalid("params", error)
        return self

    def _run_types_error(self, allowed: set[str]) -> str | None:
        """Airflow's checks of `allowed_run_types` (its `DAG._validate_allowed_run_types`), and
        the one combination the service refuses: an asset-or-time Dag without scheduled runs
        (Airflow leaves its ticks due for ever; the time scheduler here would take them)."""
        if not allowed:
            return None
        if self.schedule is not None:
            if "asset_triggered" not in allowed:
                return (
                    "allowed_run_types must include ASSET_TRIGGERED when the Dag is scheduled "
                    "by assets"
                )
            if self.timetable is not None and "scheduled" not in allowed:
                return (
                    "allowed_run_types without SCHEDULED on a Dag with assets and a time "
                    "schedule is not supported by the asset service"
                )
        elif self.timetable is not None:
            if "scheduled" not in allowed:
                return (
                    "allowed_run_types must include SCHEDULED when the Dag has a schedule defined"
                )
        elif "manual" not in allowed:
            return (
                "allowed_run_types must include MANUAL when the Dag has no schedule defined "
                "(schedule=None)"
            )
        return None

    def param_specs(self) -> dag_params.ParamSpecs:
        return {name: param.spec() for name, param in self.params.items()}


DagFile = Annotated[
    Annotated[Dag, Tag("~dag")] | Annotated[list[Dag], Tag("~dags")],
    _tagger(
        {dict: "~dag", list: "~dags"},
        "dag_file_type",
        "the file must hold a Dag object or a list of them",
    ),
]
DAG_FILE = TypeAdapter(DagFile)


def validate_file(document: Any) -> list[Dag]:
    """The Dags of a decoded definition file. Raises ValidationError (see `problem`)."""
    dags = DAG_FILE.validate_python(document)
    return dags if isinstance(dags, list) else [dags]


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a definition file, for DAG authors (and their editors)."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Dag definition file",
        "description": "One Dag object or a list of them, synced by `manage.py sync_dags`.",
        **DAG_FILE.json_schema(),
    }


def json_schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


# --- errors --------------------------------------------------------------------------------

_TAGS: dict[str, type[_Object]] = {
    "~dag": Dag,
    "~asset_ref": AssetObject,
    "~condition_ref": ConditionAsset,
    "~all": AllCondition,
    "~any": AnyCondition,
    "~alias": AliasCondition,
    "~asset": AssetCondition,
    "~xcom": XComArg,
    "~zip": ZipArg,
    "~concat": ConcatArg,
    **{f"~{kind}": model for kind, model in TIMETABLE_KINDS.items()},
}
_LISTED: dict[str, type[_Object]] = {
    "tasks": Task,
    "~dags": Dag,
    "watchers": Watcher,
    "zip": XComArg,
    "concat": XComArg,
}
# Objects that are the values of a mapping, by the mapping's key.
_KEYED: dict[str, type[_Object]] = {"params": Param}
_TYPE_ERRORS = {
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "bool_type": "must be true or false",
    "list_type": "must be a list",
    "dict_type": "must be an object",
}


def _model_at(loc: tuple[int | str, ...]) -> type[_Object] | None:
    """The model of the object at `loc` (pydantic's, tags included): every model but a task, a
    Dag of a list or a param sits right after its tag."""
    if loc and str(loc[-1]) in _TAGS:
        return _TAGS[str(loc[-1])]
    if len(loc) >= 2 and isinstance(loc[-1], int):
        return _LISTED.get(str(loc[-2]))
    if len(loc) >= 2:
        return _KEYED.get(str(loc[-2]))
    return None


def join(path: str, subpath: str) -> str:
    """`path` then `subpath` (`tasks[0]` + `retries`, `[0]` + `[1]`); either may be ""."""
    if not path or not subpath or subpath.startswith("["):
        return path + subpath
    return f"{path}.{subpath}"


def _path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not part.startswith("~"):
            path = join(path, part)
    return path


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


def _refused_attribute(model: type[_Object], key: str) -> str | None:
    """The attribute ledger's refusal (issue 39, `airflow_worker.ledger`) of a Dag's or task's
    key the document format lacks because the service does not run it as Airflow does (`pool`,
    `depends_on_past`, `params` of a Dag), or None for any other unknown key."""
    from airflow_worker import ledger

    entries = {
        Dag: ledger.DAG_ATTRIBUTES,
        Task: {**ledger.TASK_ATTRIBUTES, **ledger.AIRFLOW_SET_TASK_ATTRIBUTES},
    }.get(model, {})
    entry = entries.get(key)
    if not isinstance(entry, ledger.Refused):
        return None
    return f"attribute {key!r} is refused by the asset service: {entry.reason}"


def problem(exc: ValidationError) -> tuple[str, str]:
    """The first error of `exc` as (JSON path, message), e.g. (`[0].tasks[1].retries`,
    `must be at least 0, got -1`); "" is the document itself."""
    errors = exc.errors(include_url=False)
    error = errors[0]
    if error["type"] == "missing":  # a misspelt key explains a missing one: name it instead
        parent = error["loc"][:-1]
        error = next(
            (e for e in errors if e["type"] == "extra_forbidden" and e["loc"][:-1] == parent),
            error,
        )
    kind, loc, value = error["type"], error["loc"], error.get("input")
    ctx = error.get("ctx") or {}
    path = _path(loc)
    if kind == "missing":
        model = _model_at(loc[:-1])
        key = str(loc[-1])
        article = "" if key.endswith("s") else "a "  # "needs assets", "needs a queue"
        return _path(loc[:-1]), f"{model.what if model else 'it'} needs {article}{key}"
    if kind == "extra_forbidden":
        model = _model_at(loc[:-1]) or _Object
        refused = _refused_attribute(model, str(loc[-1]))
        if refused is not None:
            return path, refused
        allowed = ", ".join(field.alias or name for name, field in model.model_fields.items())
        return path, model.unknown_key.format(key=loc[-1], what=model.what, allowed=allowed)
    if kind == "model_type":
        model = _model_at(loc)
        return path, f"{model.what if model else 'it'} must be an object, got {_type(value)}"
    if loc and loc[-1] == "[key]":  # a key of a mapping: only expand's argument names
        return _path(loc[:-2]), f"argument name {loc[-2]!r} must be a Python identifier"
    if kind in _TYPE_ERRORS:
        return path, f"{_TYPE_ERRORS[kind]}, got {_type(value)}"
    if kind in (
        "asset_ref_type",
        "condition_type",
        "dag_file_type",
        "timetable_type",
        "expand_type",
    ):
        return path, f"{error['msg']}, got {_type(value)}"
    if kind in ("string_too_short", "too_short") or (
        kind == "string_pattern_mismatch" and not str(value).strip()
    ):
        return path, "must not be empty"
    if kind == "string_pattern_mismatch":
        return path, f"{value!r} may contain only letters, digits, '_', '.' and '-'"
    if kind == "string_too_long":
        return path, f"is longer than {ctx['max_length']} characters"
    if kind == "greater_than_equal":
        number = "a finite number of " if isinstance(ctx["ge"], float) else ""
        return path, f"must be {number}at least {ctx['ge']:g}, got {value}"
    if kind == "finite_number":
        return path, f"must be a finite number, got {value}"
    if kind == "enum":
        allowed = ", ".join(re.findall(r"'([^']*)'", ctx["expected"]))
        return path, f"unknown {str(loc[-1]).replace('_', ' ')} {value!r} (allowed: {allowed})"
    if kind == "condition_too_deep":
        return path + ctx["subpath"], error["msg"]
    if kind in ("timetable_invalid", "watcher_invalid"):
        return join(path, ctx["subpath"]), error["msg"]
    if kind == "greater_than":
        return path, f"must be greater than {ctx['gt']:g}, got {value}"
    return path, error["msg"]
