"""Bulk preconditions for benchmarks (set-up only; the measured paths go through real code).

Import after `_harness.setup_django(...)`.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from django.utils import timezone

from assets_app.models import (
    Asset,
    AssetDagRunQueue,
    AssetEvent,
    AssetEventQueue,
    Dag,
    DagRun,
    DagRunAssetEvent,
    DagRunType,
    DagScheduleAssetReference,
    Task,
    TaskInstance,
    TaskOutletAssetReference,
    TIState,
)

BATCH = 5000


def make_assets(count: int, *, prefix: str) -> list[Asset]:
    """`count` assets named <prefix>-<i> with uri s3://bench/<prefix>-<i>."""
    Asset.objects.bulk_create(
        [Asset(name=f"{prefix}-{i}", uri=f"s3://bench/{prefix}-{i}") for i in range(count)],
        batch_size=BATCH,
    )
    return list(Asset.objects.filter(name__startswith=f"{prefix}-").order_by("id"))


def asset_schedule(assets: Sequence[Asset], *, mode: str = "any") -> dict[str, Any]:
    """A normalized `Dag.schedule` over `assets` (any/all), or a single asset reference."""
    refs = [{"asset": {"name": a.name, "uri": a.uri}} for a in assets]
    if len(refs) == 1:
        return refs[0]
    return {mode: refs}


def make_scheduled_dags(
    assets: Sequence[Asset],
    *,
    count: int,
    prefix: str,
    paused: bool = False,
    mode: str = "any",
    max_active_runs: int = 16,
    tasks: int = 1,
) -> list[Dag]:
    """`count` Dags, each scheduled on all of `assets`, with `tasks` tasks each."""
    dags = Dag.objects.bulk_create(
        [
            Dag(
                dag_id=f"{prefix}_{i}",
                schedule=asset_schedule(assets, mode=mode),
                is_paused=paused,
                max_active_runs=max_active_runs,
            )
            for i in range(count)
        ]
    )
    Task.objects.bulk_create(
        [Task(dag=dag, task_id=f"t{j}") for dag in dags for j in range(tasks)], batch_size=BATCH
    )
    DagScheduleAssetReference.objects.bulk_create(
        [DagScheduleAssetReference(dag=dag, asset=asset) for dag in dags for asset in assets],
        batch_size=BATCH,
    )
    return dags


def make_producer(*, dag_id: str, task_id: str, outlets: Sequence[Asset]) -> Task:
    dag = Dag.objects.create(dag_id=dag_id)
    task = Task.objects.create(dag=dag, task_id=task_id)
    TaskOutletAssetReference.objects.bulk_create(
        [TaskOutletAssetReference(task=task, asset=a) for a in outlets], batch_size=BATCH
    )
    return task


def make_run(*, dag: Dag, run_id: str) -> DagRun:
    return DagRun.objects.create(dag=dag, run_id=run_id, run_type=DagRunType.MANUAL)


def make_tis(
    *, run: DagRun, count: int, state: str, task_prefix: str = "t", start: int = 0
) -> list[TaskInstance]:
    """`count` TIs of `run` (task ids <prefix><i>, map_index -1) in `state`."""
    now = timezone.now()
    running = state == TIState.RUNNING
    tis = [
        TaskInstance(
            id=uuid.uuid4(),
            dag_run=run,
            dag_id=run.dag_id,
            run_id=run.run_id,
            task_id=f"{task_prefix}{start + i}",
            state=state,
            hostname="bench-worker" if running else "",
            unixname="bench" if running else "",
            pid=4242 if running else None,
            start_date=now if running else None,
        )
        for i in range(count)
    ]
    return TaskInstance.objects.bulk_create(tis, batch_size=BATCH)


def make_tis_in_runs(
    *, dag: Dag, count: int, state: str, per_run: int = 10, prefix: str = "manual__bench"
) -> list[TaskInstance]:
    """`count` TIs spread over runs of `per_run` TIs each (a realistic run size: finishing a TI
    checks the other TIs of its run)."""
    tis: list[TaskInstance] = []
    for r in range(-(-count // per_run)):
        run = make_run(dag=dag, run_id=f"{prefix}_{r}")
        tis += make_tis(run=run, count=min(per_run, count - len(tis)), state=state)
    return tis


def make_events(assets: Sequence[Asset], *, per_asset: int = 1) -> list[int]:
    """Events without a source TI (like REST events), returned as ids."""
    now = timezone.now()
    events = AssetEvent.objects.bulk_create(
        [AssetEvent(asset=a, timestamp=now) for a in assets for _ in range(per_asset)],
        batch_size=BATCH,
    )
    return [e.id for e in events]


def link_consumed(*, run: DagRun, event_ids: Sequence[int]) -> None:
    DagRunAssetEvent.objects.bulk_create(
        [DagRunAssetEvent(dag_run=run, dag_id=run.dag_id, asset_event_id=e) for e in event_ids],
        batch_size=BATCH,
    )


def queue_events_for(*, dags: Sequence[Dag], events: Sequence[AssetEvent]) -> None:
    """ADRQ rows (dag, event) sorted as registration writes them."""
    rows = sorted((d.dag_id, e.id, e.asset_id) for d in dags for e in events)
    AssetDagRunQueue.objects.bulk_create(
        [AssetDagRunQueue(target_dag_id=d, asset_event_id=e, asset_id=a) for d, e, a in rows],
        batch_size=BATCH,
    )


def outlets_of(assets: Sequence[Asset]) -> list[dict[str, str]]:
    """`task_outlets` as a worker sends them."""
    return [{"name": a.name, "uri": a.uri, "type": "Asset"} for a in assets]


def fill_outbox(
    *, rows: int, outlets: Sequence[Asset], dag_id: str = "producer", prefix: str = "r"
) -> int:
    """`rows` outbox rows, each declaring all `outlets` (their TIs need not exist: the payload
    carries the source, DESIGN invariant 6). Returns the number of events they will make."""
    now = timezone.now()
    declared = outlets_of(outlets)
    objs = []
    for i in range(rows):
        ti_id = uuid.uuid4()
        source = {
            "ti_id": str(ti_id),
            "dag_id": dag_id,
            "run_id": f"manual__{prefix}",
            "task_id": f"{prefix}{i}",
            "map_index": -1,
            "try_number": 1,
        }
        objs.append(
            AssetEventQueue(
                ti_id=ti_id,
                try_number=1,
                source_dag_id=dag_id,
                source_run_id=source["run_id"],
                source_task_id=source["task_id"],
                payload={
                    "outlets": declared,
                    "outlet_events": [],
                    "source": source,
                    "end_date": now.isoformat(),
                },
                outlet_count=len(declared),
                next_attempt_at=now,
                created_at=now,
            )
        )
    AssetEventQueue.objects.bulk_create(objs, batch_size=1000)
    return rows * len(outlets)
