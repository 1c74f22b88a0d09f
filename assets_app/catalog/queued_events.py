"""Queued events (ADRQ rows) as operators and the public API see them: list and clear.

Airflow keeps one queue row per (asset, Dag); this service keeps one per (event, Dag) so the
scheduler consumes exactly the events it locked. Listing therefore groups rows by (Dag, asset),
with the time the oldest of them was queued, which is Airflow's `QueuedEventResponse` shape.
"""

from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import Count, Min

from ..guards import exceptions
from ..models import AssetAliasAsset, AssetDagRunQueue, Dag, DagScheduleAssetReference
from ..operations import audit
from ..sql import locks
from .asset_events import as_utc


@dataclass(frozen=True)
class QueuedEvent:
    dag_id: str
    asset_id: int
    created_at: datetime
    event_count: int


def _check_dag(dag_id: str) -> None:
    if not Dag.objects.filter(dag_id=dag_id).exists():
        raise exceptions.NotFound(f"dag {dag_id!r} does not exist", reason="dag_not_found")


def list_queued_events(
    *, dag_id: str | None, asset_id: int | None = None, before: datetime | None = None
) -> list[QueuedEvent]:
    """Queued events of a Dag (optionally one asset), or of one asset for every Dag (`dag_id`
    None), optionally queued before a time: one per (Dag, asset), by Dag and asset id. Read-only,
    no locks. Unknown Dag: NotFound."""
    if dag_id is not None:
        _check_dag(dag_id)
    before = as_utc(before, field="before")
    queryset = AssetDagRunQueue.objects.all()
    if dag_id is not None:
        queryset = queryset.filter(target_dag_id=dag_id)
    if asset_id is not None:
        queryset = queryset.filter(asset_id=asset_id)
    if before is not None:
        queryset = queryset.filter(created_at__lt=before)
    rows = (
        queryset.order_by("target_dag_id", "asset_id")
        .values("target_dag_id", "asset_id")
        .annotate(created_at=Min("created_at"), event_count=Count("id"))
    )
    return [
        QueuedEvent(
            dag_id=row["target_dag_id"],
            asset_id=row["asset_id"],
            created_at=row["created_at"],
            event_count=row["event_count"],
        )
        for row in rows
    ]


def clear_queued_events(
    *,
    dag_id: str | None,
    asset_id: int | None = None,
    before: datetime | None = None,
    actor: audit.Actor | None = None,
) -> int:
    """Delete a Dag's queued events (optionally for one asset), or one asset's for every Dag
    (`dag_id` None), optionally only those queued before a time: the Dags will not consume those
    events. Own durable transaction, audited (the events cleared) when anything was cleared;
    rows a scheduler is consuming right now are skipped (SKIP LOCKED) since they are gone when
    it commits. Returns rows deleted. Unknown Dag: NotFound."""
    if dag_id is None and asset_id is None:
        raise exceptions.InvalidInput("name a Dag or an asset", reason="queue_scope_required")
    if dag_id is not None:
        _check_dag(dag_id)
    before = as_utc(before, field="before")
    with transaction.atomic(durable=True):
        if dag_id is None:
            assert asset_id is not None  # checked above
            rows = locks.lock_asset_queue_rows(asset_id)
        else:
            rows = locks.lock_dag_queue_rows(
                dag_id, asset_ids=[asset_id] if asset_id is not None else None
            )
        cleared = [row for row in rows if before is None or row.created_at < before]
        if cleared:
            AssetDagRunQueue.objects.filter(id__in=[row.id for row in cleared]).delete()
            scope = f" of asset #{asset_id}" if asset_id is not None else ""
            owner = f"dag {dag_id}" if dag_id is not None else "every dag"
            audit.record(
                actor=actor,
                action="queued_events.clear",
                summary=f"cleared {len(cleared)} queued event(s){scope} of {owner}",
                targets=[
                    audit.Target(kind="asset_event", object_id=row.asset_event_id)
                    for row in cleared
                ],
                dag_id=dag_id or "",
                detail={
                    "asset_id": asset_id,
                    "before": before.isoformat() if before else None,
                },
            )
        return len(cleared)


def clear_unscheduled_queued_events(*, dag_id: str, actor: audit.Actor | None = None) -> int:
    """Delete a Dag's queued events whose asset is no longer in its schedule (directly or
    behind one of its aliases): after a schedule change nothing would ever consume them. Own
    durable transaction, audited; rows a scheduler holds are skipped. Returns rows deleted."""
    _check_dag(dag_id)
    with transaction.atomic(durable=True):
        scheduled = set(
            DagScheduleAssetReference.objects.filter(dag_id=dag_id).values_list(
                "asset_id", flat=True
            )
        ) | set(
            AssetAliasAsset.objects.filter(alias__schedule_dag_refs__dag_id=dag_id).values_list(
                "asset_id", flat=True
            )
        )
        rows = [row for row in locks.lock_dag_queue_rows(dag_id) if row.asset_id not in scheduled]
        if rows:
            AssetDagRunQueue.objects.filter(id__in=[row.id for row in rows]).delete()
            audit.record(
                actor=actor,
                action="queued_events.clear",
                summary=(
                    f"cleared {len(rows)} queued event(s) of dag {dag_id} waiting on assets no "
                    "longer in its schedule"
                ),
                targets=[
                    audit.Target(kind="asset_event", object_id=row.asset_event_id) for row in rows
                ],
                dag_id=dag_id,
                detail={"unscheduled": True, "asset_ids": sorted({r.asset_id for r in rows})},
            )
        return len(rows)
