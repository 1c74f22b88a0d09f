"""Events out (issue 29) on the public API: webhook endpoints and their subscriptions, secret
rotation, the messages of an endpoint, and assets' freshness policies. Our own extension (no
Airflow counterpart, tag `events-out`), with the same authentication and permissions as every
other route (`@needs`). Views are thin: parse, call one domain function, shape."""

from datetime import datetime

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema, Status

from assets_app.events_out import freshness, webhooks
from assets_app.guards import exceptions, masking
from assets_app.models import (
    Asset,
    FreshnessPolicy,
    WebhookDelivery,
    WebhookEndpoint,
)

from . import public_auth
from .public import actor_of
from .public_auth import public_api_auth
from .public_permissions import needs
from .public_schemas import Offset, responses
from .schemas import INT32_MAX

router = Router(tags=["events-out"], auth=public_api_auth())


class SubscriptionBody(Schema):
    event_type: str
    pattern: str = "*"


class EndpointBody(Schema):
    url: str = Field(max_length=2000)
    description: str = ""
    subscriptions: list[SubscriptionBody] = Field(min_length=1, max_length=100)
    max_in_flight: int | None = Field(default=None, ge=1, le=100)
    # Optional: a `whsec_...` secret of your own (else one is made and answered once).
    secret: str | None = None


class EndpointPatchBody(Schema):
    url: str | None = Field(default=None, max_length=2000)
    description: str | None = None
    subscriptions: list[SubscriptionBody] | None = Field(default=None, max_length=100)
    max_in_flight: int | None = Field(default=None, ge=1, le=100)
    state: str | None = Field(default=None, pattern="^(active|paused)$")


class EndpointResponse(Schema):
    id: int
    url: str
    description: str
    state: str
    state_reason: str
    max_in_flight: int
    subscriptions: list[SubscriptionBody]
    rotation_overlap_until: datetime | None
    created_at: datetime
    # Only in the answer that made it (creation, rotation): shown once, stored encrypted.
    secret: str | None = None

    @classmethod
    def of(
        cls, endpoint: WebhookEndpoint, *, secret: str | None = None, whole_url: bool = True
    ) -> "EndpointResponse":
        """`whole_url` False (a caller who may only view endpoints): the URL masked, as
        `masking.masked_url` shows it (its path and query may hold a token)."""
        return cls(
            id=endpoint.pk,
            url=endpoint.url if whole_url else masking.masked_url(endpoint.url),
            description=endpoint.description,
            state=endpoint.state,
            state_reason=endpoint.state_reason,
            max_in_flight=endpoint.max_in_flight,
            subscriptions=[
                SubscriptionBody(event_type=s.event_type, pattern=s.pattern)
                for s in endpoint.subscriptions.all()
            ],
            rotation_overlap_until=endpoint.previous_secret_expires_at,
            created_at=endpoint.created_at,
            secret=secret,
        )


class EndpointCollectionResponse(Schema):
    endpoints: list[EndpointResponse]
    total_entries: int


class DeliveryResponse(Schema):
    id: int
    message_id: str
    event_type: str
    state: str
    attempts: int
    next_attempt_at: datetime
    last_status: int | None
    last_error: str
    created_at: datetime
    delivered_at: datetime | None


class DeliveryCollectionResponse(Schema):
    deliveries: list[DeliveryResponse]
    total_entries: int


class FreshnessBody(Schema):
    kind: str = Field(pattern="^(max_interval|cron_deadline)$")
    # The column is a PositiveIntegerField (int4): a larger value is a 422, not a 500.
    interval_seconds: int | None = Field(default=None, ge=1, le=INT32_MAX)
    # Bounded at their columns (issue 38: a max_interval policy never reads them, so an
    # over-long one went to the database as it came, a 500).
    cron: str = Field(default="", max_length=200)
    timezone: str = Field(default="UTC", max_length=100)


class FreshnessResponse(Schema):
    asset_id: int
    kind: str
    interval_seconds: int | None
    cron: str
    timezone: str
    state: str
    state_since: datetime | None
    due_at: datetime | None
    last_evaluated_at: datetime | None


class Page(Schema):
    limit: int = Field(default=50, ge=0, le=1000)
    offset: Offset = 0  # bounded as every list's (issue 38: beyond bigint it was a 500)


def _whole_urls(request: HttpRequest) -> bool:
    """Only a caller who may change endpoints sees their URLs whole (issue 38)."""
    return public_auth.user_of(request).has_perm("assets_app.change_webhookendpoint")


def _specs(body: list[SubscriptionBody]) -> list[webhooks.SubscriptionSpec]:
    return [webhooks.SubscriptionSpec(event_type=s.event_type, pattern=s.pattern) for s in body]


@router.get("/webhooks/endpoints", response=responses(EndpointCollectionResponse))
@needs("view", WebhookEndpoint)
def get_endpoints(request: HttpRequest, page: Query[Page]):
    rows, total = webhooks.list_endpoints(limit=page.limit, offset=page.offset)
    return EndpointCollectionResponse(
        endpoints=[EndpointResponse.of(e, whole_url=_whole_urls(request)) for e in rows],
        total_entries=total,
    )


@router.post("/webhooks/endpoints", response=responses(EndpointResponse, status=201))
@needs("add", WebhookEndpoint)
def post_endpoint(request: HttpRequest, body: EndpointBody):
    saved = webhooks.create_endpoint(
        url=body.url,
        subscriptions=_specs(body.subscriptions),
        description=body.description,
        max_in_flight=body.max_in_flight,
        secret=body.secret,
        actor=actor_of(request),
    )
    endpoint = webhooks.get_endpoint(endpoint_id=saved.endpoint.pk)
    return Status(201, EndpointResponse.of(endpoint, secret=saved.secret))


@router.get("/webhooks/endpoints/{endpoint_id}", response=responses(EndpointResponse, 404))
@needs("view", WebhookEndpoint)
def get_endpoint(request: HttpRequest, endpoint_id: int):
    return EndpointResponse.of(
        webhooks.get_endpoint(endpoint_id=endpoint_id), whole_url=_whole_urls(request)
    )


@router.patch("/webhooks/endpoints/{endpoint_id}", response=responses(EndpointResponse, 404))
@needs("change", WebhookEndpoint)
def patch_endpoint(request: HttpRequest, endpoint_id: int, body: EndpointPatchBody):
    endpoint = webhooks.update_endpoint(
        endpoint_id=endpoint_id,
        url=body.url,
        description=body.description,
        subscriptions=_specs(body.subscriptions) if body.subscriptions is not None else None,
        max_in_flight=body.max_in_flight,
        actor=actor_of(request),
    )
    if body.state is not None:
        webhooks.set_state(
            endpoint_ids=[endpoint.pk],
            state=body.state,  # type: ignore[arg-type]
            actor=actor_of(request),
        )
        endpoint = webhooks.get_endpoint(endpoint_id=endpoint.pk)
    return EndpointResponse.of(endpoint)


@router.delete("/webhooks/endpoints/{endpoint_id}", response=responses(None, 404, status=204))
@needs("delete", WebhookEndpoint)
def delete_endpoint(request: HttpRequest, endpoint_id: int):
    webhooks.delete_endpoint(endpoint_id=endpoint_id, actor=actor_of(request))
    return Status(204, None)


@router.post(
    "/webhooks/endpoints/{endpoint_id}/rotateSecret", response=responses(EndpointResponse, 404)
)
@needs("change", WebhookEndpoint)
def rotate_secret(request: HttpRequest, endpoint_id: int):
    saved = webhooks.rotate_secret(endpoint_id=endpoint_id, actor=actor_of(request))
    endpoint = webhooks.get_endpoint(endpoint_id=endpoint_id)
    return EndpointResponse.of(endpoint, secret=saved.secret)


@router.get(
    "/webhooks/endpoints/{endpoint_id}/deliveries",
    response=responses(DeliveryCollectionResponse, 404),
)
@needs("view", WebhookDelivery)
def get_deliveries(request: HttpRequest, endpoint_id: int, page: Query[Page]):
    webhooks.get_endpoint(endpoint_id=endpoint_id)
    rows = WebhookDelivery.objects.filter(endpoint_id=endpoint_id).order_by("-id")
    return DeliveryCollectionResponse(
        deliveries=[
            DeliveryResponse.from_orm(d) for d in rows[page.offset : page.offset + page.limit]
        ],
        total_entries=rows.count(),
    )


def _asset(asset_id: int) -> Asset:
    asset = Asset.objects.filter(id=asset_id).first()
    if asset is None:
        raise exceptions.NotFound(f"asset {asset_id} not found")
    return asset


def _freshness(policy: FreshnessPolicy) -> FreshnessResponse:
    return FreshnessResponse(
        asset_id=policy.asset_id,
        kind=policy.kind,
        interval_seconds=policy.interval_seconds,
        cron=policy.cron,
        timezone=policy.timezone,
        state=policy.state,
        state_since=policy.state_since,
        due_at=policy.due_at,
        last_evaluated_at=policy.last_evaluated_at,
    )


@router.get("/assets/{asset_id}/freshness", response=responses(FreshnessResponse, 404))
@needs("view", FreshnessPolicy)
def get_freshness(request: HttpRequest, asset_id: int):
    policy = FreshnessPolicy.objects.filter(asset_id=_asset(asset_id).pk).first()
    if policy is None:
        raise exceptions.NotFound(f"asset {asset_id} has no freshness policy")
    return _freshness(policy)


@router.put("/assets/{asset_id}/freshness", response=responses(FreshnessResponse, 404))
@needs("change", FreshnessPolicy)
def put_freshness(request: HttpRequest, asset_id: int, body: FreshnessBody):
    policy = freshness.set_policy(
        asset=_asset(asset_id),
        kind=body.kind,
        interval_seconds=body.interval_seconds,
        cron=body.cron,
        tz=body.timezone,
        actor=actor_of(request),
    )
    return _freshness(policy)
