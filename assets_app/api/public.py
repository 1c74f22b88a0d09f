"""Public API (DESIGN 6.2), mounted at /api/v2/.

Every endpoint authenticates with `public_auth` (API token or staff session, never anonymous):
the router carries the auth, so an endpoint added here inherits it. Views are thin: parse the body
(schemas in `public_schemas.py`), call one domain function, shape the response.
"""

from django.http import HttpRequest
from ninja import Header, Query, Router, Status

from assets_app import asset_events, audit, exceptions, queued_events, registration, runs

from .public_auth import public_api_auth
from .public_schemas import (
    AssetEventCollectionResponse,
    AssetEventFilters,
    AssetEventResponse,
    CreateAssetEventBody,
    DagRunResponse,
    QueuedEventCollectionResponse,
    QueuedEventResponse,
    TriggerDagRunBody,
)
from .schemas import UtcDatetime

router = Router(tags=["public"], auth=public_api_auth())


def _actor(request: HttpRequest) -> audit.Actor:
    """The authenticated user (token owner or staff session) as the audit trail's actor."""
    return audit.Actor.from_user(request.auth, via="api")


@router.post("/dags/{dag_id}/dagRuns", response=DagRunResponse, url_name="trigger_dag_run")
def trigger_dag_run(request: HttpRequest, dag_id: str, body: TriggerDagRunBody) -> DagRunResponse:
    """Trigger a manual run (Airflow: `POST /api/v2/dags/{dag_id}/dagRuns`)."""
    run = runs.trigger_dag(
        dag_id=dag_id,
        conf=body.conf,
        triggering_user_name=request.auth.get_username(),
        run_id=body.dag_run_id,
        run_after=body.run_after,
        logical_date=body.logical_date,
        data_interval_start=body.data_interval_start,
        data_interval_end=body.data_interval_end,
        note=body.note,
        actor=_actor(request),
    )
    return DagRunResponse.from_run(run)


@router.post("/assets/events", response=AssetEventResponse, url_name="create_asset_event")
def create_asset_event(
    request: HttpRequest,
    body: CreateAssetEventBody,
    idempotency_key: str | None = Header(default=None, alias="Idempotency-Key", max_length=300),
) -> AssetEventResponse:
    """Register an external asset event (Airflow: `POST /api/v2/assets/events`). With an
    `Idempotency-Key` header, a retry returns the first event and writes nothing."""
    asset = asset_events.find_asset(asset_id=body.asset_id, name=body.name, uri=body.uri)
    event, _ = registration.register_external_event(
        asset=asset, extra=body.extra, external_key=idempotency_key, actor=_actor(request)
    )
    return AssetEventResponse.from_event(event)


@router.get("/assets/events", response=AssetEventCollectionResponse, url_name="asset_events")
def list_asset_events(
    request: HttpRequest, filters: Query[AssetEventFilters]
) -> AssetEventCollectionResponse:
    """Asset events, filtered and paged (Airflow: `GET /api/v2/assets/events`)."""
    page = asset_events.list_asset_events(**filters.dict())
    return AssetEventCollectionResponse(
        asset_events=[AssetEventResponse.from_event(event) for event in page.events],
        total_entries=page.total_entries,
    )


def _queued(event: queued_events.QueuedEvent) -> QueuedEventResponse:
    return QueuedEventResponse(
        dag_id=event.dag_id,
        asset_id=event.asset_id,
        created_at=event.created_at,
        dag_display_name=event.dag_id,
    )


@router.get(
    "/dags/{dag_id}/assets/queuedEvents",
    response=QueuedEventCollectionResponse,
    url_name="dag_queued_events",
)
def get_dag_queued_events(
    request: HttpRequest, dag_id: str, before: UtcDatetime | None = None
) -> QueuedEventCollectionResponse:
    """A Dag's queued events, one per asset (Airflow: same path)."""
    events = queued_events.list_queued_events(dag_id=dag_id, before=before)
    return QueuedEventCollectionResponse(
        queued_events=[_queued(event) for event in events], total_entries=len(events)
    )


@router.delete("/dags/{dag_id}/assets/queuedEvents", response={204: None})
def delete_dag_queued_events(
    request: HttpRequest, dag_id: str, before: UtcDatetime | None = None
) -> Status:
    """Drop a Dag's queued events: 204, or 404 when there were none (as Airflow)."""
    if not queued_events.clear_queued_events(dag_id=dag_id, before=before, actor=_actor(request)):
        raise exceptions.NotFound(
            f"no queued events for dag {dag_id!r}", reason="queued_events_not_found"
        )
    return Status(204, None)


@router.get(
    "/dags/{dag_id}/assets/{asset_id}/queuedEvents",
    response=QueuedEventResponse,
    url_name="dag_asset_queued_event",
)
def get_dag_asset_queued_event(
    request: HttpRequest, dag_id: str, asset_id: int, before: UtcDatetime | None = None
) -> QueuedEventResponse:
    """A Dag's queued event for one asset, or 404 (Airflow: same path)."""
    events = queued_events.list_queued_events(dag_id=dag_id, asset_id=asset_id, before=before)
    if not events:
        raise exceptions.NotFound(
            f"no queued event for dag {dag_id!r} and asset {asset_id}",
            reason="queued_event_not_found",
        )
    return _queued(events[0])


@router.delete("/dags/{dag_id}/assets/{asset_id}/queuedEvents", response={204: None})
def delete_dag_asset_queued_events(
    request: HttpRequest, dag_id: str, asset_id: int, before: UtcDatetime | None = None
) -> Status:
    """Drop a Dag's queued events for one asset: 204, or 404 when there were none."""
    if not queued_events.clear_queued_events(
        dag_id=dag_id, asset_id=asset_id, before=before, actor=_actor(request)
    ):
        raise exceptions.NotFound(
            f"no queued events for dag {dag_id!r} and asset {asset_id}",
            reason="queued_events_not_found",
        )
    return Status(204, None)
