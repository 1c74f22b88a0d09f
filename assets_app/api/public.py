"""Public API (DESIGN 6.2), mounted at /api/v2/: assets, aliases, asset events, queued events,
materialize, version and health, with the paths, parameters and shapes of Airflow 3.3.2's public
API. Dags, runs and task instances are in `public_dags.py`.

Every endpoint authenticates with `public_auth` (API token or staff session, never anonymous):
the router carries the auth, so an endpoint added here inherits it; only `/version` and
`/monitor/health` are open, as in Airflow. Each view declares the model permission it needs
(`@needs`, `public_permissions.py`). Views are thin: parse the query or body (schemas in
`public_schemas.py`), call one domain function, shape the response.
"""

from datetime import datetime

from django.http import HttpRequest
from ninja import Field, Header, Query, Router, Schema, Status

from assets_app.catalog import asset_events, listing, queued_events
from assets_app.guards import exceptions
from assets_app.models import (
    Asset,
    AssetAlias,
    AssetDagRunQueue,
    AssetEvent,
    DagRun,
    DagRunTriggeredBy,
)
from assets_app.operations import audit, observability
from assets_app.registration import outlets as registration
from assets_app.scheduling import runs as run_writes

from . import public_auth
from .public_auth import caller_scope, public_api_auth
from .public_permissions import needs
from .public_schemas import (
    AssetAliasCollectionResponse,
    AssetAliasResponse,
    AssetCollectionResponse,
    AssetEventCollectionResponse,
    AssetEventResponse,
    AssetResponse,
    BaseInfoResponse,
    CreateAssetEventBody,
    DagProcessorInfoResponse,
    DAGRunResponse,
    HealthInfoResponse,
    MaterializeAssetBody,
    Offset,
    QueuedEventCollectionResponse,
    QueuedEventResponse,
    SchedulerInfoResponse,
    TriggererInfoResponse,
    VersionInfo,
    responses,
)
from .schemas import UtcDatetime

router = Router(tags=["public"], auth=public_api_auth())


def actor_of(request: HttpRequest) -> audit.Actor:
    """The authenticated user (token owner or staff session) as the audit trail's actor."""
    return audit.Actor.from_user(public_auth.user_of(request), via="api")


# The Airflow version whose public API this one answers as (`GET /version`).
AIRFLOW_API_VERSION = "3.3.2"


class Page(Schema):
    limit: int = Field(default=listing.DEFAULT_PAGE_LIMIT, ge=0, le=2**31 - 1)
    offset: Offset = 0
    order_by: list[str] = Field(default_factory=list)


class AssetFilters(Page):
    name_pattern: str | None = None
    name_prefix_pattern: str | None = None
    uri_pattern: str | None = None
    uri_prefix_pattern: str | None = None
    dag_ids: list[str] = Field(default_factory=list)
    only_active: bool = True


class AliasFilters(Page):
    name_pattern: str | None = None
    name_prefix_pattern: str | None = None


class AssetEventFilters(Page):
    asset_id: int | None = None
    source_dag_id: str | None = None
    source_task_id: str | None = None
    source_run_id: str | None = None
    source_map_index: int | None = None
    name_pattern: str | None = None
    name_prefix_pattern: str | None = None
    timestamp_gte: UtcDatetime | None = None
    timestamp_gt: UtcDatetime | None = None
    timestamp_lte: UtcDatetime | None = None
    timestamp_lt: UtcDatetime | None = None


# --- assets and aliases -------------------------------------------------------------------------


@router.get("/assets", response=responses(AssetCollectionResponse, 400, 404), url_name="assets")
@needs("view", Asset)
def get_assets(request: HttpRequest, filters: Query[AssetFilters]) -> AssetCollectionResponse:
    """Assets, filtered and paged (Airflow: `GET /api/v2/assets`)."""
    page = asset_events.list_assets(**filters.dict())
    return AssetCollectionResponse(
        assets=[AssetResponse.from_asset(a) for a in page.rows], total_entries=page.total_entries
    )


@router.get("/assets/aliases", response=responses(AssetAliasCollectionResponse, 400, 404))
@needs("view", AssetAlias)
def get_asset_aliases(
    request: HttpRequest, filters: Query[AliasFilters]
) -> AssetAliasCollectionResponse:
    """Asset aliases, filtered and paged (Airflow: `GET /api/v2/assets/aliases`)."""
    page = asset_events.list_aliases(**filters.dict())
    return AssetAliasCollectionResponse(
        asset_aliases=[AssetAliasResponse.from_alias(a) for a in page.rows],
        total_entries=page.total_entries,
    )


@router.get("/assets/aliases/{asset_alias_id}", response=responses(AssetAliasResponse, 404))
@needs("view", AssetAlias)
def get_asset_alias(request: HttpRequest, asset_alias_id: int) -> AssetAliasResponse:
    """One asset alias, or 404 (Airflow: same path)."""
    return AssetAliasResponse.from_alias(asset_events.get_alias(asset_alias_id))


# --- asset events ---------------------------------------------------------------------------


@router.post(
    "/assets/events",
    response=responses(AssetEventResponse, 404),
    url_name="create_asset_event",
)
@needs("add", AssetEvent)
def create_asset_event(
    request: HttpRequest,
    body: CreateAssetEventBody,
    idempotency_key: str | None = Header(default=None, alias="Idempotency-Key", max_length=300),
) -> AssetEventResponse:
    """Register an external asset event (Airflow: `POST /api/v2/assets/events`). With an
    `Idempotency-Key` header (scoped to the caller), a retry with the same body returns the first
    event and writes nothing; another body with that key is a 422 `idempotency_key_reused`."""
    asset = asset_events.find_asset(asset_id=body.asset_id, name=body.name, uri=body.uri)
    idempotency = (
        registration.IdempotencyKey.of(
            key=idempotency_key, scope=caller_scope(request), body=body.model_dump(mode="json")
        )
        if idempotency_key
        else None
    )
    event, _ = registration.register_external_event(
        asset=asset, extra=body.extra, idempotency=idempotency, actor=actor_of(request)
    )
    return AssetEventResponse.from_event(event)


@router.get(
    "/assets/events",
    response=responses(AssetEventCollectionResponse, 400, 404),
    url_name="asset_events",
)
@needs("view", AssetEvent)
def get_asset_events(
    request: HttpRequest, filters: Query[AssetEventFilters]
) -> AssetEventCollectionResponse:
    """Asset events, filtered and paged (Airflow: `GET /api/v2/assets/events`)."""
    page = asset_events.list_asset_events(**filters.dict())
    return AssetEventCollectionResponse(
        asset_events=[AssetEventResponse.from_event(event) for event in page.rows],
        total_entries=page.total_entries,
    )


# --- materialize ----------------------------------------------------------------------------


@router.post(
    "/assets/{asset_id}/materialize",
    response=responses(DAGRunResponse, 400, 404, 409),
    url_name="materialize_asset",
)
@needs("add", DagRun)
def materialize_asset(
    request: HttpRequest, asset_id: int, body: MaterializeAssetBody | None = None
) -> DAGRunResponse:
    """Trigger a run of the one Dag that produces the asset (Airflow: same path): 404 when no Dag
    produces it, 409 when several do (a paused Dag's run waits, queued, as on Airflow)."""
    body = body or MaterializeAssetBody()
    run = run_writes.materialize_asset(
        asset_id=asset_id,
        conf=body.conf,
        triggering_user_name=public_auth.user_of(request).get_username(),
        triggered_by=DagRunTriggeredBy.REST_API,
        run_id=body.dag_run_id,
        run_after=body.run_after,
        logical_date=body.logical_date,
        data_interval_start=body.data_interval_start,
        data_interval_end=body.data_interval_end,
        note=body.note,
        actor=actor_of(request),
    )
    return DAGRunResponse.from_run(run)


# --- queued events --------------------------------------------------------------------------


def _queued(event: queued_events.QueuedEvent) -> QueuedEventResponse:
    return QueuedEventResponse(
        dag_id=event.dag_id,
        asset_id=event.asset_id,
        created_at=event.created_at,
        dag_display_name=event.dag_id,
    )


def _queued_collection(events: list[queued_events.QueuedEvent]) -> QueuedEventCollectionResponse:
    return QueuedEventCollectionResponse(
        queued_events=[_queued(event) for event in events], total_entries=len(events)
    )


@router.get(
    "/dags/{dag_id}/assets/queuedEvents",
    response=responses(QueuedEventCollectionResponse, 404),
    url_name="dag_queued_events",
)
@needs("view", AssetDagRunQueue)
def get_dag_asset_queued_events(
    request: HttpRequest, dag_id: str, before: UtcDatetime | None = None
) -> QueuedEventCollectionResponse:
    """A Dag's queued events, one per asset (Airflow: same path)."""
    return _queued_collection(queued_events.list_queued_events(dag_id=dag_id, before=before))


@router.delete("/dags/{dag_id}/assets/queuedEvents", response=responses(None, 400, 404, status=204))
@needs("delete", AssetDagRunQueue)
def delete_dag_asset_queued_events(
    request: HttpRequest, dag_id: str, before: UtcDatetime | None = None
) -> Status:
    """Drop a Dag's queued events: 204, or 404 when there were none (as Airflow)."""
    if not queued_events.clear_queued_events(dag_id=dag_id, before=before, actor=actor_of(request)):
        raise exceptions.NotFound(
            f"Queue event with dag_id: `{dag_id}` was not found", reason="queued_events_not_found"
        )
    return Status(204, None)


@router.get(
    "/dags/{dag_id}/assets/{asset_id}/queuedEvents",
    response=responses(QueuedEventResponse, 404),
    url_name="dag_asset_queued_event",
)
@needs("view", AssetDagRunQueue)
def get_dag_asset_queued_event(
    request: HttpRequest, dag_id: str, asset_id: int, before: UtcDatetime | None = None
) -> QueuedEventResponse:
    """A Dag's queued event for one asset, or 404 (Airflow: same path)."""
    events = queued_events.list_queued_events(dag_id=dag_id, asset_id=asset_id, before=before)
    if not events:
        raise exceptions.NotFound(
            f"Queued event with dag_id: `{dag_id}` and asset_id: `{asset_id}` was not found",
            reason="queued_event_not_found",
        )
    return _queued(events[0])


@router.delete(
    "/dags/{dag_id}/assets/{asset_id}/queuedEvents",
    response=responses(None, 400, 404, status=204),
)
@needs("delete", AssetDagRunQueue)
def delete_dag_asset_queued_event(
    request: HttpRequest, dag_id: str, asset_id: int, before: UtcDatetime | None = None
) -> Status:
    """Drop a Dag's queued events for one asset: 204, or 404 when there were none."""
    if not queued_events.clear_queued_events(
        dag_id=dag_id, asset_id=asset_id, before=before, actor=actor_of(request)
    ):
        raise exceptions.NotFound(
            f"Queued event with dag_id: `{dag_id}` and asset_id: `{asset_id}` was not found",
            reason="queued_events_not_found",
        )
    return Status(204, None)


@router.get("/assets/{asset_id}/queuedEvents", response=responses(QueuedEventCollectionResponse))
@needs("view", AssetDagRunQueue)
def get_asset_queued_events(
    request: HttpRequest, asset_id: int, before: UtcDatetime | None = None
) -> QueuedEventCollectionResponse:
    """An asset's queued events, one per Dag waiting on it (Airflow: same path; an unknown
    asset has none)."""
    events = queued_events.list_queued_events(dag_id=None, asset_id=asset_id, before=before)
    return _queued_collection(events)


@router.delete("/assets/{asset_id}/queuedEvents", response=responses(None, 404, status=204))
@needs("delete", AssetDagRunQueue)
def delete_asset_queued_events(
    request: HttpRequest, asset_id: int, before: UtcDatetime | None = None
) -> Status:
    """Drop an asset's queued events for every Dag: 204, or 404 when there were none."""
    if not queued_events.clear_queued_events(
        dag_id=None, asset_id=asset_id, before=before, actor=actor_of(request)
    ):
        raise exceptions.NotFound(
            f"Queue event with asset_id: `{asset_id}` was not found",
            reason="queued_events_not_found",
        )
    return Status(204, None)


@router.get("/assets/{asset_id}", response=responses(AssetResponse, 404), url_name="asset")
@needs("view", Asset)
def get_asset(request: HttpRequest, asset_id: int) -> AssetResponse:
    """One asset with its Dags, producing tasks, aliases and last event (Airflow: same path)."""
    return AssetResponse.from_asset(asset_events.get_asset_by_id(asset_id))


# --- version and health (open, as in Airflow) -----------------------------------------------


@router.get("/version", response={200: VersionInfo}, auth=None)
def get_version(request: HttpRequest) -> VersionInfo:
    """The Airflow version whose public API this service answers as; no git version."""
    return VersionInfo(version=AIRFLOW_API_VERSION, git_version=None)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


@router.get("/monitor/health", response={200: HealthInfoResponse}, auth=None)
def get_health(request: HttpRequest) -> HealthInfoResponse:
    """Airflow's health answer: the database, and as `scheduler` the drain and scheduler
    together (healthy when both ran and succeeded recently, `/healthz`'s rule). No triggerer and
    no Dag processor here: their status is null, as Airflow reports components it never saw."""
    health = observability.health()
    scheduler = next((c for c in health.components if c.component == "scheduler"), None)
    return HealthInfoResponse(
        metadatabase=BaseInfoResponse(status="healthy" if health.database else "unhealthy"),
        scheduler=SchedulerInfoResponse(
            status="healthy" if health.database and health.ok else "unhealthy",
            latest_scheduler_heartbeat=_iso(scheduler.last_run_at) if scheduler else None,
        ),
        triggerer=TriggererInfoResponse(status=None, latest_triggerer_heartbeat=None),
        dag_processor=DagProcessorInfoResponse(status=None, latest_dag_processor_heartbeat=None),
    )
