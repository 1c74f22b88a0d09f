"""Public API v2: Airflow 3.3.2's event log (`routes/public/event_logs.py`), read from the
audit trail (`catalog/event_logs.py` says how an entry maps to Airflow's `Log`)."""

from datetime import datetime

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema

from assets_app.catalog import event_logs
from assets_app.models import AuditEntry

from .public import Page
from .public_auth import public_api_auth
from .public_permissions import needs
from .public_schemas import responses
from .schemas import UtcDatetime

router = Router(tags=["public"], auth=public_api_auth())


class EventLogResponse(Schema):
    event_log_id: int
    when: datetime
    dag_id: str | None
    task_id: str | None
    run_id: str | None
    map_index: int | None
    try_number: int | None
    event: str
    logical_date: datetime | None
    owner: str | None
    extra: str | None
    dag_display_name: str | None = None
    task_display_name: str | None = None


class EventLogCollectionResponse(Schema):
    event_logs: list[EventLogResponse]
    total_entries: int


class EventLogFilters(Page):
    dag_id: str | None = None
    task_id: str | None = None
    run_id: str | None = None
    map_index: int | None = None
    try_number: int | None = None
    owner: str | None = None
    event: str | None = None
    excluded_events: list[str] = Field(default_factory=list)
    included_events: list[str] = Field(default_factory=list)
    before: UtcDatetime | None = None
    after: UtcDatetime | None = None
    dag_id_pattern: str | None = None
    task_id_pattern: str | None = None
    run_id_pattern: str | None = None
    owner_pattern: str | None = None
    event_pattern: str | None = None
    dag_id_prefix_pattern: str | None = None
    task_id_prefix_pattern: str | None = None
    run_id_prefix_pattern: str | None = None
    owner_prefix_pattern: str | None = None
    event_prefix_pattern: str | None = None


@router.get("/eventLogs", response=responses(EventLogCollectionResponse, 400))
@needs("view", AuditEntry)
def get_event_logs(
    request: HttpRequest, filters: Query[EventLogFilters]
) -> EventLogCollectionResponse:
    page = event_logs.list_event_logs(**filters.dict())
    return EventLogCollectionResponse(
        event_logs=[EventLogResponse(**event_logs.as_airflow_log(e)) for e in page.rows],
        total_entries=page.total_entries,
    )


@router.get("/eventLogs/{event_log_id}", response=responses(EventLogResponse, 404))
@needs("view", AuditEntry)
def get_event_log(request: HttpRequest, event_log_id: int) -> EventLogResponse:
    return EventLogResponse(**event_logs.as_airflow_log(event_logs.get_event_log(event_log_id)))
