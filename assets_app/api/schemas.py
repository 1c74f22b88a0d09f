"""Pydantic schemas of the worker API (DESIGN 6.1).

Request bodies forbid unknown fields (422). Response models carry exactly the fields of Airflow's
Task Execution API models of version 2026-06-30 (checked against apache-airflow-task-sdk 1.3.2's
`airflow/sdk/api/datamodels/_generated.py`, which the Airflow client parses with extra="forbid"):
a field that is required-but-nullable there is always emitted, as null when unknown.
"""

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal
from uuid import NAMESPACE_URL, UUID, uuid5

import orjson
from django.core.serializers.json import DjangoJSONEncoder
from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field

from assets_app.catalog import asset_events
from assets_app.guards import run_ids
from assets_app.models import Asset, AssetEvent, DagRun, TaskInstance
from assets_app.models.dags import (
    BUNDLE_NAME_MAX_LENGTH,
    DEFAULT_BUNDLE_NAME,
    DEFAULT_QUEUE,
    TASK_QUEUE_MAX_LENGTH,
)
from assets_app.models.triggers import TRIGGER_CLASSPATH_MAX_LENGTH, TRIGGER_QUEUE_MAX_LENGTH
from assets_app.registration.payloads import AssetProfile, OutletEvent
from assets_app.task_state import claims, deferral, starting

JsonDict = dict[str, Any]

# --- field types shared with public_schemas.py: what PostgreSQL can store -------------------

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
# The TI's hostname, unixname and claimed_by columns are varchar(1000).
HOSTNAME_MAX_LENGTH = 1000
# PostgreSQL refuses a time zone displacement of 16 hours or more ("out of range").
MAX_UTC_OFFSET = timedelta(hours=16)
# Far beyond any real retry delay, and `now + delay` stays within year 9999.
MAX_RETRY_DELAY_SECONDS = 10 * 366 * 24 * 3600


def _storable_utc(value: datetime) -> datetime:
    offset = value.utcoffset()
    if offset is not None and abs(offset) >= MAX_UTC_OFFSET:
        raise ValueError("time zone offset must be less than 16 hours")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("datetime must be within years 1..9999 in UTC") from None


# An ISO 8601 datetime with a time zone, converted to UTC; a 422 for what PostgreSQL (or Python,
# reading it back) cannot hold: offsets of 16 h or more, instants outside years 1..9999 in UTC.
UtcDatetime = Annotated[AwareDatetime, AfterValidator(_storable_utc)]


def _naive_is_utc(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


# Where Airflow takes any datetime and reads a naive one as UTC (`timezone.coerce_datetime`).
NaiveIsUtcDatetime = Annotated[
    datetime, AfterValidator(_naive_is_utc), AfterValidator(_storable_utc)
]
Hostname = Annotated[str, Field(max_length=HOSTNAME_MAX_LENGTH)]
Pid = Annotated[int, Field(gt=0, le=INT32_MAX)]


class RequestBody(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ResponseBody(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- requests -------------------------------------------------------------------------------


class TIEnterRunningPayload(RequestBody):
    state: Literal["running"] = "running"
    hostname: Hostname
    unixname: Hostname
    pid: Pid
    start_date: UtcDatetime


class TISuccessStatePayload(RequestBody):
    """Outlets are the outbox payload's own types (`registration/payloads.py`): TypedDicts, kept as
    they came."""

    state: Literal["success"] = "success"
    end_date: UtcDatetime
    task_outlets: list[AssetProfile] | None = None
    outlet_events: list[OutletEvent] | None = None
    rendered_map_index: str | None = None


class TITerminalStatePayload(RequestBody):
    state: Literal["failed", "skipped", "removed", "upstream_failed"]
    end_date: UtcDatetime
    rendered_map_index: str | None = None


class TIRetryStatePayload(RequestBody):
    state: Literal["up_for_retry"] = "up_for_retry"
    end_date: UtcDatetime
    rendered_map_index: str | None = None
    retry_delay_seconds: Annotated[float | None, Field(ge=0, le=MAX_RETRY_DELAY_SECONDS)] = None
    retry_reason: str | None = None


class TIReschedulePayload(RequestBody):
    """A sensor in reschedule mode: run this try again from `reschedule_date`."""

    state: Literal["up_for_reschedule"] = "up_for_reschedule"
    reschedule_date: UtcDatetime
    end_date: UtcDatetime


# A trigger timeout beyond this would overflow a stored datetime (now + the timeout).
MAX_TRIGGER_TIMEOUT = timedelta(days=36500)


class TIDeferredStatePayload(RequestBody):
    """Airflow's `TIDeferredStatePayload` (execution API 2026-06-30): the trigger's classpath
    and kwargs (a dict, or a string the client encrypted: stored as sent), its timeout, the
    triggerer queue, and the method (and its serde-serialized kwargs) the task resumes in."""

    state: Literal["deferred"] = "deferred"
    classpath: Annotated[str, Field(min_length=1, max_length=TRIGGER_CLASSPATH_MAX_LENGTH)]
    trigger_kwargs: JsonDict | str = Field(default_factory=dict)
    trigger_timeout: Annotated[
        timedelta | None, Field(ge=-MAX_TRIGGER_TIMEOUT, le=MAX_TRIGGER_TIMEOUT)
    ] = None
    queue: Annotated[str | None, Field(max_length=TRIGGER_QUEUE_MAX_LENGTH)] = None
    next_method: Annotated[str, Field(min_length=1, max_length=1000)]
    next_kwargs: JsonDict = Field(default_factory=dict)
    rendered_map_index: str | None = None


class TIAwaitingInputStatePayload(RequestBody):
    """Airflow 3.3's `TIAwaitingInputStatePayload`: a Human-in-the-loop task parked until a
    person answers (no trigger), the method it resumes in and its response timeout."""

    state: Literal["awaiting_input"] = "awaiting_input"
    timeout: Annotated[timedelta | None, Field(ge=timedelta(0), le=MAX_TRIGGER_TIMEOUT)] = None
    next_method: Annotated[str, Field(min_length=1, max_length=1000)]
    next_kwargs: JsonDict | None = None
    rendered_map_index: str | None = None


TIStateUpdate = Annotated[
    TISuccessStatePayload
    | TITerminalStatePayload
    | TIRetryStatePayload
    | TIReschedulePayload
    | TIDeferredStatePayload
    | TIAwaitingInputStatePayload,
    Field(discriminator="state"),
]


class TIHeartbeatInfo(RequestBody):
    hostname: Hostname
    pid: Pid


class TISkippedDownstreamTasksStatePayload(RequestBody):
    """Airflow's body of `PATCH .../skip-downstream`: task ids, or [task_id, map_index] pairs."""

    tasks: Annotated[
        list[Annotated[str, Field(min_length=1)] | tuple[Annotated[str, Field(min_length=1)], int]],
        Field(max_length=10_000),
    ]


# A Dag bundle's name (Airflow's `DagBundleModel.name`, `[dag_processor]
# dag_bundle_config_list`): letters, digits, `_`, `.` and `-`, as ids here.
BundleName = Annotated[
    str, Field(min_length=1, max_length=BUNDLE_NAME_MAX_LENGTH, pattern=r"^[A-Za-z0-9_.\-]+$")
]


class ClaimRequest(RequestBody):
    hostname: Annotated[str, Field(min_length=1, max_length=HOSTNAME_MAX_LENGTH)]
    limit: Annotated[int, Field(ge=1, le=1000)] = 1
    # The queues this worker takes TIs from (Airflow's task `queue`); Airflow's
    # `[operators] default_queue` when left out.
    queues: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=TASK_QUEUE_MAX_LENGTH)]],
        Field(min_length=1, max_length=100),
    ] = [DEFAULT_QUEUE]
    # The Dag bundles this worker serves (`bin/airflow-worker --bundle`): only TIs of Dags
    # synced from one of them are claimed, and the service records that a worker serves them
    # (a Dag of a bundle no worker claimed for lately is shown as unserved). Left out: TIs of
    # any Dag, as before bundles (the reference worker).
    bundles: Annotated[list[BundleName], Field(min_length=1, max_length=100)] | None = None


class AssetEventWindow(BaseModel):
    """Query parameters shared by GET /asset-events/by-asset and /by-asset-alias. Without
    `limit` at most `asset_events.MAX_EVENTS` events are returned."""

    after: UtcDatetime | None = None
    before: UtcDatetime | None = None
    ascending: bool = True
    limit: Annotated[int | None, Field(ge=1, le=asset_events.MAX_EVENTS)] = None


# --- responses: TIRunContext ----------------------------------------------------------------


class AssetReferenceAssetEventDagRun(ResponseBody):
    name: str
    uri: str
    extra: JsonDict


class AssetAliasReferenceAssetEventDagRun(ResponseBody):
    name: str


class AssetEventDagRunReference(ResponseBody):
    asset: AssetReferenceAssetEventDagRun
    extra: JsonDict
    source_task_id: str | None
    source_dag_id: str | None
    source_run_id: str | None
    source_map_index: int | None
    source_aliases: list[AssetAliasReferenceAssetEventDagRun]
    timestamp: datetime
    partition_key: str | None = None


class DagRunOut(ResponseBody):
    dag_id: str
    run_id: str
    logical_date: datetime | None
    data_interval_start: datetime | None
    data_interval_end: datetime | None
    run_after: datetime
    start_date: datetime | None
    end_date: datetime | None
    clear_number: int | None = 0
    run_type: str
    state: str
    conf: JsonDict | None = None
    triggering_user_name: str | None = None
    consumed_asset_events: list[AssetEventDagRunReference]
    partition_key: str | None
    partition_date: datetime | None = None
    note: str | None = None
    team_name: str | None = None


class VariableResponse(ResponseBody):
    key: str
    value: str | None


class ConnectionResponse(ResponseBody):
    conn_id: str


class TIRunContext(ResponseBody):
    dag_run: DagRunOut
    task_reschedule_count: int | None = 0
    max_tries: int
    variables: list[VariableResponse] | None = None
    connections: list[ConnectionResponse] | None = None
    next_method: str | None = None
    next_kwargs: JsonDict | str | None = None
    xcom_keys_to_clear: list[str] | None = None
    should_retry: bool | None = False
    start_date: datetime | None = None

    @staticmethod
    def render(context: starting.RunContext) -> bytes:
        """The response body, encoded once: field for field what this model dumps (datetimes as
        the API's JSON encoder writes them), without a model per consumed event (tests check
        it validates against the model, extra fields forbidden, and pin the exact values).

        5,000 consumed events: validating and dumping as many nested models took ~400 ms and
        decoding their extras only to encode them again ~50 ms; this takes ~15 ms. The JSON
        the database stores (event and asset extras) and `conf` (encoded by the standard
        library: it may hold integers beyond 64 bits) are embedded as they are."""
        body = {
            "dag_run": dag_run_body(context.dag_run, context.consumed_events),
            "task_reschedule_count": context.task_reschedule_count,
            "max_tries": context.ti.max_tries,
            "variables": [],
            "connections": [],
            "next_method": None,
            "next_kwargs": None,
            "xcom_keys_to_clear": context.xcom_keys_to_clear,
            "should_retry": context.should_retry,
            "start_date": None,
        }
        ti = context.ti
        if ti.next_method:
            # Resuming from deferral (Airflow's `ti_run`: "only set if they are non-null"): the
            # method, its kwargs as the Task SDK serialized them (with the trigger's event),
            # and the first start.
            body["next_method"] = ti.next_method
            body["next_kwargs"] = ti.next_kwargs
            body["start_date"] = _wire_datetime(ti.start_date)
        return orjson.dumps(body)


def dag_run_body(run: Any, consumed_events: Any) -> dict[str, Any]:
    """Airflow's execution `DagRun` of `run` with its consumed events (`starting.
    ConsumedEvent`s), as `TIRunContext.render` and the Dag callback claim send it: JSON the
    database stores embedded as it is (`orjson.Fragment`); encode with orjson."""
    return {
        "dag_id": run.dag_id,
        "run_id": run.run_id,
        "logical_date": _wire_datetime(run.logical_date),
        "data_interval_start": _wire_datetime(run.data_interval_start),
        "data_interval_end": _wire_datetime(run.data_interval_end),
        "run_after": _wire_datetime(run.run_after),
        "start_date": _wire_datetime(run.start_date),
        "end_date": _wire_datetime(run.end_date),
        "clear_number": run.clear_number,
        "run_type": run.run_type,
        "state": run.state,
        "conf": orjson.Fragment(json.dumps(run.conf, cls=DjangoJSONEncoder)),
        "triggering_user_name": run.triggering_user_name,
        "consumed_asset_events": [
            {
                "asset": {
                    "name": event.asset_name,
                    "uri": event.asset_uri,
                    "extra": orjson.Fragment(event.asset_extra_json),
                },
                "extra": orjson.Fragment(event.extra_json),
                "source_task_id": event.source_task_id,
                "source_dag_id": event.source_dag_id,
                "source_run_id": event.source_run_id,
                "source_map_index": event.source_map_index,
                "source_aliases": [{"name": name} for name in event.source_alias_names],
                "timestamp": _wire_datetime(event.timestamp),
                "partition_key": None,
            }
            for event in consumed_events
        ],
        "partition_key": None,
        "partition_date": None,
        "note": run.note,
        "team_name": None,
    }


def _wire_datetime(value: datetime | None) -> str | None:
    """A datetime as every other response writes it (ninja's encoder: Django's, millisecond
    precision, UTC as "Z")."""
    return None if value is None else _DJANGO_JSON.default(value)


_DJANGO_JSON = DjangoJSONEncoder()


# --- responses: assets and asset events -----------------------------------------------------


class AssetResponse(ResponseBody):
    name: str
    uri: str
    group: str
    extra: JsonDict | None = None

    @classmethod
    def from_asset(cls, asset: Asset) -> "AssetResponse":
        return cls(name=asset.name, uri=asset.uri, group=asset.group, extra=asset.extra)


def run_reference_fields(run: DagRun) -> dict[str, Any]:
    """The fields of Airflow's `DagRunAssetReference` (execution and public API alike) for a run
    that consumed an event, built here once. Airflow's models require `start_date`, which its
    `DagRun.set_state` clears while a run is queued (it sets `queued_at`, and `start_date` only
    when the run starts running): a run not started yet reports the time it was queued, a moment
    that has happened (its `run_after` may lie ahead)."""
    return {
        "run_id": run.run_id,
        "dag_id": run.dag_id,
        "logical_date": run.logical_date,
        "start_date": run.start_date or run.queued_at,
        "end_date": run.end_date,
        "state": run.state,
        "data_interval_start": run.data_interval_start,
        "data_interval_end": run.data_interval_end,
        "partition_key": None,
    }


class DagRunAssetReference(ResponseBody):
    run_id: str
    dag_id: str
    logical_date: datetime | None
    # Required (not nullable) in Airflow's model: `run_reference_fields`.
    start_date: datetime
    end_date: datetime | None
    state: str
    data_interval_start: datetime | None
    data_interval_end: datetime | None
    partition_key: str | None


class AssetEventResponse(ResponseBody):
    id: int
    timestamp: datetime
    extra: JsonDict | None = None
    asset: AssetResponse
    created_dagruns: list[DagRunAssetReference]
    source_task_id: str | None = None
    source_dag_id: str | None = None
    source_run_id: str | None = None
    source_map_index: int | None = None
    partition_key: str | None = None

    @classmethod
    def from_event(cls, event: AssetEvent) -> "AssetEventResponse":
        return cls(
            id=event.id,
            timestamp=event.timestamp,
            extra=event.extra,
            asset=AssetResponse.from_asset(event.asset),
            created_dagruns=[
                DagRunAssetReference(**run_reference_fields(run))
                for run in event.consuming_runs.all()
            ],
            source_task_id=event.source_task_id,
            source_dag_id=event.source_dag_id,
            source_run_id=event.source_run_id,
            source_map_index=event.source_map_index,
            partition_key=None,
        )


class AssetEventsResponse(ResponseBody):
    asset_events: list[AssetEventResponse]

    @classmethod
    def from_events(cls, events: list[AssetEvent]) -> "AssetEventsResponse":
        return cls(asset_events=[AssetEventResponse.from_event(e) for e in events])


# --- responses: work claiming (our own endpoint) ---------------------------------------------


# The bundle Airflow's workers know without configuration (`[dag_processor]
# dag_bundle_config_list`'s default: the `[core] dags_folder` as a LocalDagBundle).
BUNDLE_NAME = "dags-folder"


class WorkloadTI(ResponseBody):
    """Airflow's `TaskInstanceDTO` (the execution API's TaskInstance plus the executor's pool
    fields) and nothing more, so airflow-core's `ExecuteTask` model validates it."""

    id: UUID
    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    try_number: int
    # No Dag versions here: a stable id per Dag (uuid5 of its dag_id) fills Airflow's field.
    dag_version_id: UUID
    hostname: str | None = None
    context_carrier: dict[str, Any] | None = None
    queue: str = "default"
    pool_slots: int = 1
    priority_weight: int = 1


class BundleInfo(ResponseBody):
    name: str
    version: str | None = None


class OutletOut(ResponseBody):
    name: str
    uri: str | None = None
    type: Literal["Asset", "AssetAlias"]


class Workload(ResponseBody):
    """Airflow's `ExecuteTask` workload (`type`, `ti`, `dag_rel_path`, `bundle_info`,
    `log_path`, `token`, `sentry_integration`), which `execute_workload` runs as it is, plus
    our `task_outlets` (Airflow's model ignores fields it does not know)."""

    type: Literal["ExecuteTask"] = "ExecuteTask"
    ti: WorkloadTI
    dag_rel_path: str
    bundle_info: BundleInfo
    log_path: str
    token: str
    sentry_integration: str = ""
    task_outlets: list[OutletOut]


def log_path_of(ti: Any) -> str:
    """Airflow's default `[logging] log_filename_template`, rendered for the TI, each part one
    safe path segment (`run_ids.path_segment`: a stored id cannot name another folder)."""
    segment = run_ids.path_segment
    mapped = f"map_index={int(ti.map_index)}/" if ti.map_index >= 0 else ""
    return (
        f"dag_id={segment(ti.dag_id)}/run_id={segment(ti.run_id)}/"
        f"task_id={segment(ti.task_id)}/{mapped}attempt={int(ti.try_number)}.log"
    )


class ClaimResponse(ResponseBody):
    workloads: list[Workload]

    @classmethod
    def from_domain(
        cls, workloads: list[claims.Workload], *, token_for: Callable[[TaskInstance], str]
    ) -> "ClaimResponse":
        return cls(
            workloads=[
                Workload(
                    ti=WorkloadTI(
                        id=w.ti.id,
                        dag_id=w.ti.dag_id,
                        run_id=w.ti.run_id,
                        task_id=w.ti.task_id,
                        map_index=w.ti.map_index,
                        try_number=w.ti.try_number,
                        dag_version_id=uuid5(NAMESPACE_URL, f"dag:{w.ti.dag_id}"),
                        priority_weight=w.priority_weight,
                        pool_slots=w.pool_slots,
                        queue=w.queue,
                    ),
                    dag_rel_path=w.dag_rel_path,
                    bundle_info=BundleInfo(name=w.bundle_name or BUNDLE_NAME),
                    log_path=log_path_of(w.ti),
                    token=token_for(w.ti),
                    task_outlets=[OutletOut(**outlet) for outlet in w.task_outlets],
                )
                for w in workloads
            ]
        )


# --- Dag callbacks (our own endpoints, issue 39) ------------------------------------------------


class DagCallbackClaimRequest(RequestBody):
    """A worker's claim of Dag callback requests: who it is and how many it takes."""

    hostname: Annotated[str, Field(min_length=1, max_length=HOSTNAME_MAX_LENGTH)]
    limit: Annotated[int, Field(ge=0, le=100)] = 10


class DagCallbackReport(RequestBody):
    """How a claimed request's callbacks went, for the attempt its claim handed out: `failed`
    when one raised (or the Dag could not be loaded), with the traceback."""

    attempt: Annotated[int, Field(ge=1, le=INT64_MAX)]
    state: Literal["success", "failed"]
    error: Annotated[str, Field(max_length=100_000)] = ""


class DagCallbackReportResponse(ResponseBody):
    state: str
    replayed: bool


def render_dag_callbacks(claimed: list[Any]) -> bytes:
    """The claim's answer: per request Airflow's `DagCallbackRequest` fields (`filepath` is
    `dag_rel_path`, `msg` the reason, `context_from_server` its `DagRunContext`: the run as
    the execution API's `DagRun`, the relevant TI as its `TaskInstance`), plus our `id` and
    `attempt` for the report (`task_state.dag_callbacks.ClaimedCallback`s)."""
    items = []
    for c in claimed:
        ti = c.last_ti
        items.append(
            {
                "id": c.request.id,
                "attempt": c.attempt,
                "dag_id": c.request.dag_id,
                "run_id": c.dag_run.run_id,
                "dag_rel_path": c.dag_rel_path,
                "bundle_name": BUNDLE_NAME,
                "is_failure_callback": c.request.is_failure_callback,
                "msg": c.request.reason,
                "context_from_server": {
                    "dag_run": dag_run_body(c.dag_run, c.consumed_events),
                    "last_ti": None
                    if ti is None
                    else {
                        "id": str(ti.id),
                        "task_id": ti.task_id,
                        "dag_id": ti.dag_id,
                        "run_id": ti.run_id,
                        "try_number": ti.try_number,
                        "dag_version_id": str(uuid5(NAMESPACE_URL, f"dag:{ti.dag_id}")),
                        "map_index": ti.map_index,
                        "hostname": ti.hostname,
                        "context_carrier": None,
                    },
                },
            }
        )
    return orjson.dumps({"callbacks": items})


# --- the triggerer (our own endpoints, issue 42) ------------------------------------------------


class TriggerClaimRequest(RequestBody):
    """A triggerer's claim: who it is, how many more triggers it takes, the ones it runs (their
    leases are renewed), and optionally only triggers of these queues."""

    triggerer: Annotated[str, Field(min_length=1, max_length=HOSTNAME_MAX_LENGTH)]
    limit: Annotated[int, Field(ge=0, le=1000)] = 100
    held: Annotated[list[Annotated[int, Field(ge=1, le=INT64_MAX)]], Field(max_length=100_000)] = (
        Field(default_factory=list)
    )
    queues: (
        Annotated[
            list[Annotated[str, Field(min_length=1, max_length=TRIGGER_QUEUE_MAX_LENGTH)]],
            Field(max_length=100),
        ]
        | None
    ) = None


class TriggerTI(ResponseBody):
    id: UUID
    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    try_number: int


class TriggerWorkload(ResponseBody):
    """Airflow's `RunTrigger` workload, the fields a triggerer needs to run it, and a task
    token of the TI's try (the execution API reads a trigger makes: Airflow's triggerer serves
    them through its supervisor)."""

    id: int
    classpath: str
    encrypted_kwargs: str
    timeout_after: datetime | None
    ti: TriggerTI
    token: str


class TriggerClaimResponse(ResponseBody):
    triggers: list[TriggerWorkload]
    released: list[int]
    lease_seconds: float

    @classmethod
    def from_domain(
        cls, claim: deferral.TriggerClaim, *, token_for: Callable[[TaskInstance], str]
    ) -> "TriggerClaimResponse":
        return cls(
            triggers=[
                TriggerWorkload(
                    id=t.id,
                    classpath=t.classpath,
                    encrypted_kwargs=t.encrypted_kwargs,
                    timeout_after=t.timeout_after,
                    ti=TriggerTI(
                        id=t.ti.id,
                        dag_id=t.ti.dag_id,
                        run_id=t.ti.run_id,
                        task_id=t.ti.task_id,
                        map_index=t.ti.map_index,
                        try_number=t.ti.try_number,
                    ),
                    token=token_for(t.ti),
                )
                for t in claim.triggers
            ],
            released=claim.released,
            lease_seconds=claim.lease_seconds,
        )


class TriggerEventPayload(RequestBody):
    """A trigger's event: its payload as the Task SDK's serde serialized it."""

    payload: Any = None


class TriggerFailurePayload(RequestBody):
    """A trigger that failed: the lines of its traceback (Airflow's `submit_failure`)."""

    traceback: Annotated[list[str], Field(max_length=10_000)] | None = None


class TriggerReportResponse(ResponseBody):
    resumed: bool


class TriggerEndPayload(RequestBody):
    """A trigger that ended its task (Airflow's `BaseTaskEndEvent`): the state and the XComs
    to push, their values serialized with the Task SDK's serde."""

    state: Literal["success", "failed", "skipped"]
    xcoms: JsonDict | None = None


class TriggerEndResponse(ResponseBody):
    """The state the TI ended in (`up_for_retry`: queued for its next try), null when no
    deferred TI waited for the trigger any more."""

    state: str | None


# --- Dag definitions from a worker (our own endpoint) ------------------------------------------


class DagFileDocument(RequestBody):
    file: Annotated[str, Field(min_length=1, max_length=2000)]
    definitions: list[JsonDict] | JsonDict
    # The file's text (issue 45, `definitions.sources`): stored for the Dag's code view and
    # `GET /api/v2/dagSources/{dag_id}`, cut at `DAG_SOURCE_MAX_BYTES` by the service too;
    # `source_size` is the whole file's size in bytes when the sender cut it. Omitted: the
    # stored source is left alone.
    source: str | None = None
    source_size: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None


class DagImportErrorDocument(RequestBody):
    """A file of the folder that did not import (or holds a Dag the service cannot run)."""

    file: Annotated[str, Field(min_length=1, max_length=2000)]
    error: Annotated[str, Field(min_length=1, max_length=1_000_000)]


class DagSyncRequest(RequestBody):
    files: list[DagFileDocument]
    apply_pause: bool = False
    # The folder's files that did not import: they replace the stored import errors (omitted:
    # the stored ones are left alone).
    import_errors: list[DagImportErrorDocument] | None = None
    # The Dag bundle the files are of (Airflow's default "dags-folder" when left out): its
    # Dags record it (workers serving it claim their TIs) and the import errors replaced are
    # that bundle's only.
    bundle_name: BundleName = DEFAULT_BUNDLE_NAME


class DagSyncResponse(ResponseBody):
    dag_ids: list[str]
    dags_created: int
    dags_updated: int
    dags_unchanged: int
    tasks_created: int
    tasks_deleted: int
    import_errors: list[str] | None
    summary: str


class TaskLogChunk(RequestBody):
    """`PUT /execution/task-instances/{id}/logs/{try_number}`: bytes [offset, ...) of the
    try's log file as text (our endpoint: Airflow's workers write logs to their own disk)."""

    offset: int = Field(ge=0, le=INT64_MAX)  # the chunk's BigIntegerField
    content: str


class TaskLogChunkResponse(ResponseBody):
    stored_bytes: int
    duplicate: bool
