"""A Dag's tasks in the order Airflow 3.3.2's grid and graph list them (issue 45): topological
within each task group, groups as one node among their siblings (`grid_view_sorting_order`'s
default, "topological": `TaskGroup.topological_sort`).

Airflow sorts a group's children in declaration order, each after the siblings it depends on:
a task depends on its upstream tasks; a group on the upstream of its root tasks (those with no
upstream inside it); an upstream outside the parent group counts as the sibling that contains
it. Its sweep emits, pass after pass, every child whose dependencies are out, in declaration
order, which is sorting by (pass, declaration index) where a child's pass is the largest of its
earlier dependencies' passes and its later ones' passes plus one.

Declaration order here is the order the Dag's tasks were first synced in (the definition's
order; a task added to a file later comes after the tasks synced before it, where Airflow
places it where it stands in the file). The dependencies always hold whatever that order.
A group's position is that of its first task.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from assets_app.models import Dag, Task, TaskUpstream


@dataclass(frozen=True)
class Row:
    """A line of the ordered list: a task (`task_id`) or a group header (`group_id`)."""

    label: str
    depth: int
    task_id: str | None = None
    group_id: str | None = None


def dag_task_rows(*, dag_id: str, task_groups: dict | None = None) -> list[Row]:
    """The Dag's tasks and groups, ordered (`order`); without the groups when they cannot be
    ordered. Three queries, two when the caller passes the Dag's `task_groups`."""
    if task_groups is None:
        task_groups = (
            Dag.objects.filter(pk=dag_id).values_list("task_groups", flat=True).first() or {}
        )
    task_ids = list(
        Task.objects.filter(dag_id=dag_id).order_by("pk").values_list("task_id", flat=True)
    )
    upstream: dict[str, set[str]] = {task_id: set() for task_id in task_ids}
    for task_id, up in TaskUpstream.objects.filter(task__dag_id=dag_id).values_list(
        "task__task_id", "upstream__task_id"
    ):
        upstream.setdefault(task_id, set()).add(up)
    try:
        return order(task_ids=task_ids, upstream=upstream, task_groups=task_groups)
    except ValueError:
        # Two groups that wait for each other (a task of each upstream of a task of the other):
        # Airflow's grid cannot sort them either. The tasks alone, still topological.
        return order(task_ids=task_ids, upstream=upstream, task_groups={})


@dataclass(frozen=True)
class GroupTree:
    """How a Dag's task groups nest: each group's tasks (nested groups' included), each group's
    and each task's innermost enclosing group (None: the Dag's top level)."""

    members: dict[str, set[str]]
    group_parent: dict[str, str | None]
    task_parent: dict[str, str | None]

    def chain(self, task_id: str) -> list[str]:
        """The groups holding `task_id`, innermost first."""
        groups, parent = [], self.task_parent.get(task_id)
        while parent is not None:
            groups.append(parent)
            parent = self.group_parent[parent]
        return groups


def group_tree(*, task_ids: Iterable[str], task_groups: Mapping[str, Iterable[str]]) -> GroupTree:
    """The nesting of `task_groups` (Airflow's `task_group_dict`: group id -> its tasks' ids,
    nested groups' included) over `task_ids`; tasks not in `task_ids` are left out."""
    known = set(task_ids)
    members = {g: {t for t in ids if t in known} for g, ids in task_groups.items()}

    def size(g: str) -> tuple[int, int]:
        # The innermost group first; of two with the same tasks, the one nested deeper.
        return (len(members[g]), -len(g))

    group_parent: dict[str, str | None] = {}
    for g in members:
        holders = [h for h in members if h != g and members[g] <= members[h] and size(h) > size(g)]
        group_parent[g] = min(holders, key=size) if holders else None
    task_parent: dict[str, str | None] = {}
    for task_id in sorted(known):
        holders = [g for g in members if task_id in members[g]]
        task_parent[task_id] = min(holders, key=size) if holders else None
    return GroupTree(members=members, group_parent=group_parent, task_parent=task_parent)


def order(
    *, task_ids: list[str], upstream: dict[str, set[str]], task_groups: Mapping[str, Iterable[str]]
) -> list[Row]:
    """`task_ids` (in declaration order) as rows: each group's children sorted topologically,
    a group's header row before its members, `depth` its nesting. Raises ValueError on a
    cycle (the definitions refuse cycles; a stored one is corrupt)."""
    position = {task_id: i for i, task_id in enumerate(task_ids)}
    tree = group_tree(task_ids=task_ids, task_groups=task_groups)
    members, group_parent, task_parent = tree.members, tree.group_parent, tree.task_parent

    # A node is ("t", task_id) or ("g", group_id).
    children: dict[str | None, list[tuple[str, str]]] = {}
    for task_id in task_ids:
        children.setdefault(task_parent[task_id], []).append(("t", task_id))
    for g in members:
        children.setdefault(group_parent[g], []).append(("g", g))

    def first(node: tuple[str, str]) -> int:
        kind, name = node
        if kind == "t":
            return position[name]
        return min((position[t] for t in members[name]), default=len(task_ids))

    def ancestors(node: tuple[str, str]) -> list[tuple[str, str]]:
        chain = [node]
        parent = task_parent[node[1]] if node[0] == "t" else group_parent[node[1]]
        while parent is not None:
            chain.append(("g", parent))
            parent = group_parent[parent]
        return chain

    def deps(node: tuple[str, str]) -> set[str]:
        if node[0] == "t":
            return upstream.get(node[1], set())
        inside = members[node[1]]
        roots = [t for t in inside if not (upstream.get(t, set()) & inside)]
        return {u for t in roots for u in upstream.get(t, set())}

    rows: list[Row] = []

    def emit(parent: str | None, depth: int) -> None:
        nodes = sorted(children.get(parent, []), key=lambda n: (first(n), n[0] == "t", n[1]))
        index = {n: i for i, n in enumerate(nodes)}
        projected: list[set[int]] = []
        for i, node in enumerate(nodes):
            found = set()
            for edge in deps(node):
                if edge not in position:
                    continue
                for sibling in ancestors(("t", edge)):
                    if sibling in index:
                        if index[sibling] != i:
                            found.add(index[sibling])
                        break
            projected.append(found)
        passes = _passes(projected)
        for i in sorted(range(len(nodes)), key=lambda i: (passes[i], i)):
            kind, name = nodes[i]
            # Airflow's label: the id without its group's prefix.
            label = name[len(parent) + 1 :] if parent and name.startswith(f"{parent}.") else name
            if kind == "t":
                rows.append(Row(label=label, depth=depth, task_id=name))
            else:
                rows.append(Row(label=label, depth=depth, group_id=name))
                emit(name, depth + 1)

    emit(None, 0)
    return rows


def _passes(projected: list[set[int]]) -> list[int]:
    """Each node's sweep pass (Airflow's sweep, as numbers): 1 for a node without
    dependencies, else the largest pass of an earlier dependency, or of a later one plus one
    (it waits for the next sweep). Dependencies first (Kahn), so linear in the edges."""
    n = len(projected)
    waiting = [len(deps) for deps in projected]
    dependants: list[list[int]] = [[] for _ in range(n)]
    for i, deps in enumerate(projected):
        for d in deps:
            dependants[d].append(i)
    passes = [0] * n
    ready = [i for i in range(n) if not waiting[i]]
    done = 0
    while ready:
        i = ready.pop()
        passes[i] = max([1, *(passes[d] if d < i else passes[d] + 1 for d in projected[i])])
        done += 1
        for j in dependants[i]:
            waiting[j] -= 1
            if not waiting[j]:
                ready.append(j)
    if done != n:
        raise ValueError("the tasks' dependencies form a cycle")
    return passes
