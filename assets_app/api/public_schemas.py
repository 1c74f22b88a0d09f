"""Request and response bodies of the public API (`/api/v2/`), shaped like Airflow 3's public API.

Request bodies forbid unknown fields (a typo is a 422, not a silently ignored value).
"""

from datetime import datetime
from typing import Any

from ninja import Schema
from pydantic import ConfigDict, Field, model_validator

from assets_app.models import DagRun
from assets_app.models.assets import ASSET_KEY_MAX_LENGTH
from assets_app.models.dags import DAG_ID_MAX_LENGTH

from .schemas import INT32_MAX, UtcDatetime


class StrictSchema(Schema):
    model_config = ConfigDict(extra="forbid")


class TriggerDagRunBody(StrictSchema):
    """Airflow 3's `TriggerDAGRunPostBody`, with `logical_date` optional (null by default)."""

    dag_run_id: str | None = Field(default=None, min_length=1, max_length=DAG_ID_MAX_LENGTH)
    logical_date: UtcDatetime | None = None
    data_interval_start: UtcDatetime | None = None
    data_interval_end: UtcDatetime | None = None
    run_after: UtcDatetime | None = None
    conf: dict[str, Any] | None = None
    note: str | None = Field(default=None, max_length=1000)

    @model_validator(mode="after")
    def _intervals_together(self) -> "TriggerDagRunBody":
        if (self.data_interval_start is None) != (self.data_interval_end is None):
            raise ValueError("give both data_interval_start and data_interval_end, or neither")
        return self


class DagRunResponse(Schema):
    """A subset of Airflow's `DAGRunResponse`."""

    dag_run_id: str
    dag_id: str
    logical_date: datetime | None
    queued_at: datetime | None
    start_date: datetime | None
    end_date: datetime | None
    data_interval_start: datetime | None
    data_interval_end: datetime | None
    run_after: datetime
    run_type: str
    state: str
    triggering_user_name: str | None
    conf: dict[str, Any] | None
    note: str | None

    @staticmethod
    def from_run(run: DagRun) -> "DagRunResponse":
        return DagRunResponse(
            dag_run_id=run.run_id,
            dag_id=run.dag_id,
            logical_date=run.logical_date,
            queued_at=run.created_at,
            start_date=run.start_date,
            end_date=run.end_date,
            data_interval_start=run.data_interval_start,
            data_interval_end=run.data_interval_end,
            run_after=run.run_after,
            run_type=run.run_type,
            state=run.state,
            triggering_user_name=run.triggering_user_name,
            conf=run.conf,
            note=run.note,
        )


# --- Asset events and queued events (Airflow 3's datamodels/assets.py shapes) -----------------


class CreateAssetEventBody(StrictSchema):
    """Airflow's `CreateAssetEventsBody` (`asset_id`, `extra`), also accepting the asset by
    `name` and/or `uri` instead of its id."""

    asset_id: int | None = None
    name: str | None = Field(default=None, min_length=1, max_length=ASSET_KEY_MAX_LENGTH)
    uri: str | None = Field(default=None, min_length=1, max_length=ASSET_KEY_MAX_LENGTH)
    extra: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_asset_reference(self) -> "CreateAssetEventBody":
        by_key = self.name is not None or self.uri is not None
        if (self.asset_id is None) == (not by_key):
            raise ValueError("give asset_id, or name and/or uri (not both kinds)")
        return self


class DagRunAssetReference(Schema):
    run_id: str
    dag_id: str
    logical_date: datetime | None
    start_date: datetime | None
    end_date: datetime | None
    state: str
    data_interval_start: datetime | None
    data_interval_end: datetime | None


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

    @staticmethod
    def from_event(event: Any) -> "AssetEventResponse":
        """From an AssetEvent with `asset` loaded (and `consuming_runs` prefetched if any)."""
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
                    run_id=run.run_id,
                    dag_id=run.dag_id,
                    logical_date=run.logical_date,
                    start_date=run.start_date,
                    end_date=run.end_date,
                    state=run.state,
                    data_interval_start=run.data_interval_start,
                    data_interval_end=run.data_interval_end,
                )
                for run in event.consuming_runs.all()
            ],
            timestamp=event.timestamp,
        )


class AssetEventCollectionResponse(Schema):
    asset_events: list[AssetEventResponse]
    total_entries: int


class AssetEventFilters(Schema):
    """Query parameters of `GET /api/v2/assets/events`."""

    asset_id: int | None = None
    source_dag_id: str | None = None
    source_task_id: str | None = None
    source_run_id: str | None = None
    source_map_index: int | None = None
    timestamp_gte: UtcDatetime | None = None
    timestamp_lte: UtcDatetime | None = None
    order_by: str = "timestamp"
    limit: int = Field(default=50, ge=1, le=100)
    offset: int = Field(default=0, ge=0, le=INT32_MAX)


class QueuedEventResponse(Schema):
    dag_id: str
    asset_id: int
    created_at: datetime
    dag_display_name: str


class QueuedEventCollectionResponse(Schema):
    queued_events: list[QueuedEventResponse]
    total_entries: int
