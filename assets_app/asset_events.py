"""Reading assets and asset events: the public API (`GET /api/v2/assets/events`, the asset an
external event names) and the worker API (`GET /execution/assets/...`, `/asset-events/...`).
No transaction, no locks, a fixed number of queries each. Writes go through `registration`."""

from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import transaction
from django.db.models import Prefetch, QuerySet

from . import audit, exceptions, locks
from .models import Asset, AssetAlias, AssetEvent, DagRun
from .models.assets import ASSET_KEY_MAX_LENGTH

# Upper bound of one worker-API asset-event listing (also the largest `limit` accepted).
MAX_EVENTS = 10_000

ORDERINGS = {
    "timestamp": ("timestamp", "id"),
    "-timestamp": ("-timestamp", "-id"),
    "id": ("id",),
    "-id": ("-id",),
}


@dataclass(frozen=True)
class EventPage:
    events: list[AssetEvent]  # asset and consuming runs loaded
    total_entries: int


def as_utc(value: datetime | None, *, field: str) -> datetime | None:
    """An aware datetime filter value converted to UTC. PostgreSQL refuses offsets beyond
    +-15:59 (a 500 if passed through); a value that leaves the datetime range once in UTC is
    InvalidInput."""
    if value is None:
        return None
    if value.tzinfo is None:
        raise exceptions.InvalidInput(f"{field} needs a time zone", reason="invalid_datetime")
    try:
        return value.astimezone(UTC)
    except OverflowError as exc:
        raise exceptions.InvalidInput(
            f"{field} is out of range once converted to UTC", reason="invalid_datetime"
        ) from exc


def find_asset(
    *, asset_id: int | None = None, name: str | None = None, uri: str | None = None
) -> Asset:
    """The asset by id, or by name and/or uri (both given: both must match). NotFound otherwise.
    One query, no locks."""
    if asset_id is not None:
        lookup = {"pk": asset_id}
    elif name is not None or uri is not None:
        lookup = {k: v for k, v in (("name", name), ("uri", uri)) if v is not None}
    else:
        raise exceptions.InvalidInput(
            "name the asset: asset_id, or name and/or uri", reason="asset_required"
        )
    asset = Asset.objects.filter(**lookup).first()
    if asset is None:
        described = ", ".join(f"{k}={v!r}" for k, v in lookup.items()).replace("pk=", "id=")
        raise exceptions.NotFound(f"no asset with {described}", reason="asset_not_found")
    return asset


def list_asset_events(
    *,
    asset_id: int | None = None,
    source_dag_id: str | None = None,
    source_task_id: str | None = None,
    source_run_id: str | None = None,
    source_map_index: int | None = None,
    timestamp_gte: datetime | None = None,
    timestamp_lte: datetime | None = None,
    order_by: str = "timestamp",
    limit: int = 50,
    offset: int = 0,
) -> EventPage:
    """A page of events matching the filters, with the total count. Three queries (count, page,
    consuming runs) whatever the page size; no locks."""
    if order_by not in ORDERINGS:
        raise exceptions.InvalidInput(
            f"order_by must be one of {sorted(ORDERINGS)}", reason="invalid_order_by"
        )
    filters = {
        "asset_id": asset_id,
        "source_dag_id": source_dag_id,
        "source_task_id": source_task_id,
        "source_run_id": source_run_id,
        "source_map_index": source_map_index,
        "timestamp__gte": as_utc(timestamp_gte, field="timestamp_gte"),
        "timestamp__lte": as_utc(timestamp_lte, field="timestamp_lte"),
    }
    queryset = AssetEvent.objects.filter(**{k: v for k, v in filters.items() if v is not None})
    total = queryset.count()
    page = list(
        queryset.select_related("asset")
        .prefetch_related(Prefetch("consuming_runs", queryset=DagRun.objects.order_by("id")))
        .order_by(*ORDERINGS[order_by])[offset : offset + limit]
    )
    return EventPage(events=page, total_entries=total)


def get_asset(*, name: str | None = None, uri: str | None = None) -> Asset:
    """The asset with this name (or uri) for the worker API, with Airflow's not-found message."""
    try:
        return find_asset(name=name, uri=uri) if name is not None else find_asset(uri=uri)
    except exceptions.NotFound:
        what = f"name {name}" if name is not None else f"URI {uri}"
        raise exceptions.NotFound(f"Asset with {what} not found") from None


def assets_of_alias(*, alias_name: str) -> list[Asset]:
    """The assets an alias resolves to (empty for an unknown alias, like Airflow)."""
    return list(Asset.objects.filter(alias_links__alias__name=alias_name).order_by("name"))


def _window(
    events: QuerySet[AssetEvent],
    *,
    after: datetime | None,
    before: datetime | None,
    ascending: bool,
    limit: int | None,
) -> list[AssetEvent]:
    if after is not None:
        events = events.filter(timestamp__gte=after)
    if before is not None:
        events = events.filter(timestamp__lte=before)
    order = ("timestamp", "id") if ascending else ("-timestamp", "-id")
    events = events.select_related("asset").prefetch_related("consuming_runs").order_by(*order)
    return list(events[: limit or MAX_EVENTS])


def events_of_asset(
    *,
    name: str | None,
    uri: str | None,
    after: datetime | None = None,
    before: datetime | None = None,
    ascending: bool = True,
    limit: int | None = None,
) -> list[AssetEvent]:
    """Events of the asset with this name and/or uri. Neither given: a plain DomainError, which
    the API answers with 400 like Airflow."""
    if not name and not uri:
        raise exceptions.DomainError("name and uri cannot both be None", reason="missing_parameter")
    events = AssetEvent.objects.all()
    if name:
        events = events.filter(asset__name=name)
    if uri:
        events = events.filter(asset__uri=uri)
    return _window(events, after=after, before=before, ascending=ascending, limit=limit)


def events_of_alias(
    *,
    alias_name: str,
    after: datetime | None = None,
    before: datetime | None = None,
    ascending: bool = True,
    limit: int | None = None,
) -> list[AssetEvent]:
    """Events emitted through the alias with this name."""
    events = AssetEvent.objects.filter(
        alias_links__alias__in=AssetAlias.objects.filter(name=alias_name)
    )
    return _window(events, after=after, before=before, ascending=ascending, limit=limit)


def change_asset_uri(*, asset_id: int, uri: str, actor: audit.Actor | None = None) -> Asset:
    """Correct a stored asset's uri (an operator's fix for an asset-key conflict: the producer
    now declares the same name at another uri). Schedules match assets by name, so the Dags
    scheduled on it keep working. Own durable transaction, audited. Errors (nothing written):
    unknown asset -> NotFound; empty or too long uri -> InvalidInput; a uri another asset
    has -> Conflict ("asset_uri_taken")."""
    uri = (uri or "").strip()
    if not uri or len(uri) > ASSET_KEY_MAX_LENGTH:
        raise exceptions.InvalidInput(
            f"uri must be 1 to {ASSET_KEY_MAX_LENGTH} characters", reason="invalid_uri"
        )
    with transaction.atomic(durable=True):
        asset = locks.lock_asset(asset_id)
        if asset is None:
            raise exceptions.NotFound(f"asset {asset_id} does not exist", reason="asset_not_found")
        if asset.uri == uri:
            return asset
        other = Asset.objects.filter(uri=uri).exclude(pk=asset_id).first()
        if other is not None:
            raise exceptions.Conflict(
                f"uri {uri!r} belongs to asset #{other.pk} {other.name!r}",
                reason="asset_uri_taken",
            )
        old = asset.uri
        asset.uri = uri
        asset.save(update_fields=["uri", "updated_at"])
        audit.record(
            actor=actor,
            action="asset.change_uri",
            summary=f"changed the uri of asset {asset.name!r} from {old!r} to {uri!r}",
            targets=[audit.Target(kind="asset", object_id=asset.pk)],
            detail={"old_uri": old, "new_uri": uri},
        )
        return asset
