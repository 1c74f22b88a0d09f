"""A comparable picture of every table the worker API may write, to prove "nothing written"."""

from typing import Any

from django.apps import apps

from assets_app.models import (
    AssetAliasEvent,
    AssetDagRunQueue,
    AssetEvent,
    AssetEventQueue,
    DagRun,
    DagRunAssetEvent,
    TaskInstance,
)


def db_snapshot() -> dict[str, Any]:
    return {
        "tis": sorted(TaskInstance.objects.values_list(), key=str),
        "runs": sorted(DagRun.objects.values_list(), key=str),
        "outbox": sorted(AssetEventQueue.objects.values_list(), key=str),
        "events": AssetEvent.objects.count(),
        "alias_events": AssetAliasEvent.objects.count(),
        "adrq": AssetDagRunQueue.objects.count(),
        "consumed": DagRunAssetEvent.objects.count(),
    }


def _app_models() -> list[type]:
    return list(apps.get_app_config("assets_app").get_models())


def row_counts() -> dict[str, int]:
    """The number of rows of every model of the app (issue 50: "no row written", whatever the
    table: a replay or a stale token that wrote to a table nobody thought of shows here)."""
    return {model._meta.label: model.objects.count() for model in _app_models()}


def every_row() -> dict[str, list[Any]]:
    """Every row of every model of the app, comparable: no row written, deleted or changed."""
    return {
        model._meta.label: sorted(model.objects.values_list(), key=str) for model in _app_models()
    }
