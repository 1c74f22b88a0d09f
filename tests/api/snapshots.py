"""A comparable picture of every table the worker API may write, to prove "nothing written"."""

from typing import Any

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
