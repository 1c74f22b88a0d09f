"""Which declared assets are active, as Airflow 3.3.2 decides it (issue 39): the inlet and outlet
check a task makes before it runs.

Airflow keeps every (name, uri) pair a Dag declares as an `AssetModel` and marks the ones it can
activate in `asset_active`, whose name and uri are each unique: the dag-processor activates a
file's assets as it stores them, skipping any whose name or uri an active asset already holds
(`AssetModelOperation.activate_assets_if_possible`, an INSERT ... ON CONFLICT DO NOTHING, in
airflow/dag_processing/collection.py), and the scheduler deactivates assets no Dag references any
more (no schedule, task outlet or inlet, or alias association) and activates what that freed
(`SchedulerJobRunner._update_asset_orphanage`). The Task SDK asks the execution API
(`GET /task-instances/{id}/validate-inlets-and-outlets`, `validate_inlets_and_outlets` in
airflow/api_fastapi/execution_api/routes/task_instances.py) which of the task's inlet and outlet
`Asset`s are not in `asset_active`, and fails the task before it runs when any is
(`_validate_task_inlets_and_outlets`, `AirflowInactiveAssetInInletOrOutletException`).

Here the `Asset` table holds each name and each uri once (what a schedule or an outlet declares,
a conflict refused at sync): it is the active set. A task's declared inlets are kept as declared
(`Task.inlets`), not stored as assets. So a declared (name, uri) is active when an asset has
exactly that name and uri, or when no asset holds its name or its uri (an inlet only a consumer
declares: Airflow stores and activates it), or when the one that does is referenced by nothing
(Airflow's scheduler orphans it and activates the newcomer). It is inactive when a referenced
asset holds its name or its uri with the other half different: `Asset("s3://output/1.txt")`
read by Airflow's `example_inlet_event_extra` while `example_outlet_event_extra` produces
`Asset(name="test-asset", uri="s3://output/1.txt")`.

Order is the one difference left: Airflow activates whichever pair it stored first (files in
parse order), here an asset a schedule or an outlet declares always holds its name and uri
against an inlet's, and of two inlets only consumers declare that conflict with each other both
count as active.

Reads only, no locks; a fixed number of queries (at most five) whatever the task declares.
"""

from collections.abc import Iterable
from dataclasses import dataclass

from django.db.models import Q

from ..models import (
    Asset,
    AssetAliasAsset,
    DagScheduleAssetReference,
    Task,
    TaskOutletAssetReference,
)


@dataclass(frozen=True, order=True)
class AssetKey:
    """An asset as a task declares it (Airflow's `AssetUniqueKey`)."""

    name: str
    uri: str


def declared(*, task: Task) -> list[AssetKey]:
    """The task's inlet and outlet assets, once each, inlets first as declared."""
    keys = [AssetKey(name=str(name), uri=str(uri)) for name, uri in task.inlets]
    keys.extend(AssetKey(name=a.name, uri=a.uri) for a in task.outlet_assets.all())
    return list(dict.fromkeys(keys))


def inactive(keys: Iterable[AssetKey]) -> list[AssetKey]:
    """The keys Airflow would not find in `asset_active` (see the module's docstring), sorted."""
    keys = list(dict.fromkeys(keys))
    if not keys:
        return []
    names, uris = {k.name for k in keys}, {k.uri for k in keys}
    holders = {
        AssetKey(name=name, uri=uri): pk
        for pk, name, uri in Asset.objects.filter(Q(name__in=names) | Q(uri__in=uris)).values_list(
            "pk", "name", "uri"
        )
    }
    conflicts = {
        key: [held for held in holders if held != key and key.name == held.name]
        + [held for held in holders if held != key and key.uri == held.uri]
        for key in keys
        if key not in holders
    }
    blocking = {held for found in conflicts.values() for held in found}
    referenced = _referenced(blocking, ids={held: holders[held] for held in blocking})
    return sorted(key for key, found in conflicts.items() if set(found) & referenced)


def _referenced(keys: set[AssetKey], *, ids: dict[AssetKey, int]) -> set[AssetKey]:
    """Those of `keys` some Dag references (Airflow's `_update_asset_orphanage` counts schedule,
    task outlet and inlet references and alias associations): the others are orphans."""
    if not keys:
        return set()
    pks = list(ids.values())
    used: set[int] = set()
    used.update(
        DagScheduleAssetReference.objects.filter(asset_id__in=pks).values_list(
            "asset_id", flat=True
        )
    )
    used.update(
        TaskOutletAssetReference.objects.filter(asset_id__in=pks).values_list("asset_id", flat=True)
    )
    used.update(AssetAliasAsset.objects.filter(asset_id__in=pks).values_list("asset_id", flat=True))
    found = {key for key in keys if ids[key] in used}
    rest = keys - found
    if rest:
        # Task.inlets is `[[name, uri], ...]`: jsonb containment of one pair.
        inlet_query = Q()
        for key in rest:
            inlet_query |= Q(inlets__contains=[[key.name, key.uri]])
        for task_inlets in Task.objects.filter(inlet_query).values_list("inlets", flat=True):
            found.update(AssetKey(name=n, uri=u) for n, u in task_inlets)
        found &= keys
    return found
