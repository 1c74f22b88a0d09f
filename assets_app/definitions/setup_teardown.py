"""Setup and teardown tasks (issue 39): what Airflow 3.3.2 derives from a Dag's upstream links
and its tasks' `is_setup` / `is_teardown` / `on_failure_fail_dagrun`, computed once at sync
from the definition (the scheduler reads the result: `TaskSetupLink` rows and
`Task.run_state_leaf`).

- A task that is not a teardown waits for its *relevant setups* that are not its direct
  upstream (`TriggerRuleDep._evaluate_setup_constraint`, whose setups come from
  `get_upstreams_only_setups`): every setup upstream of it, at any depth, that has no teardown
  or has a teardown downstream of the task.
- A teardown waits for the tasks between its direct setups and itself that are not its direct
  upstream (`TriggerRuleDep._evaluate_teardown_scope`).
- A run's state looks at its effective leaves (`DagRun._tis_for_dagrun_state`): a task counts
  unless it is a teardown without `on_failure_fail_dagrun` or something not such a teardown
  runs after it; a Dag of such teardowns only counts the tasks nothing runs after.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..models import SetupLinkKind


@dataclass(frozen=True)
class Node:
    """What the derivation reads of a task."""

    task_id: str
    upstream: tuple[str, ...]
    is_setup: bool = False
    is_teardown: bool = False
    on_failure_fail_dagrun: bool = False


@dataclass(frozen=True)
class Derived:
    """Per task id: the (other task id, kind) it waits for beyond its direct upstream, and
    whether its state counts for the run's."""

    links: Mapping[str, frozenset[tuple[str, str]]]
    run_state_leaf: Mapping[str, bool]


def _flat(start: str, links: Mapping[str, set[str]]) -> set[str]:
    """Airflow's `get_flat_relative_ids`: every task reached from `start` through `links`."""
    seen: set[str] = set()
    stack = list(links[start])
    while stack:
        current = stack.pop()
        if current not in seen:
            seen.add(current)
            stack.extend(links[current])
    return seen


def derive(nodes: Sequence[Node]) -> Derived:
    """The setup and scope links and run-state leaves of one Dag's tasks (ids known, no
    cycle: after the sync's checks)."""
    by_id = {node.task_id: node for node in nodes}
    up = {node.task_id: set(node.upstream) for node in nodes}
    down: dict[str, set[str]] = {node.task_id: set() for node in nodes}
    for task_id, ups in up.items():
        for u in ups:
            down[u].add(task_id)
    links: dict[str, frozenset[tuple[str, str]]] = {}
    if any(node.is_setup or node.is_teardown for node in nodes):
        for node in nodes:
            flat_up = _flat(node.task_id, up)
            found: set[tuple[str, str]] = set()
            if not node.is_teardown:
                teardowns_after = {t for t in _flat(node.task_id, down) if by_id[t].is_teardown}
                for setup_id in flat_up:
                    if not by_id[setup_id].is_setup or setup_id in up[node.task_id]:
                        continue
                    its_teardowns = {t for t in down[setup_id] if by_id[t].is_teardown}
                    if not its_teardowns or its_teardowns & teardowns_after:
                        found.add((setup_id, SetupLinkKind.SETUP))
            else:
                indirect = flat_up - up[node.task_id]
                for setup_id in up[node.task_id]:
                    if by_id[setup_id].is_setup:
                        found.update(
                            (other, SetupLinkKind.SCOPE)
                            for other in indirect & _flat(setup_id, down)
                        )
            if found:
                links[node.task_id] = frozenset(found)

    def ignorable(task_id: str) -> bool:
        node = by_id[task_id]
        return node.is_teardown and not node.on_failure_fail_dagrun

    leaves = {
        node.task_id
        for node in nodes
        if not ignorable(node.task_id) and all(ignorable(d) for d in down[node.task_id])
    }
    if not leaves:
        leaves = {node.task_id for node in nodes if not down[node.task_id]}
    return Derived(
        links=links, run_state_leaf={node.task_id: node.task_id in leaves for node in nodes}
    )


def cleared_with(nodes: Sequence[Node], task_ids: set[str]) -> set[str]:
    """The tasks Airflow 3.3.2 clears with `task_ids` when asked to clear those alone (its
    `partial_subset` without upstream or downstream): for a task that is neither a setup nor a
    teardown, its relevant setups and their teardowns (`get_upstreams_only_setups_and_
    teardowns`: a setup upstream of it with no teardown, or with one downstream of it); for a
    setup, its teardowns. `task_ids` themselves are not in the result."""
    by_id = {node.task_id: node for node in nodes}
    up = {node.task_id: set(node.upstream) for node in nodes}
    down: dict[str, set[str]] = {node.task_id: set() for node in nodes}
    for task_id, ups in up.items():
        for u in ups:
            down[u].add(task_id)

    def teardowns(task_id: str) -> set[str]:
        return {t for t in down[task_id] if by_id[t].is_teardown}

    found: set[str] = set()
    for task_id in task_ids & by_id.keys():
        node = by_id[task_id]
        if node.is_setup:
            found |= teardowns(task_id)
            continue
        if node.is_teardown:
            continue
        after = {t for t in _flat(task_id, down) if by_id[t].is_teardown}
        for setup_id in _flat(task_id, up):
            if by_id[setup_id].is_setup and (not teardowns(setup_id) or down[setup_id] & after):
                found.add(setup_id)
                found |= teardowns(setup_id) - {task_id}
    return found - task_ids
