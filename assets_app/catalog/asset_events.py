"""Reading assets, aliases and asset events: the public API (`GET /api/v2/assets`,
`/assets/aliases`, `/assets/events`, a run's upstream events, the asset an external event names)
and the worker API
(`GET /execution/assets/...`, `/asset-events/...`). No transaction, no locks, a fixed number of
queries each. Writes go through `registration`."""

__all__ = ["as_utc"]

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef, Prefetch, Q, QuerySet, Subquery

from ..guards import exceptions
from ..models import (
    Asset,
    AssetAlias,
    AssetEvent,
    DagRun,
    DagRunAssetEvent,
    DagScheduleAssetReference,
    TaskOutletAssetReference,
)
from ..models.assets import ASSET_KEY_MAX_LENGTH
from ..operations import audit
from ..sql import locks
from . import listing
from .listing import as_utc

# Upper bound of one worker-API asset-event listing (also the largest `limit` accepted).
MAX_EVENTS = 10_000


def find_asset(
    *, asset_id: int | None = None, name: str | None = None, uri: str | None = None
) -> Asset:
    """The asset by id, or by name and/or uri (both given: both must match). NotFound otherwise.
    One query, no locks."""
    lookup: dict[str, Any]
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


ASSET_ORDERING = listing.Ordering(
    keys={
        "id": "id",
        "name": "name",
        "uri": "uri",
        "created_at": "created_at",
        "updated_at": "updated_at",
    },
    default=("id",),
)
ALIAS_ORDERING = listing.Ordering(keys={"id": "id", "name": "name"}, default=("id",))
EVENT_ORDERING = listing.Ordering(
    keys={
        "source_task_id": "source_task_id",
        "source_dag_id": "source_dag_id",
        "source_run_id": "source_run_id",
        "source_map_index": "source_map_index",
        "timestamp": "timestamp",
        "id": "id",
    },
    default=("timestamp",),
)


def _with_last_event(assets: QuerySet[Asset]) -> QuerySet[Asset]:
    """Annotate each asset with its latest event (by timestamp, then id), as Airflow picks it,
    and prefetch what an AssetResponse shows: the Dags scheduled on it, the tasks producing it
    (with their Dags) and its aliases. 3 prefetch queries for any number of assets."""
    latest = AssetEvent.objects.filter(asset=OuterRef("pk")).order_by("-timestamp", "-id")
    return assets.annotate(
        last_event_id=Subquery(latest.values("id")[:1]),
        last_event_timestamp=Subquery(latest.values("timestamp")[:1]),
    ).prefetch_related(
        Prefetch(
            "schedule_dag_refs",
            queryset=DagScheduleAssetReference.objects.select_related("dag").order_by("dag_id"),
        ),
        Prefetch(
            "task_outlet_refs",
            queryset=TaskOutletAssetReference.objects.select_related("task__dag").order_by(
                "task__dag_id", "task__task_id"
            ),
        ),
        Prefetch("aliases", queryset=AssetAlias.objects.order_by("id")),
    )


def _active() -> Q:
    """Airflow's active assets are those a Dag definition still references: here, scheduled on
    by a Dag or declared as a task outlet."""
    return Q(Exists(DagScheduleAssetReference.objects.filter(asset=OuterRef("pk")))) | Q(
        Exists(TaskOutletAssetReference.objects.filter(asset=OuterRef("pk")))
    )


def list_assets(
    *,
    name_pattern: str | None = None,
    name_prefix_pattern: str | None = None,
    uri_pattern: str | None = None,
    uri_prefix_pattern: str | None = None,
    dag_ids: Sequence[str] | None = None,
    only_active: bool = True,
    order_by: Sequence[str] | None = None,
    limit: int = listing.DEFAULT_PAGE_LIMIT,
    offset: int = 0,
) -> listing.Page:
    """A page of assets (Airflow's `GET /assets` filters). `dag_ids`: assets a Dag is scheduled
    on or produces. 5 queries whatever the page size (count, page, 3 prefetches); no locks."""
    assets = Asset.objects.filter(
        listing.pattern_q("name", name_pattern),
        listing.prefix_q("name", name_prefix_pattern),
        listing.pattern_q("uri", uri_pattern),
        listing.prefix_q("uri", uri_prefix_pattern),
    )
    if only_active:
        assets = assets.filter(_active())
    if dag_ids:
        if len(dag_ids) == 1 and "," in dag_ids[0]:
            dag_ids = dag_ids[0].split(",")
        assets = assets.filter(
            Q(
                Exists(
                    DagScheduleAssetReference.objects.filter(
                        asset=OuterRef("pk"), dag_id__in=dag_ids
                    )
                )
            )
            | Q(
                Exists(
                    TaskOutletAssetReference.objects.filter(
                        asset=OuterRef("pk"), task__dag_id__in=dag_ids
                    )
                )
            )
        )
    return listing.offset_page(
        _with_last_event(assets), ASSET_ORDERING, order_by=order_by, limit=limit, offset=offset
    )


def get_asset_by_id(asset_id: int) -> Asset:
    """One asset with what `list_assets` loads for each; NotFound otherwise. 4 queries."""
    asset = _with_last_event(Asset.objects.filter(pk=asset_id)).first()
    if asset is None:
        raise exceptions.NotFound(
            f"The Asset with ID: `{asset_id}` was not found", reason="asset_not_found"
        )
    return asset


def list_aliases(
    *,
    name_pattern: str | None = None,
    name_prefix_pattern: str | None = None,
    order_by: Sequence[str] | None = None,
    limit: int = listing.DEFAULT_PAGE_LIMIT,
    offset: int = 0,
) -> listing.Page:
    """A page of asset aliases. 2 queries; no locks."""
    aliases = AssetAlias.objects.filter(
        listing.pattern_q("name", name_pattern), listing.prefix_q("name", name_prefix_pattern)
    )
    return listing.offset_page(
        aliases, ALIAS_ORDERING, order_by=order_by, limit=limit, offset=offset
    )


def get_alias(alias_id: int) -> AssetAlias:
    alias = AssetAlias.objects.filter(pk=alias_id).first()
    if alias is None:
        raise exceptions.NotFound(
            f"The Asset Alias with ID: `{alias_id}` was not found", reason="asset_alias_not_found"
        )
    return alias


def _consuming_runs() -> Prefetch:
    """Each event's consuming runs, each annotated with the event that triggered it (its most
    recent consumed event, by timestamp then id, as Airflow defines `triggering`)."""
    latest = (
        DagRunAssetEvent.objects.filter(dag_run=OuterRef("pk"))
        .order_by("-asset_event__timestamp", "-asset_event_id")
        .values("asset_event_id")[:1]
    )
    return Prefetch(
        "consuming_runs",
        queryset=DagRun.objects.annotate(triggering_event_id=Subquery(latest)).order_by("id"),
    )


def list_asset_events(
    *,
    asset_id: int | None = None,
    source_dag_id: str | None = None,
    source_task_id: str | None = None,
    source_run_id: str | None = None,
    source_map_index: int | None = None,
    name_pattern: str | None = None,
    name_prefix_pattern: str | None = None,
    timestamp_gte: datetime | None = None,
    timestamp_gt: datetime | None = None,
    timestamp_lte: datetime | None = None,
    timestamp_lt: datetime | None = None,
    order_by: Sequence[str] | None = None,
    limit: int = listing.DEFAULT_PAGE_LIMIT,
    offset: int = 0,
) -> listing.Page:
    """A page of events matching Airflow's `GET /assets/events` filters, with the total count.
    Three queries (count, page with assets, consuming runs) whatever the page size; no locks."""
    exact = {
        "asset_id": asset_id,
        "source_dag_id": source_dag_id,
        "source_task_id": source_task_id,
        "source_run_id": source_run_id,
        "source_map_index": source_map_index,
    }
    events = AssetEvent.objects.filter(
        listing.pattern_q("asset__name", name_pattern),
        listing.prefix_q("asset__name", name_prefix_pattern),
        listing.range_q(
            "timestamp", gte=timestamp_gte, gt=timestamp_gt, lte=timestamp_lte, lt=timestamp_lt
        ),
        **{k: v for k, v in exact.items() if v is not None},
    )
    return listing.offset_page(
        events.select_related("asset").prefetch_related(_consuming_runs()),
        EVENT_ORDERING,
        order_by=order_by,
        limit=limit,
        offset=offset,
    )


def events_consumed_by_run(*, dag_id: str, run_id: str) -> list[AssetEvent]:
    """The events a run consumed (Airflow's upstream asset events), oldest first, with their
    assets and consuming runs. NotFound for an unknown run. 3 queries; no locks."""
    run = DagRun.objects.filter(dag_id=dag_id, run_id=run_id).values_list("id", flat=True).first()
    if run is None:
        raise exceptions.NotFound(
            f"The DagRun with dag_id: `{dag_id}` and run_id: `{run_id}` was not found",
            reason="dag_run_not_found",
        )
    return list(
        AssetEvent.objects.filter(consumed_links__dag_run_id=run)
        .select_related("asset")
        .prefetch_related(_consuming_runs())
        .order_by("timestamp", "id")
    )


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
