"""Helpers for the registration / drain / scheduler tests: payloads and scheduled Dags."""

import uuid
from typing import Any

from django.utils import timezone

from assets_app.definitions import conditions
from assets_app.models import (
    Asset,
    AssetAlias,
    AssetEventQueue,
    Dag,
    DagScheduleAliasReference,
    DagScheduleAssetReference,
)
from tests.factories import AssetFactory


def asset_outlet(asset: Asset) -> dict[str, Any]:
    return {"name": asset.name, "uri": asset.uri, "type": "Asset"}


def alias_outlet(name: str) -> dict[str, Any]:
    return {"name": name, "type": "AssetAlias"}


def asset_event(asset: Asset, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"dest_asset_key": {"name": asset.name, "uri": asset.uri}, "extra": extra or {}}


def alias_event(
    alias: str,
    name: str,
    uri: str,
    extra: dict[str, Any] | None = None,
    dest_asset_extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "source_alias_name": alias,
        "dest_asset_key": {"name": name, "uri": uri},
        "dest_asset_extra": dest_asset_extra or {},
        "extra": extra or {},
    }


def payload(
    *,
    outlets: list[dict[str, Any]],
    outlet_events: list[dict[str, Any]] | None = None,
    ti_id: uuid.UUID | None = None,
    try_number: int = 1,
    dag_id: str = "producer",
    run_id: str = "manual__1",
    task_id: str = "produce",
    map_index: int = -1,
) -> dict[str, Any]:
    return {
        "outlets": outlets,
        "outlet_events": outlet_events or [],
        "source": {
            "ti_id": str(ti_id or uuid.uuid4()),
            "dag_id": dag_id,
            "run_id": run_id,
            "task_id": task_id,
            "map_index": map_index,
            "try_number": try_number,
        },
        "end_date": timezone.now().isoformat(),
    }


def outbox_row(body: dict[str, Any]) -> AssetEventQueue:
    """An outbox row as `outbox.enqueue` would write it (the TI need not exist)."""
    source = body["source"]
    return AssetEventQueue.objects.create(
        ti_id=source["ti_id"],
        try_number=source["try_number"],
        source_dag_id=source["dag_id"],
        source_run_id=source["run_id"],
        source_task_id=source["task_id"],
        source_map_index=source["map_index"],
        payload=body,
        outlet_count=len(body.get("outlets") or []) + len(body.get("outlet_events") or []),
    )


def scheduled_dag(dag_id: str, schedule: Any, **fields: Any) -> Dag:
    """A Dag scheduled on `schedule` (raw condition) with its schedule references, as sync_dags
    writes them; referenced assets and aliases are created when missing."""
    condition = conditions.parse(schedule)
    dag = Dag.objects.create(dag_id=dag_id, schedule=conditions.to_json(condition), **fields)
    for ref in conditions.referenced_assets(condition):
        asset = AssetFactory(name=ref.name, uri=ref.uri)
        DagScheduleAssetReference.objects.create(dag=dag, asset=asset)
    for name in conditions.referenced_aliases(condition):
        alias, _ = AssetAlias.objects.get_or_create(name=name)
        DagScheduleAliasReference.objects.create(dag=dag, alias=alias)
    return dag
