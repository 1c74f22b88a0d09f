"""Read-only lookups of assets and asset events for the worker API (GET /execution/assets/...,
/execution/asset-events/...). No transaction, no locks; a fixed number of queries each (events
with their assets joined and the runs that consumed them prefetched)."""

from datetime import datetime

from django.db.models import QuerySet

from . import exceptions
from .models import Asset, AssetAlias, AssetEvent

# Upper bound of one asset-event listing (also the largest `limit` accepted).
MAX_EVENTS = 10_000


def get_asset(*, name: str | None = None, uri: str | None = None) -> Asset:
    """The asset with this name (or uri); NotFound otherwise."""
    if name is not None:
        asset = Asset.objects.filter(name=name).first()
        what = f"name {name}"
    else:
        asset = Asset.objects.filter(uri=uri).first()
        what = f"URI {uri}"
    if asset is None:
        raise exceptions.NotFound(f"Asset with {what} not found")
    return asset


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
