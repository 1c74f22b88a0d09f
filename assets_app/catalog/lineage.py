"""The lineage graph: Dags, assets and aliases and how they connect, for the operator pages.

Edges follow the data: producing Dag -> asset (through the tasks that declare it as an outlet),
producing Dag -> alias, alias -> asset (as the alias resolved at run time), asset -> consuming
Dag and alias -> consuming Dag (the Dag's schedule). Each node carries what an operator wants
next to it: a Dag's last run and its waiting queued events, an asset's last event and the
events waiting for its consumers. Read-only, no locks, a fixed number of queries however many
Dags and assets there are.
"""

from collections import defaultdict, deque
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Count, IntegerField, Max, OuterRef, Subquery
from django.db.models.functions import Coalesce

from ..models import (
    Asset,
    AssetAlias,
    AssetAliasAsset,
    AssetDagRunQueue,
    AssetEvent,
    Dag,
    DagRun,
    DagScheduleAliasReference,
    DagScheduleAssetReference,
    TaskOutletAliasReference,
    TaskOutletAssetReference,
)


@dataclass
class Node:
    key: str  # "dag:<dag_id>", "asset:<id>", "alias:<id>"
    kind: str  # "dag" | "asset" | "alias"
    label: str
    pk: str | int
    is_paused: bool = False
    last_run_state: str | None = None
    last_run_at: datetime | None = None
    last_run_pk: int | None = None
    last_event_at: datetime | None = None
    waiting: int = 0  # queued events (ADRQ rows) for this Dag / of this asset


@dataclass
class Edge:
    source: str
    target: str
    kind: str  # "produces", "emits", "resolves", "schedules"
    tasks: list[str] = field(default_factory=list)


@dataclass
class Graph:
    nodes: dict[str, Node]
    edges: list[Edge]

    def neighbourhood(self, key: str, *, depth: int) -> "Graph":
        """The nodes within `depth` edges of `key`, upstream and downstream (edges followed
        in their own direction only, so siblings of a shared asset are not pulled in)."""
        down, up = defaultdict(list), defaultdict(list)
        for edge in self.edges:
            down[edge.source].append(edge.target)
            up[edge.target].append(edge.source)
        keep = {key}
        for adjacency in (down, up):
            frontier = deque([(key, 0)])
            seen = {key}
            while frontier:
                current, distance = frontier.popleft()
                if distance == depth:
                    continue
                for nxt in adjacency[current]:
                    if nxt not in seen:
                        seen.add(nxt)
                        frontier.append((nxt, distance + 1))
            keep |= seen
        return Graph(
            nodes={k: n for k, n in self.nodes.items() if k in keep},
            edges=[e for e in self.edges if e.source in keep and e.target in keep],
        )


def _count(model, fk: str) -> Coalesce:
    counted = (
        model.objects.filter(**{fk: OuterRef("pk")})
        .order_by()
        .values(fk)
        .annotate(n=Count("pk"))
        .values("n")
    )
    return Coalesce(Subquery(counted, output_field=IntegerField()), 0)


def load_graph() -> Graph:
    """Every Dag, asset and alias that takes part in a link (and every Dag), with their links.
    Eight queries."""
    last_run = DagRun.objects.filter(dag=OuterRef("pk")).order_by("-id")
    nodes: dict[str, Node] = {}
    for dag in Dag.objects.order_by("dag_id").annotate(
        last_run_pk=Subquery(last_run.values("pk")[:1]),
        last_run_state=Subquery(last_run.values("state")[:1]),
        last_run_at=Subquery(last_run.values("run_after")[:1]),
        waiting=_count(AssetDagRunQueue, "target_dag"),
    ):
        nodes[f"dag:{dag.dag_id}"] = Node(
            key=f"dag:{dag.dag_id}",
            kind="dag",
            label=dag.dag_id,
            pk=dag.dag_id,
            is_paused=dag.is_paused,
            last_run_state=dag.last_run_state,
            last_run_at=dag.last_run_at,
            last_run_pk=dag.last_run_pk,
            waiting=dag.waiting,
        )
    edges: dict[tuple[str, str], Edge] = {}

    def link(source: str, target: str, kind: str, task: str | None = None) -> None:
        edge = edges.setdefault((source, target), Edge(source=source, target=target, kind=kind))
        if task:
            edge.tasks.append(task)

    asset_ids: set[int] = set()
    alias_ids: set[int] = set()
    for dag_id, task_id, asset_id in TaskOutletAssetReference.objects.values_list(
        "task__dag_id", "task__task_id", "asset_id"
    ).order_by("task__dag_id", "task__task_id"):
        link(f"dag:{dag_id}", f"asset:{asset_id}", "produces", task_id)
        asset_ids.add(asset_id)
    for dag_id, task_id, alias_id in TaskOutletAliasReference.objects.values_list(
        "task__dag_id", "task__task_id", "alias_id"
    ).order_by("task__dag_id", "task__task_id"):
        link(f"dag:{dag_id}", f"alias:{alias_id}", "emits", task_id)
        alias_ids.add(alias_id)
    for alias_id, asset_id in AssetAliasAsset.objects.values_list("alias_id", "asset_id"):
        link(f"alias:{alias_id}", f"asset:{asset_id}", "resolves")
        alias_ids.add(alias_id)
        asset_ids.add(asset_id)
    for dag_id, asset_id in DagScheduleAssetReference.objects.values_list("dag_id", "asset_id"):
        link(f"asset:{asset_id}", f"dag:{dag_id}", "schedules")
        asset_ids.add(asset_id)
    for dag_id, alias_id in DagScheduleAliasReference.objects.values_list("dag_id", "alias_id"):
        link(f"alias:{alias_id}", f"dag:{dag_id}", "schedules")
        alias_ids.add(alias_id)
    last_event = AssetEvent.objects.filter(asset=OuterRef("pk")).order_by().values("asset")
    for asset in Asset.objects.filter(pk__in=asset_ids).annotate(
        last_event_at=Subquery(last_event.annotate(m=Max("timestamp")).values("m")),
        waiting=_count(AssetDagRunQueue, "asset"),
    ):
        nodes[f"asset:{asset.pk}"] = Node(
            key=f"asset:{asset.pk}",
            kind="asset",
            label=asset.name,
            pk=asset.pk,
            last_event_at=asset.last_event_at,
            waiting=asset.waiting,
        )
    for alias in AssetAlias.objects.filter(pk__in=alias_ids):
        nodes[f"alias:{alias.pk}"] = Node(
            key=f"alias:{alias.pk}", kind="alias", label=alias.name, pk=alias.pk
        )
    return Graph(
        nodes=nodes,
        edges=[e for e in edges.values() if e.source in nodes and e.target in nodes],
    )
