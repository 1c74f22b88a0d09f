"""Request and response bodies of the public API (`/api/v2/`), shaped like Airflow 3's public API.

Request bodies forbid unknown fields (a typo is a 422, not a silently ignored value).
"""

from datetime import datetime
from typing import Any

from ninja import Schema
from pydantic import AwareDatetime, ConfigDict, Field, model_validator

from assets_app.models import DagRun


class StrictSchema(Schema):
    model_config = ConfigDict(extra="forbid")


class TriggerDagRunBody(StrictSchema):
    """Airflow 3's `TriggerDAGRunPostBody`, with `logical_date` optional (null by default)."""

    dag_run_id: str | None = Field(default=None, min_length=1, max_length=250)
    logical_date: AwareDatetime | None = None
    data_interval_start: AwareDatetime | None = None
    data_interval_end: AwareDatetime | None = None
    run_after: AwareDatetime | None = None
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
