"""The asset event outbox (`AssetEventQueue`): enqueue, claim, retry, park, requeue.

Payload of a row (JSON), everything registration needs even after the TI is deleted:

    {
      "outlets":       [{"name": str, "uri": str, "type": "Asset"}  |
                        {"name": str, "type": "AssetAlias"}],        # as the worker declared them
      "outlet_events": [{"dest_asset_key": {"name", "uri"}, "extra": {...}} |
                        {"source_alias_name": str, "dest_asset_key": {"name", "uri"},
                         "dest_asset_extra": {...}, "extra": {...}}],
      "source": {"ti_id": str, "dag_id": str, "run_id": str, "task_id": str,
                 "map_index": int, "try_number": int},
      "end_date": ISO 8601 str,
    }
"""

from datetime import datetime
from typing import Any

from . import metrics
from .models import AssetEventQueue, TaskInstance


def build_payload(
    *,
    ti: TaskInstance,
    outlets: list[dict[str, Any]],
    outlet_events: list[dict[str, Any]],
    end_date: datetime,
) -> dict[str, Any]:
    return {
        "outlets": outlets,
        "outlet_events": outlet_events,
        "source": {
            "ti_id": str(ti.id),
            "dag_id": ti.dag_id,
            "run_id": ti.run_id,
            "task_id": ti.task_id,
            "map_index": ti.map_index,
            "try_number": ti.try_number,
        },
        "end_date": end_date.isoformat(),
    }


def enqueue(
    *,
    ti: TaskInstance,
    outlets: list[dict[str, Any]],
    outlet_events: list[dict[str, Any]],
    end_date: datetime,
) -> AssetEventQueue:
    """Insert the outbox row for this TI try. Runs inside the caller's transaction (the one that
    holds the TI lock and sets success) so the state change and the row commit together.

    One INSERT; the (ti_id, try_number) unique constraint refuses a second row for the same try.
    """
    row = AssetEventQueue.objects.create(
        ti_id=ti.id,
        try_number=ti.try_number,
        source_dag_id=ti.dag_id,
        source_run_id=ti.run_id,
        source_task_id=ti.task_id,
        source_map_index=ti.map_index,
        payload=build_payload(
            ti=ti, outlets=outlets, outlet_events=outlet_events, end_date=end_date
        ),
    )
    metrics.incr(metrics.ENQUEUED)
    return row
