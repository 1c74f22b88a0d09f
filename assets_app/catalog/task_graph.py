"""A Dag's task graph as the console draws it (issue 45, Airflow's graph view): its tasks and
their upstream edges, task groups folded into one node until opened, and a run's states per
node (a mapped task's or a folded group's summary state, Airflow's `agg_state` priority).

Two queries for the shape (`load`: the tasks, their upstream links); the states come from TIs
the caller has already read (`node_states`). Folding (`fold`) is plain Python over the shape.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

from ..models import Task, TaskUpstream
from . import run_reads, task_order


@dataclass(frozen=True)
class TaskShape:
    pk: int
    task_id: str
    mapped: bool
    is_setup: bool
    is_teardown: bool
    trigger_rule: str


@dataclass(frozen=True)
class Shape:
    """The Dag's tasks in declaration order (first sync order) and its edges (upstream,
    downstream)."""

    tasks: list[TaskShape]
    edges: list[tuple[str, str]]
    task_groups: dict[str, list[str]]

    def rows(self) -> list[task_order.Row]:
        """The tasks and groups in Airflow's order (`task_order.dag_task_rows` without its
        queries); without the groups when they cannot be ordered."""
        task_ids = [t.task_id for t in self.tasks]
        upstream: dict[str, set[str]] = {}
        for up, down in self.edges:
            upstream.setdefault(down, set()).add(up)
        try:
            return task_order.order(
                task_ids=task_ids, upstream=upstream, task_groups=self.task_groups
            )
        except ValueError:
            return task_order.order(task_ids=task_ids, upstream=upstream, task_groups={})


def load(*, dag_id: str, task_groups: dict | None) -> Shape:
    """The shape of `dag_id`'s graph. Two queries whatever its size."""
    tasks = [
        TaskShape(
            pk=pk,
            task_id=task_id,
            mapped=map_length is not None or bool(map_upstream) or bool(map_group),
            is_setup=is_setup,
            is_teardown=is_teardown,
            trigger_rule=trigger_rule,
        )
        for (
            pk,
            task_id,
            map_length,
            map_upstream,
            map_group,
            is_setup,
            is_teardown,
            trigger_rule,
        ) in (
            Task.objects.filter(dag_id=dag_id)
            .order_by("pk")
            .values_list(
                "pk",
                "task_id",
                "map_length",
                "map_upstream",
                "map_group",
                "is_setup",
                "is_teardown",
                "trigger_rule",
            )
        )
    ]
    edges = sorted(
        TaskUpstream.objects.filter(task__dag_id=dag_id).values_list(
            "upstream__task_id", "task__task_id"
        )
    )
    return Shape(tasks=tasks, edges=edges, task_groups=dict(task_groups or {}))


@dataclass(frozen=True)
class Node:
    """A drawn node: a task (`kind` "task") or a folded group ("group", its `members`)."""

    key: str
    kind: str
    node_id: str
    label: str
    members: tuple[str, ...]
    mapped: bool = False
    is_setup: bool = False
    is_teardown: bool = False
    trigger_rule: str = "all_success"


@dataclass
class Folded:
    """The graph as drawn: its nodes (in task order), its edges between them (deduplicated,
    none within one node), and the open groups with the keys of the nodes drawn inside each."""

    nodes: dict[str, Node]
    edges: list[tuple[str, str]]
    open_groups: dict[str, list[str]] = field(default_factory=dict)
    group_labels: dict[str, str] = field(default_factory=dict)


def _label(name: str, parent: str | None) -> str:
    # Airflow's label: the id without its group's prefix.
    return name[len(parent) + 1 :] if parent and name.startswith(f"{parent}.") else name


def fold(shape: Shape, *, open_groups: Collection[str] = ()) -> Folded:
    """The drawn graph: every group folded into one node unless it is in `open_groups` (a group
    is drawn only when each group holding it is open). Nodes come in Airflow's task order
    (`task_order.order`)."""
    task_ids = [t.task_id for t in shape.tasks]
    by_id = {t.task_id: t for t in shape.tasks}
    tree = task_order.group_tree(task_ids=task_ids, task_groups=shape.task_groups)
    opened = {g for g in open_groups if g in tree.members}

    def visible(task_id: str) -> str:
        for group in reversed(tree.chain(task_id)):  # outermost first
            if group not in opened:
                return f"group:{group}"
        return f"task:{task_id}"

    where = {task_id: visible(task_id) for task_id in task_ids}
    rows = shape.rows()
    nodes: dict[str, Node] = {}
    for row in rows:
        if row.task_id is not None:
            key = where.get(row.task_id)
            if key is None or key in nodes or key != f"task:{row.task_id}":
                continue
            task = by_id[row.task_id]
            parent = tree.task_parent.get(row.task_id)
            nodes[key] = Node(
                key=key,
                kind="task",
                node_id=row.task_id,
                label=_label(row.task_id, parent),
                members=(row.task_id,),
                mapped=task.mapped,
                is_setup=task.is_setup,
                is_teardown=task.is_teardown,
                trigger_rule=task.trigger_rule,
            )
        elif row.group_id is not None:
            key = f"group:{row.group_id}"
            members = tree.members.get(row.group_id, set())
            if not members or any(where[t] != key for t in members):
                continue
            nodes[key] = Node(
                key=key,
                kind="group",
                node_id=row.group_id,
                label=_label(row.group_id, tree.group_parent.get(row.group_id)),
                members=tuple(t for t in task_ids if t in members),
            )
    # Groups that wait for each other cannot be ordered (`Shape.rows` leaves the groups out):
    # a folded one is still drawn, after the others.
    for task_id in task_ids:
        key = where[task_id]
        if key not in nodes and key.startswith("group:"):
            group = key.removeprefix("group:")
            nodes[key] = Node(
                key=key,
                kind="group",
                node_id=group,
                label=_label(group, tree.group_parent.get(group)),
                members=tuple(t for t in task_ids if where[t] == key),
            )
    edges = sorted(
        {
            (where[up], where[down])
            for up, down in shape.edges
            if up in where and down in where and where[up] != where[down]
        }
    )
    shown_open: dict[str, list[str]] = {}
    for group in sorted(opened):
        if all(g in opened for g in [group, *_ancestors(tree, group)]):
            inside = tree.members[group]
            shown_open[group] = [
                key for key, node in nodes.items() if node.members and node.members[0] in inside
            ]
    labels = {g: _label(g, tree.group_parent.get(g)) for g in shown_open}
    return Folded(nodes=nodes, edges=edges, open_groups=shown_open, group_labels=labels)


def _ancestors(tree: task_order.GroupTree, group: str) -> list[str]:
    chain, parent = [], tree.group_parent.get(group)
    while parent is not None:
        chain.append(parent)
        parent = tree.group_parent.get(parent)
    return chain


@dataclass(frozen=True)
class NodeState:
    """A node's state in one run: its summary state, how many TIs it has, the counts by state
    (for a mapped task or a group), and the TI to open when it has exactly one."""

    state: str | None
    count: int
    counts: list[tuple[str, int]]
    ti_id: str | None


def node_states(
    folded: Folded, tis: Iterable[tuple[str, str | None, object]]
) -> dict[str, NodeState]:
    """Per drawn node, its state in a run from that run's TIs, given as (task_id, state, ti
    id). A task's single TI gives its state; a mapped task's or a folded group's TIs give
    Airflow's summary (`run_reads.mapped_state`). Nodes without TIs are left out."""
    by_task: dict[str, list[tuple[str | None, object]]] = {}
    for task_id, state, ti_id in tis:
        by_task.setdefault(task_id, []).append((state, ti_id))
    result: dict[str, NodeState] = {}
    for key, node in folded.nodes.items():
        found = [ti for task_id in node.members for ti in by_task.get(task_id, ())]
        if not found:
            continue
        states: Sequence[str | None] = [state for state, _ in found]
        result[key] = NodeState(
            state=states[0] if len(found) == 1 else run_reads.mapped_state(states),
            count=len(found),
            counts=run_reads.state_counts(states),
            ti_id=str(found[0][1]) if len(found) == 1 else None,
        )
    return result
