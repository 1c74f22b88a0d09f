"""Schemas of the worker API's run-time endpoints (XComs, Variables, Connections, rendered
fields, reschedules, dag-run and TI reads), field for field task-sdk 1.3.2's models in
`airflow/sdk/api/datamodels/_generated.py` (tests validate our answers with those models)."""

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from assets_app.models import DagRun
from assets_app.runtime.variables import ConnectionSecrets

from .schemas import DagRunOut, NaiveIsUtcDatetime, RequestBody, ResponseBody, UtcDatetime


class OKMessage(ResponseBody):
    message: str


class XComResponse(ResponseBody):
    key: str
    value: Any


class VariableResponse(ResponseBody):
    key: str
    value: str | None


class VariableKeysResponse(ResponseBody):
    keys: list[str]
    total_entries: int


class DagResponse(ResponseBody):
    dag_id: str
    is_paused: bool
    bundle_name: str | None
    bundle_version: str | None
    relative_fileloc: str | None
    owners: str | None
    tags: list[str]
    next_dagrun: datetime | None


class VariablePostBody(RequestBody):
    # The SDK sends the value as `val` (Airflow's alias of `value`).
    val: str | None
    description: str | None = None


class ConnectionResponse(ResponseBody):
    conn_id: str
    conn_type: str
    host: str | None
    schema_: Annotated[str | None, Field(alias="schema")]
    login: str | None
    password: str | None
    port: int | None
    extra: str | None

    @classmethod
    def from_domain(cls, found: ConnectionSecrets) -> "ConnectionResponse":
        c = found.connection
        return cls(
            conn_id=c.conn_id,
            conn_type=c.conn_type,
            host=c.host,
            schema=c.schema,  # type: ignore[call-arg]  # (the alias: `schema` is BaseModel's)
            login=c.login,
            password=found.password,
            port=c.port,
            extra=found.extra,
        )


class AssetProfileOut(ResponseBody):
    name: str | None = None
    uri: str | None = None
    type: str


class InactiveAssetsResponse(ResponseBody):
    inactive_assets: list[AssetProfileOut] | None = None


class PrevSuccessfulDagRunResponse(ResponseBody):
    data_interval_start: datetime | None = None
    data_interval_end: datetime | None = None
    start_date: datetime | None = None
    end_date: datetime | None = None

    @classmethod
    def from_run(cls, run: DagRun | None) -> "PrevSuccessfulDagRunResponse":
        if run is None:
            return cls()
        return cls(
            data_interval_start=run.data_interval_start,
            data_interval_end=run.data_interval_end,
            start_date=run.start_date,
            end_date=run.end_date,
        )


class DagRunStateResponse(ResponseBody):
    state: Literal["queued", "running", "success", "failed"]


class TaskStatesResponse(ResponseBody):
    task_states: dict[str, Any]


class TriggerDAGRunPayload(RequestBody):
    logical_date: UtcDatetime | None = None
    run_after: UtcDatetime | None = None
    conf: dict[str, Any] | None = None
    reset_dag_run: bool | None = False
    partition_key: str | None = None
    note: str | None = None


class DagRunResponse(DagRunOut):
    """Airflow's execution `DagRun` (the dag-runs reads); consumed events are not loaded here."""

    @classmethod
    def from_run(cls, run: DagRun) -> "DagRunResponse":
        return cls(
            dag_id=run.dag_id,
            run_id=run.run_id,
            logical_date=run.logical_date,
            data_interval_start=run.data_interval_start,
            data_interval_end=run.data_interval_end,
            run_after=run.run_after,
            start_date=run.start_date,
            end_date=run.end_date,
            clear_number=run.clear_number,
            run_type=run.run_type,
            state=run.state,
            conf=run.conf,
            triggering_user_name=run.triggering_user_name,
            consumed_asset_events=[],
            partition_key=None,
            note=run.note,
        )


class TIFilters(BaseModel):
    """Query of `/task-instances/count` and `/states` (lists repeat the parameter)."""

    dag_id: str
    map_index: Annotated[int, Field(ge=-(2**31), le=2**31 - 1)] | None = None
    task_ids: list[str] | None = None
    task_group_id: str | None = None
    logical_dates: list[UtcDatetime] | None = None
    run_ids: list[str] | None = None


class TICountFilters(TIFilters):
    states: list[str] | None = None


class DagRunCountFilters(BaseModel):
    dag_id: str
    logical_dates: list[UtcDatetime] | None = None
    run_ids: list[str] | None = None
    states: list[str] | None = None


class TaskStateStorePutBody(RequestBody):
    """Airflow's `TaskStateStorePutBody`: the value (not null, `state_store` checks it) and the
    expiry the worker resolved."""

    value: Any
    expires_at: NaiveIsUtcDatetime | None = None


class AssetStateStorePutBody(RequestBody):
    """Airflow's `AssetStateStorePutBody`."""

    value: Any
