"""Workers claiming queued TIs (`claim_workloads`, our own endpoint: Airflow has none), with the
outlets each claimed TI's task declares and its Dag's file.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ..definitions import sync
from ..guards import exceptions
from ..models import Dag, Task, TaskInstance
from ..models.dags import DEFAULT_QUEUE
from ..operations import bundles as served
from ..sql import locks


@dataclass(frozen=True)
class Workload:
    """A claimed TI and the outlets its Task declares (`{"name", "uri", "type": "Asset"}` or
    `{"name", "type": "AssetAlias"}`)."""

    ti: TaskInstance
    task_outlets: list[dict[str, Any]] = field(default_factory=list)
    # Where the Dag's file is, relative to its folder (Dag.fileloc; "" for JSON definitions).
    dag_rel_path: str = ""
    # Its task's effective priority weight (Airflow's TI `priority_weight`), which ordered it,
    # and the slots it holds in its task's pool.
    priority_weight: int = 1
    pool_slots: int = 1
    queue: str = DEFAULT_QUEUE
    # The Dag bundle its Dag was synced from (the workload's `bundle_info`; None: a JSON
    # definition, handed as Airflow's default bundle).
    bundle_name: str | None = None


def claim_workloads(
    *,
    hostname: str,
    limit: int,
    queues: Sequence[str] = (DEFAULT_QUEUE,),
    bundles: Sequence[str] | None = None,
) -> list[Workload]:
    """Claim up to `limit` queued TIs of tasks in `queues` (Airflow's task `queue`; a worker
    listens on Airflow's `[operators] default_queue` unless told otherwise) and, with
    `bundles`, of Dags synced from one of those Dag bundles (a stock worker names the bundle
    it serves; without, any Dag's: the reference worker) for `hostname`,
    heaviest effective priority weight first (then Airflow's tie-break, then FIFO:
    `locks.claim_queued_task_instances`), never handing out more slots than a pool has open,
    even to concurrent claimers.

    Transaction: one durable transaction: `locks.lock_claim_pools` (the rows of the pools the
    claimable TIs' tasks name, by name: the one wait, behind another claim of the same pools),
    `locks.claim_queued_task_instances` (one statement over a bounded window of candidates, SKIP
    LOCKED) and one UPDATE setting claimed_by/claimed_at; that pair again only while it claimed
    some but fewer than `limit` with its window full (candidates that the run and task limits
    ranked out within the window: Airflow's loop in `_executable_task_instances_to_queued`),
    each pair taking at least one TI, so at most `limit` pairs. A claimed TI that is not started
    within `WORKLOAD_CLAIM_TIMEOUT_SECONDS` becomes claimable again. The declared outlets of the
    claimed TIs' Tasks and their Dags' files are read with 3 queries whatever `limit` is, inside
    the same transaction: a read that fails (the database went away) rolls the claim back, so a
    claim whose answer is an error never strands its TIs for the claim timeout. The claimed TI
    rows are locked by nobody else (they were queued and SKIP LOCKED), so the longer hold costs
    no waiter. With `bundles`, one more statement before the transaction records that a worker
    serves them (`bundles.record_claim`, at most one write per bundle per 30 s).
    """
    now = timezone.now()
    if bundles:
        served.record_claim(hostname=hostname, bundles=bundles, now=now)
    timeout = timedelta(seconds=settings.WORKLOAD_CLAIM_TIMEOUT_SECONDS)
    with transaction.atomic(durable=True):
        pools = locks.lock_claim_pools(queues=queues, now=now, claim_timeout=timeout)
        tis: list[TaskInstance] = []
        while True:
            batch = locks.claim_queued_task_instances(
                pools=pools,
                queues=queues,
                limit=limit - len(tis),
                now=now,
                claim_timeout=timeout,
                bundles=bundles,
            )
            if not batch.tis:
                break
            # Stamped before the next statement, which counts them against the limits.
            TaskInstance.objects.filter(id__in=[ti.id for ti in batch.tis]).update(
                claimed_by=hostname, claimed_at=now
            )
            tis += batch.tis
            if len(tis) >= limit or not batch.window_full:
                break
        if not tis:
            return []
        outlets = _declared_outlets({(ti.dag_id, ti.task_id) for ti in tis})
        files = {
            dag_id: (fileloc, bundle_name)
            for dag_id, fileloc, bundle_name in Dag.objects.filter(
                dag_id__in={ti.dag_id for ti in tis}
            ).values_list("dag_id", "fileloc", "bundle_name")
        }
    for ti in tis:
        ti.claimed_by = hostname
        ti.claimed_at = now
    return [
        Workload(
            ti=ti,
            task_outlets=outlets.get((ti.dag_id, ti.task_id), []),
            dag_rel_path=_rel_path(files.get(ti.dag_id, ("", None))[0]),
            bundle_name=files.get(ti.dag_id, ("", None))[1],
            priority_weight=ti.weight,  # type: ignore[attr-defined]  # the claim's columns
            pool_slots=ti.claim_pool_slots,  # type: ignore[attr-defined]
            queue=ti.claim_queue,  # type: ignore[attr-defined]
        )
        for ti in tis
    ]


def _rel_path(fileloc: str) -> str:
    """The fileloc handed to a worker as `dag_rel_path` (the Task SDK loads the file it names):
    only a relative path inside the bundle (`sync.check_fileloc`, issue 38: a fileloc stored
    before that rule, or a JSON definition's absolute path, is handed as "", no file)."""
    try:
        sync.check_fileloc(fileloc)
    except exceptions.InvalidInput:
        return ""
    return fileloc


def _declared_outlets(keys: set[tuple[str, str]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    dag_ids = {dag_id for dag_id, _ in keys}
    task_ids = {task_id for _, task_id in keys}
    tasks = Task.objects.filter(dag_id__in=dag_ids, task_id__in=task_ids).prefetch_related(
        "outlet_assets", "outlet_aliases"
    )
    result: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for task in tasks:
        key = (task.dag_id, task.task_id)
        if key not in keys:
            continue
        result[key] = [
            {"name": asset.name, "uri": asset.uri, "type": "Asset"}
            for asset in sorted(task.outlet_assets.all(), key=lambda a: a.name)
        ] + [
            {"name": alias.name, "type": "AssetAlias"}
            for alias in sorted(task.outlet_aliases.all(), key=lambda a: a.name)
        ]
    return result
