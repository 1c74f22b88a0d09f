"""Request and response bodies of the public API (`/api/v2/`), with the shapes of Airflow 3.3.2's
public API (`v2-rest-api-generated.yaml`, compared by `tests/api/test_public_schema.py`): every
field Airflow requires is present, nullable exactly where Airflow's is, with Airflow's names. A
field this service has no concept of is answered as Airflow answers when it has none (null, an
empty list, Airflow's default value), never left out.

Request bodies forbid unknown fields (a typo is a 422, not a silently ignored value) but accept
every field of Airflow's body; one naming a feature the service lacks (`partition_key`) must be
null. Query parameters are the endpoint's own (`public.py`, `public_dags.py`).
"""

import inspect
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal
from uuid import UUID

from ninja import Schema
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from assets_app.catalog import dags as dag_reads
from assets_app.catalog import run_reads
from assets_app.definitions import params as dag_params
from assets_app.definitions import timetables
from assets_app.models import (
    Asset,
    AssetAlias,
    AssetEvent,
    Backfill,
    Dag,
    DagImportError,
    DagRun,
    DagRunType,
    DagVersion,
    Task,
    TaskInstance,
)
from assets_app.models.assets import ASSET_KEY_MAX_LENGTH
from assets_app.models.dags import DAG_ID_MAX_LENGTH

from .schemas import INT32_MAX, NaiveIsUtcDatetime, UtcDatetime, run_reference_fields

# Airflow's `[api] maximum_page_limit` default, as the batch bodies' page_limit default.
BATCH_PAGE_LIMIT = 100
NOTE_MAX_LENGTH = 1000
Offset = Annotated[int, Field(ge=0, le=INT32_MAX)]
Limit = Annotated[int, Field(ge=0, le=INT32_MAX)]


class StrictSchema(Schema):
    model_config = ConfigDict(extra="forbid")


def _no_partitions(value: str | None) -> str | None:
    if value is not None:
        raise ValueError("partition keys are not supported by this service; send null")
    return value


NoPartitionKey = Annotated[str | None, AfterValidator(_no_partitions)]


# --- errors (Airflow's HTTPExceptionResponse and HTTPValidationError) -------------------------


class HTTPExceptionResponse(Schema):
    """Every error but a 422: `detail` is `{"reason", "message", ...}`."""

    detail: dict[str, Any] | str


class ValidationError(Schema):
    loc: list[str | int]
    msg: str
    type: str
    input: Any = None
    ctx: dict[str, Any] = Field(default_factory=dict)


class HTTPValidationError(Schema):
    """A 422: one item per problem; `type` is pydantic's error type, or the domain reason."""

    detail: list[ValidationError]


# --- assets and aliases -------------------------------------------------------------------------


class DagScheduleAssetReference(Schema):
    dag_id: str
    created_at: datetime
    updated_at: datetime


class TaskOutletAssetReference(Schema):
    dag_id: str
    task_id: str
    created_at: datetime
    updated_at: datetime


class TaskInletAssetReference(Schema):
    dag_id: str
    task_id: str
    created_at: datetime
    updated_at: datetime


class AssetWatcherResponse(Schema):
    name: str
    trigger_id: int
    created_date: datetime


class AssetAliasResponse(Schema):
    id: int
    name: str
    group: str

    @staticmethod
    def from_alias(alias: AssetAlias) -> "AssetAliasResponse":
        return AssetAliasResponse(id=alias.id, name=alias.name, group=alias.group)


class AssetAliasCollectionResponse(Schema):
    asset_aliases: list[AssetAliasResponse]
    total_entries: int


class LastAssetEventResponse(Schema):
    id: int | None = None
    timestamp: datetime | None = None


class AssetResponse(Schema):
    """Airflow's AssetResponse. The references carry their Dag's creation and last change times
    (the service keeps none of its own for them); no inlets, no watchers."""

    id: int
    name: str
    uri: str
    group: str
    extra: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime
    scheduled_dags: list[DagScheduleAssetReference]
    producing_tasks: list[TaskOutletAssetReference]
    consuming_tasks: list[TaskInletAssetReference]
    aliases: list[AssetAliasResponse]
    watchers: list[AssetWatcherResponse]
    last_asset_event: LastAssetEventResponse | None

    @staticmethod
    def from_asset(asset: Asset) -> "AssetResponse":
        """From an asset loaded by `asset_events.list_assets` / `get_asset_by_id`."""
        return AssetResponse(
            id=asset.id,
            name=asset.name,
            uri=asset.uri,
            group=asset.group,
            extra=asset.extra,
            created_at=asset.created_at,
            updated_at=asset.updated_at,
            scheduled_dags=[
                DagScheduleAssetReference(
                    dag_id=ref.dag_id, created_at=ref.dag.created_at, updated_at=ref.dag.updated_at
                )
                for ref in asset.schedule_dag_refs.all()
            ],
            producing_tasks=[
                TaskOutletAssetReference(
                    dag_id=ref.task.dag_id,
                    task_id=ref.task.task_id,
                    created_at=ref.task.dag.created_at,
                    updated_at=ref.task.dag.updated_at,
                )
                for ref in asset.task_outlet_refs.all()
            ],
            consuming_tasks=[],
            aliases=[AssetAliasResponse.from_alias(alias) for alias in asset.aliases.all()],
            watchers=[],
            last_asset_event=LastAssetEventResponse(
                # annotated by asset_events._with_last_event
                id=asset.last_event_id,  # type: ignore[attr-defined]
                timestamp=asset.last_event_timestamp,  # type: ignore[attr-defined]
            ),
        )


class AssetCollectionResponse(Schema):
    assets: list[AssetResponse]
    total_entries: int


# --- asset events and queued events ---------------------------------------------------------


class CreateAssetEventBody(StrictSchema):
    """Airflow's `CreateAssetEventsBody` (`asset_id`, `extra`), also accepting the asset by
    `name` and/or `uri` instead of its id."""

    asset_id: int | None = None
    name: str | None = Field(default=None, min_length=1, max_length=ASSET_KEY_MAX_LENGTH)
    uri: str | None = Field(default=None, min_length=1, max_length=ASSET_KEY_MAX_LENGTH)
    extra: dict[str, Any] = Field(default_factory=dict)
    partition_key: NoPartitionKey = None
    # Airflow's consumer-team filter; this service has no teams.
    access_control: None = None

    @model_validator(mode="after")
    def _one_asset_reference(self) -> "CreateAssetEventBody":
        by_key = self.name is not None or self.uri is not None
        if (self.asset_id is None) == (not by_key):
            raise ValueError("give asset_id, or name and/or uri (not both kinds)")
        return self


class DagRunAssetReference(Schema):
    """A run that consumed an event (`run_reference_fields`, shared with the execution API)."""

    run_id: str
    dag_id: str
    logical_date: datetime | None
    start_date: datetime
    end_date: datetime | None
    state: str
    data_interval_start: datetime | None
    data_interval_end: datetime | None
    partition_key: str | None
    triggering: bool


class AssetEventResponse(Schema):
    id: int
    asset_id: int
    uri: str | None
    name: str | None
    group: str | None
    extra: dict[str, Any] | None
    source_task_id: str | None
    source_dag_id: str | None
    source_run_id: str | None
    source_map_index: int
    created_dagruns: list[DagRunAssetReference]
    timestamp: datetime
    partition_key: str | None

    @staticmethod
    def from_event(event: AssetEvent) -> "AssetEventResponse":
        """From an AssetEvent with `asset` loaded and `consuming_runs` prefetched as
        `asset_events` does (each run annotated with `triggering_event_id`), or none at all."""
        return AssetEventResponse(
            id=event.id,
            asset_id=event.asset_id,
            uri=event.asset.uri,
            name=event.asset.name,
            group=event.asset.group,
            extra=event.extra,
            source_task_id=event.source_task_id,
            source_dag_id=event.source_dag_id,
            source_run_id=event.source_run_id,
            source_map_index=event.source_map_index,
            created_dagruns=[
                DagRunAssetReference(
                    **run_reference_fields(run),
                    triggering=getattr(run, "triggering_event_id", None) == event.id,
                )
                for run in event.consuming_runs.all()
            ],
            timestamp=event.timestamp,
            partition_key=None,
        )


class AssetEventCollectionResponse(Schema):
    asset_events: list[AssetEventResponse]
    total_entries: int


class QueuedEventResponse(Schema):
    dag_id: str
    asset_id: int
    created_at: datetime
    dag_display_name: str


class QueuedEventCollectionResponse(Schema):
    queued_events: list[QueuedEventResponse]
    total_entries: int


# --- Dags -----------------------------------------------------------------------------------


class DagTagResponse(Schema):
    name: str
    dag_id: str
    dag_display_name: str


class DagVersionResponse(Schema):
    id: UUID
    version_number: int
    dag_id: str
    bundle_name: str | None
    bundle_version: str | None
    created_at: datetime
    dag_display_name: str
    bundle_url: str | None

    @staticmethod
    def from_version(version: DagVersion) -> "DagVersionResponse":
        """No bundles here: Dag files are synced by the worker, not read from a bundle."""
        return DagVersionResponse(
            id=version.id,
            version_number=version.version_number,
            dag_id=version.dag_id,
            bundle_name=None,
            bundle_version=None,
            created_at=version.created_at,
            dag_display_name=version.dag_id,
            bundle_url=None,
        )


def _time_fields(dag: Dag) -> dict[str, Any]:
    """The schedule fields of a Dag with a timetable (issue 24), as Airflow's DAG answers: its
    timetable's `summary`, `description` and `periodic`; with an asset schedule too, Airflow's
    AssetOrTimeSchedule's ("Asset or ...", "Triggered by assets or ..."), or the service's
    asset-and-time ("Asset and ...")."""
    assert dag.timetable is not None  # callers pass Dags with a timetable
    timetable = timetables.Timetable.from_spec(dag.timetable, timezone=dag.timezone)
    summary, description = timetable.summary, timetable.description
    if dag.schedule is not None:
        summary, description = timetables.with_assets(dag.schedule_mode, summary, description)
    return {
        "timetable_summary": summary,
        "timetable_description": description,
        "timetable_periodic": timetable.periodic,
        "next_dagrun_logical_date": dag.next_dagrun,
        "next_dagrun_data_interval_start": dag.next_dagrun_data_interval_start,
        "next_dagrun_data_interval_end": dag.next_dagrun_data_interval_end,
        "next_dagrun_run_after": dag.next_dagrun_create_after,
    }


def _dag_fields(dag: Dag) -> dict[str, Any]:
    scheduled = dag.schedule is not None
    fields: dict[str, Any] = {
        "dag_id": dag.dag_id,
        "dag_display_name": dag.dag_id,
        "is_paused": dag.is_paused,
        "is_stale": False,
        "last_parsed_time": dag.updated_at,
        "last_parse_duration": None,
        "last_expired": None,
        "bundle_name": dag.bundle_name,
        "bundle_version": None,
        "relative_fileloc": None,
        "fileloc": dag.fileloc,
        "description": dag.description or None,
        # Airflow's DAGResponse turns a NullTimetable's summary "None" into null.
        "timetable_summary": "Asset" if scheduled else None,
        "timetable_description": (
            "Triggered by assets" if scheduled else "Never, external triggers only"
        ),
        "timetable_partitioned": False,
        "timetable_periodic": False,
        "tags": [
            {"name": tag, "dag_id": dag.dag_id, "dag_display_name": dag.dag_id}
            for tag in sorted(dag.tags)
        ],
        "max_active_tasks": AIRFLOW_MAX_ACTIVE_TASKS,
        "max_active_runs": dag.max_active_runs,
        "max_consecutive_failed_dag_runs": 0,
        "has_task_concurrency_limits": False,
        "has_import_errors": bool(getattr(dag, "has_import_errors", False)),
        "next_dagrun_logical_date": None,
        "next_dagrun_data_interval_start": None,
        "next_dagrun_data_interval_end": None,
        "next_dagrun_run_after": None,
        "allowed_run_types": dag.allowed_run_types,
        # Airflow's DAGResponse.get_owners: `DagModel.owners` split at commas.
        "owners": [owner.strip() for owner in dag.owners.split(",")],
        "file_token": "",
    }
    if dag.timetable is not None:
        fields.update(_time_fields(dag))
    # Airflow's DAGResponse.is_backfillable: a periodic timetable, and backfill runs allowed.
    fields["is_backfillable"] = fields["timetable_periodic"] and (
        dag.allowed_run_types is None or DagRunType.BACKFILL in dag.allowed_run_types
    )
    return fields


# Airflow's `[core] max_active_tasks_per_dag` default; the service does not limit running TIs.
AIRFLOW_MAX_ACTIVE_TASKS = 16


class DAGResponse(Schema):
    """Airflow's DAGResponse: tags sorted by name, owners from the tasks' (`DagModel.owners`
    split at commas). No bundles here: nulls and Airflow's defaults; the `timetable_*` fields
    are Airflow's ("Asset" for an asset schedule, null for manual runs only, a timetable's
    own summary and description, AssetOrTimeSchedule's for assets or time: `_time_fields`),
    the `next_dagrun_*` fields the stored next run;
    `last_parsed_time` is the last time `sync_dags` changed the Dag."""

    dag_id: str
    dag_display_name: str
    is_paused: bool
    is_stale: bool
    last_parsed_time: datetime | None
    last_parse_duration: float | None
    last_expired: datetime | None
    bundle_name: str | None
    bundle_version: str | None
    relative_fileloc: str | None
    fileloc: str
    description: str | None
    timetable_summary: str | None
    timetable_description: str | None
    timetable_partitioned: bool
    timetable_periodic: bool
    tags: list[DagTagResponse]
    max_active_tasks: int
    max_active_runs: int | None
    max_consecutive_failed_dag_runs: int
    has_task_concurrency_limits: bool
    has_import_errors: bool
    next_dagrun_logical_date: datetime | None
    next_dagrun_data_interval_start: datetime | None
    next_dagrun_data_interval_end: datetime | None
    next_dagrun_run_after: datetime | None
    allowed_run_types: list[str] | None
    owners: list[str]
    is_backfillable: bool
    file_token: str

    @staticmethod
    def from_dag(dag: Dag) -> "DAGResponse":
        return DAGResponse(**_dag_fields(dag))


class DAGDetailsResponse(DAGResponse):
    catchup: bool
    dag_run_timeout: str | None
    asset_expression: dict[str, Any] | None
    doc_md: str | None
    start_date: datetime | None
    end_date: datetime | None
    is_paused_upon_creation: bool | None
    params: dict[str, Any] | None
    render_template_as_native_obj: bool
    template_search_path: list[str] | None
    timezone: str | None
    last_parsed: datetime | None
    default_args: dict[str, Any] | None
    rerun_with_latest_version: bool | None
    owner_links: dict[str, str] | None
    is_favorite: bool
    active_runs_count: int
    concurrency: int
    latest_dag_version: DagVersionResponse | None

    @staticmethod
    def from_dag(
        dag: Dag, *, is_favorite: bool = False, latest_version: DagVersion | None = None
    ) -> "DAGDetailsResponse":
        """From a Dag loaded by `dags.get_dag(details=True)`; `is_favorite` for the caller."""
        return DAGDetailsResponse(
            **_dag_fields(dag),
            catchup=dag.catchup,
            dag_run_timeout=None,
            asset_expression=dag_reads.asset_expression(dag),
            # Airflow's DAGDetailsResponse.get_doc_md: the text de-indented.
            doc_md=inspect.cleandoc(dag.doc_md) if dag.doc_md else None,
            start_date=dag.start_date,
            end_date=dag.end_date,
            is_paused_upon_creation=None,
            params=dag_params.api_view(dag_params.load(dag.params)),
            render_template_as_native_obj=False,
            template_search_path=None,
            timezone=dag.timezone,
            last_parsed=dag.updated_at,
            default_args={},
            rerun_with_latest_version=None,
            owner_links={},
            is_favorite=is_favorite,
            active_runs_count=dag.active_runs_count or 0,  # type: ignore[attr-defined]  # (annotated)
            concurrency=AIRFLOW_MAX_ACTIVE_TASKS,
            latest_dag_version=(
                DagVersionResponse.from_version(latest_version) if latest_version else None
            ),
        )


class DAGCollectionResponse(Schema):
    dags: list[DAGResponse]
    total_entries: int


class DAGPatchBody(StrictSchema):
    is_paused: bool


# --- Dag runs -------------------------------------------------------------------------------


class TriggerDagRunBody(StrictSchema):
    """Airflow 3's `TriggerDAGRunPostBody`, with `logical_date` optional (null by default)."""

    dag_run_id: str | None = Field(default=None, min_length=1, max_length=DAG_ID_MAX_LENGTH)
    logical_date: UtcDatetime | None = None
    data_interval_start: UtcDatetime | None = None
    data_interval_end: UtcDatetime | None = None
    run_after: UtcDatetime | None = None
    conf: dict[str, Any] | None = None
    note: str | None = Field(default=None, max_length=NOTE_MAX_LENGTH)
    partition_key: NoPartitionKey = None

    @model_validator(mode="after")
    def _intervals_together(self) -> "TriggerDagRunBody":
        if (self.data_interval_start is None) != (self.data_interval_end is None):
            raise ValueError("give both data_interval_start and data_interval_end, or neither")
        return self


class MaterializeAssetBody(TriggerDagRunBody):
    """Airflow's `MaterializeAssetBody`: the trigger body for the asset's producing Dag."""


class DAGRunResponse(Schema):
    """Airflow's DAGRunResponse. No Dag versions, bundles or partitions: empty / null."""

    dag_run_id: str
    dag_id: str
    logical_date: datetime | None
    queued_at: datetime | None
    start_date: datetime | None
    end_date: datetime | None
    duration: float | None
    data_interval_start: datetime | None
    data_interval_end: datetime | None
    run_after: datetime
    last_scheduling_decision: datetime | None
    run_type: str
    state: str
    triggered_by: str | None
    triggering_user_name: str | None
    conf: dict[str, Any] | None
    note: str | None
    dag_versions: list[DagVersionResponse]
    bundle_version: str | None
    dag_display_name: str
    partition_key: str | None
    partition_date: datetime | None

    @staticmethod
    def from_run(run: DagRun, *, versions: dict[int, DagVersion] | None = None) -> "DAGRunResponse":
        """`versions`: `dag_reads.versions_of_runs` of a page of runs (one query for them all);
        None reads this run's."""
        if versions is None:
            versions = dag_reads.versions_of_runs([run])
        version = versions.get(run.pk)
        duration = None
        if run.start_date is not None and run.end_date is not None:
            duration = (run.end_date - run.start_date).total_seconds()
        return DAGRunResponse(
            dag_run_id=run.run_id,
            dag_id=run.dag_id,
            logical_date=run.logical_date,
            queued_at=run.queued_at,
            start_date=run.start_date,
            end_date=run.end_date,
            duration=duration,
            data_interval_start=run.data_interval_start,
            data_interval_end=run.data_interval_end,
            run_after=run.run_after,
            last_scheduling_decision=None,
            run_type=run.run_type,
            state=run.state,
            triggered_by=run.triggered_by,
            triggering_user_name=run.triggering_user_name,
            conf=run.conf,
            note=run.note,
            dag_versions=[DagVersionResponse.from_version(version)] if version else [],
            bundle_version=None,
            dag_display_name=run.dag_id,
            partition_key=None,
            partition_date=None,
        )


class RunRanges(Schema):
    """Airflow's range filters of runs and task instances, `<field>_gte/_gt/_lte/_lt` (a
    duration in seconds), declared once: the batch bodies' fields here and the list query
    parameters (`public_dags`). A body names it before `StrictSchema`, whose `extra="forbid"`
    then wins."""

    run_after_gte: UtcDatetime | None = None
    run_after_gt: UtcDatetime | None = None
    run_after_lte: UtcDatetime | None = None
    run_after_lt: UtcDatetime | None = None
    logical_date_gte: UtcDatetime | None = None
    logical_date_gt: UtcDatetime | None = None
    logical_date_lte: UtcDatetime | None = None
    logical_date_lt: UtcDatetime | None = None
    start_date_gte: UtcDatetime | None = None
    start_date_gt: UtcDatetime | None = None
    start_date_lte: UtcDatetime | None = None
    start_date_lt: UtcDatetime | None = None
    end_date_gte: UtcDatetime | None = None
    end_date_gt: UtcDatetime | None = None
    end_date_lte: UtcDatetime | None = None
    end_date_lt: UtcDatetime | None = None
    duration_gte: float | None = None
    duration_gt: float | None = None
    duration_lte: float | None = None
    duration_lt: float | None = None


class DAGRunCollectionResponse(Schema):
    dag_runs: list[DAGRunResponse]
    total_entries: int | None
    total_entries_limit: int | None = None
    next_cursor: str | None = None
    previous_cursor: str | None = None


class DAGRunClearBody(StrictSchema):
    dry_run: bool = True
    only_failed: bool = False
    only_new: bool = False
    # Every Dag here has one version, its latest.
    run_on_latest_version: bool | None = None
    note: str | None = Field(default=None, max_length=NOTE_MAX_LENGTH)


class DAGRunPatchBody(StrictSchema):
    """Airflow 3.3.2's `DAGRunPatchBody` (`DagRunMutableStates`: queued, success, failed)."""

    state: Literal["queued", "success", "failed"] | None = None
    note: str | None = Field(default=None, max_length=NOTE_MAX_LENGTH)


class PatchTaskInstanceBody(StrictSchema):
    """Airflow 3.3.2's `PatchTaskInstanceBody`: `new_state` success, failed or skipped (any
    case; null refused, as its validator), a note, and the include flags."""

    new_state: str | None = None
    note: str | None = Field(default=None, max_length=NOTE_MAX_LENGTH)
    include_upstream: bool = False
    include_downstream: bool = False
    include_future: bool = False
    include_past: bool = False

    @field_validator("new_state", mode="before")
    @classmethod
    def _valid_new_state(cls, value: Any) -> str:
        valid = ["success", "failed", "skipped"]
        if value is None:
            raise ValueError("'new_state' should not be empty")
        if not isinstance(value, str) or value.lower() not in valid:
            raise ValueError(f"'{value}' is not one of {valid}")
        return value.lower()


class DAGRunsBatchBody(RunRanges, StrictSchema):
    """Airflow's body of `POST /dags/{dag_id}/dagRuns/list`."""

    order_by: str | None = None
    page_offset: Offset = 0
    page_limit: Limit = BATCH_PAGE_LIMIT
    dag_ids: list[str] | None = None
    states: list[str | None] | None = None
    conf_contains: str | None = None


# --- backfills (issue 24) ----------------------------------------------------------------------


class BackfillPostBody(StrictSchema):
    """Airflow's `BackfillPostBody`. Every Dag here has one version, its latest, so
    `run_on_latest_version` changes nothing."""

    dag_id: str = Field(max_length=DAG_ID_MAX_LENGTH)
    from_date: NaiveIsUtcDatetime
    to_date: NaiveIsUtcDatetime
    run_backwards: bool = False
    dag_run_conf: dict[str, Any] | None = None
    reprocess_behavior: Literal["failed", "completed", "none"] = "none"
    max_active_runs: int = Field(default=10, ge=1, le=INT32_MAX)
    run_on_latest_version: bool | None = None


class ImportErrorResponse(Schema):
    import_error_id: int
    timestamp: datetime
    filename: str
    bundle_name: str | None
    stack_trace: str

    @classmethod
    def from_error(cls, error: DagImportError) -> "ImportErrorResponse":
        return cls(
            import_error_id=error.pk,
            timestamp=error.timestamp,
            filename=error.filename,
            bundle_name=error.bundle_name,
            stack_trace=error.stack_trace,
        )


class ImportErrorCollectionResponse(Schema):
    import_errors: list[ImportErrorResponse]
    total_entries: int


class BackfillResponse(Schema):
    id: int = Field(ge=0)
    dag_id: str
    from_date: datetime
    to_date: datetime
    dag_run_conf: dict[str, Any] | None
    is_paused: bool
    reprocess_behavior: Literal["failed", "completed", "none"]
    max_active_runs: int
    created_at: datetime
    completed_at: datetime | None
    updated_at: datetime
    dag_display_name: str

    @classmethod
    def from_backfill(cls, backfill: Backfill) -> "BackfillResponse":
        return cls(
            id=backfill.pk,
            dag_id=backfill.dag_id,
            from_date=backfill.from_date,
            to_date=backfill.to_date,
            dag_run_conf=backfill.dag_run_conf,
            is_paused=bool(backfill.is_paused),
            reprocess_behavior=backfill.reprocess_behavior,  # type: ignore[arg-type]
            max_active_runs=backfill.max_active_runs,
            created_at=backfill.created_at,
            completed_at=backfill.completed_at,
            updated_at=backfill.updated_at,
            # No display names here: Airflow's default is the dag_id.
            dag_display_name=backfill.dag_id,
        )


class BackfillCollectionResponse(Schema):
    backfills: list[BackfillResponse]
    total_entries: int


class DryRunBackfillResponse(Schema):
    logical_date: datetime | None
    # No partitions here: always null, but present (Airflow requires both).
    partition_key: str | None
    partition_date: datetime | None


class DryRunBackfillCollectionResponse(Schema):
    backfills: list[DryRunBackfillResponse]
    total_entries: int


# --- task instances -------------------------------------------------------------------------


class TriggerResponse(Schema):
    id: int
    classpath: str
    kwargs: str
    created_date: datetime
    queue: str | None
    triggerer_id: int | None

    @staticmethod
    def of(ti: TaskInstance) -> "TriggerResponse | None":
        """The trigger a deferred TI waits for (issue 42), as Airflow's `TriggerResponse`:
        `kwargs` is the stored text (Airflow shows the decrypted kwargs' `str`); the service's
        triggerers have no job ids (`triggerer_id` null). No query for a TI not deferred."""
        if ti.trigger_id is None:
            return None
        trigger = ti.trigger
        if trigger is None:
            return None
        return TriggerResponse(
            id=trigger.id,
            classpath=trigger.classpath,
            kwargs=trigger.kwargs,
            created_date=trigger.created_at,
            queue=trigger.queue,
            triggerer_id=None,
        )


class JobResponse(Schema):
    id: int
    dag_id: str | None
    state: str | None
    job_type: str | None
    start_date: datetime | None
    end_date: datetime | None
    latest_heartbeat: datetime | None
    executor_class: str | None
    hostname: str | None
    unixname: str | None
    dag_display_name: str | None = None


class TimeDelta(BaseModel):
    """Airflow's TimeDelta (`{"__type": "TimeDelta", days, seconds, microseconds}`); routes
    answering it serialize by alias. A plain pydantic model: ninja's Schema reads attributes
    through Django's template lookup, which refuses a name starting with an underscore."""

    object_type: str = Field("TimeDelta", alias="__type")
    days: int
    seconds: int
    microseconds: int

    @staticmethod
    def of(seconds: float) -> dict[str, Any]:
        """The input of one (by its alias), as `timedelta` splits `seconds`."""
        value = timedelta(seconds=seconds)
        return {
            "__type": "TimeDelta",
            "days": value.days,
            "seconds": value.seconds,
            "microseconds": value.microseconds,
        }


# What Airflow's TaskResponse answers for a BaseOperator left at its defaults, for what the
# service does not store: no pools, queues, priorities or executors run here (the ledger refuses
# other values), and the operator's class and template fields are the worker's, from the file.
AIRFLOW_TASK_DEFAULTS: dict[str, Any] = {
    "depends_on_past": False,
    "wait_for_downstream": False,
    "queue": run_reads.DEFAULT_QUEUE,
    "pool": run_reads.DEFAULT_POOL,
    "pool_slots": 1.0,
    "execution_timeout": None,
    "priority_weight": 1.0,
    "weight_rule": "downstream",
    "ui_color": "#fff",
    "ui_fgcolor": "#000",
    "template_fields": [],
    "operator_name": None,
    "params": {},
    "class_ref": None,
    "extra_links": [],
}


class TaskResponse(Schema):
    """Airflow's TaskResponse (`GET /dags/{dag_id}/tasks`): what the service stores of a task
    (owner, trigger rule, retries and their delay, doc_md, mapping, its downstream tasks), the
    Dag's start and end dates (Airflow gives a task without its own the Dag's, and the ledger
    refuses a task's own), and `AIRFLOW_TASK_DEFAULTS` for the rest."""

    task_id: str | None
    task_display_name: str | None
    owner: str | None
    start_date: datetime | None
    end_date: datetime | None
    trigger_rule: str | None
    depends_on_past: bool
    wait_for_downstream: bool
    retries: float | None
    queue: str | None
    pool: str | None
    pool_slots: float | None
    execution_timeout: TimeDelta | None
    retry_delay: TimeDelta | None
    retry_exponential_backoff: float
    priority_weight: float | None
    weight_rule: str | None
    ui_color: str | None
    ui_fgcolor: str | None
    template_fields: list[str] | None
    downstream_task_ids: list[str] | None
    doc_md: str | None
    operator_name: str | None
    params: dict[str, Any] | None
    class_ref: dict[str, Any] | None
    is_mapped: bool | None
    extra_links: list[str]

    @staticmethod
    def from_task(task: Task, *, dag: Dag) -> "TaskResponse":
        """From a task of `dag_reads.get_tasks` (its `downstream_ids` set)."""
        return TaskResponse(
            **AIRFLOW_TASK_DEFAULTS,
            task_id=task.task_id,
            task_display_name=task.task_id,
            owner=task.owner,
            start_date=dag.start_date,
            end_date=dag.end_date,
            trigger_rule=task.trigger_rule,
            retries=float(task.retries),
            retry_delay=TimeDelta.of(task.retry_delay_seconds),  # type: ignore[arg-type]
            retry_exponential_backoff=task.retry_exponential_backoff,
            downstream_task_ids=task.downstream_ids,  # type: ignore[attr-defined]  # (get_tasks)
            doc_md=task.doc_md or None,
            is_mapped=task.is_mapped,
        )


class TaskCollectionResponse(Schema):
    tasks: list[TaskResponse]
    total_entries: int


class TaskInstanceResponse(Schema):
    """Airflow's TaskInstanceResponse. The service runs no operators, pools, queues or
    executors: Airflow's defaults (`default_pool`, one slot, queue `default`, priority 1) and
    nulls. `state` is Airflow's name for the TI's state (null: no status yet); `trigger` is a
    deferred TI's trigger (`TriggerResponse.of`), `triggerer_job` null (no triggerer jobs)."""

    id: UUID
    task_id: str
    dag_id: str
    dag_run_id: str
    map_index: int
    logical_date: datetime | None
    run_after: datetime
    start_date: datetime | None
    end_date: datetime | None
    duration: float | None
    state: str | None
    try_number: int
    max_tries: int
    task_display_name: str
    dag_display_name: str
    hostname: str | None
    unixname: str | None
    pool: str
    pool_slots: int
    queue: str | None
    priority_weight: int | None
    operator: str | None
    operator_name: str | None
    queued_when: datetime | None
    scheduled_when: datetime | None
    pid: int | None
    executor: str | None
    executor_config: str
    note: str | None
    rendered_map_index: str | None
    rendered_fields: dict[str, Any]
    trigger: TriggerResponse | None
    triggerer_job: JobResponse | None
    dag_version: DagVersionResponse | None

    @staticmethod
    def from_ti(ti: TaskInstance) -> "TaskInstanceResponse":
        """From a TI with `dag_run` loaded."""
        duration = None
        if ti.start_date is not None and ti.end_date is not None:
            duration = (ti.end_date - ti.start_date).total_seconds()
        return TaskInstanceResponse(
            id=ti.id,
            task_id=ti.task_id,
            dag_id=ti.dag_id,
            dag_run_id=ti.run_id,
            map_index=ti.map_index,
            logical_date=ti.dag_run.logical_date,
            run_after=ti.dag_run.run_after,
            start_date=ti.start_date,
            end_date=ti.end_date,
            duration=duration,
            state=run_reads.airflow_ti_state(ti.state),
            try_number=ti.try_number,
            max_tries=ti.max_tries,
            task_display_name=ti.task_id,
            dag_display_name=ti.dag_id,
            hostname=ti.hostname or None,
            unixname=ti.unixname or None,
            pool=run_reads.DEFAULT_POOL,
            pool_slots=1,
            queue=run_reads.DEFAULT_QUEUE,
            priority_weight=1,
            operator=None,
            operator_name=None,
            queued_when=ti.queued_at,
            scheduled_when=None,
            pid=ti.pid,
            executor=None,
            executor_config="{}",
            note=ti.note,
            rendered_map_index=None,
            rendered_fields={},
            trigger=TriggerResponse.of(ti),
            triggerer_job=None,
            dag_version=None,
        )


class TaskInstanceHistoryResponse(Schema):
    """Airflow 3.3.2's `TaskInstanceHistoryResponse`: one try of a TI (here only the current
    one: earlier tries are not kept), the fields of `TaskInstanceResponse` it shares."""

    task_id: str
    dag_id: str
    dag_run_id: str
    map_index: int
    start_date: datetime | None
    end_date: datetime | None
    duration: float | None
    state: str | None
    try_number: int
    max_tries: int
    task_display_name: str
    dag_display_name: str
    hostname: str | None
    unixname: str | None
    pool: str
    pool_slots: int
    queue: str | None
    priority_weight: int | None
    operator: str | None
    operator_name: str | None
    queued_when: datetime | None
    scheduled_when: datetime | None
    pid: int | None
    executor: str | None
    executor_config: str
    dag_version: DagVersionResponse | None

    @staticmethod
    def from_ti(ti: TaskInstance) -> "TaskInstanceHistoryResponse":
        full = TaskInstanceResponse.from_ti(ti)
        return TaskInstanceHistoryResponse(
            **{name: getattr(full, name) for name in TaskInstanceHistoryResponse.model_fields}
        )


class TaskInstanceHistoryCollectionResponse(Schema):
    task_instances: list[TaskInstanceHistoryResponse]
    total_entries: int


class ExtraLinkCollectionResponse(Schema):
    """Airflow 3.3.2's `ExtraLinkCollectionResponse` (link name -> URL)."""

    extra_links: dict[str, str | None]
    total_entries: int


class TaskInstanceCollectionResponse(Schema):
    task_instances: list[TaskInstanceResponse]
    total_entries: int | None
    total_entries_limit: int | None = None
    next_cursor: str | None = None
    previous_cursor: str | None = None


class NewTaskResponse(Schema):
    task_id: str
    task_display_name: str


class ClearTaskInstanceCollectionResponse(Schema):
    task_instances: list[TaskInstanceResponse | NewTaskResponse]
    total_entries: int


class TaskInstancesBatchBody(RunRanges, StrictSchema):
    """Airflow's body of `POST .../taskInstances/list`."""

    dag_ids: list[str] | None = None
    dag_run_ids: list[str] | None = None
    task_ids: list[str] | None = None
    state: list[str | None] | None = None
    pool: list[str] | None = None
    queue: list[str] | None = None
    executor: list[str] | None = None
    page_offset: Offset = 0
    page_limit: Limit = BATCH_PAGE_LIMIT
    order_by: str | None = None


# --- monitor and version --------------------------------------------------------------------


class BaseInfoResponse(Schema):
    status: str | None


class SchedulerInfoResponse(Schema):
    status: str | None
    latest_scheduler_heartbeat: str | None


class TriggererInfoResponse(Schema):
    status: str | None
    latest_triggerer_heartbeat: str | None


class DagProcessorInfoResponse(Schema):
    status: str | None
    latest_dag_processor_heartbeat: str | None


class HealthInfoResponse(Schema):
    metadatabase: BaseInfoResponse
    scheduler: SchedulerInfoResponse
    triggerer: TriggererInfoResponse
    dag_processor: DagProcessorInfoResponse | None


class VersionInfo(Schema):
    version: str
    git_version: str | None


def responses(ok: Any, *errors: int, status: int = 200) -> dict[int, Any]:
    """A route's `response=`: its success body and every error it can answer (401, 403 and 422
    always), each in Airflow's error shape."""
    codes: dict[int, Any] = {status: ok}
    for code in (400, 401, 403, 404, 409, *errors):
        if code in (401, 403) or code in errors:
            codes[code] = HTTPExceptionResponse
    codes[422] = HTTPValidationError
    return codes


class StructuredLogMessage(BaseModel):
    """Airflow 3.3.2's `StructuredLogMessage`: `event`, an optional `timestamp` (absent, never
    null), and whatever else the line carries (`level`, `logger`, ...). A plain pydantic model:
    ninja's Schema would read the line through its getter and drop the extra fields."""

    model_config = ConfigDict(extra="allow")

    timestamp: datetime = None  # type: ignore[assignment]
    event: str


class TaskInstancesLogResponse(Schema):
    """Airflow 3.3.2's `TaskInstancesLogResponse` (`GET .../logs/{try_number}`)."""

    # StructuredLogMessage keeps a line's extra fields (extra="allow"); a plain string as
    # Airflow allows is never sent (task_logs.structured always gives an `event`).
    content: list[StructuredLogMessage | str]
    continuation_token: str | None
