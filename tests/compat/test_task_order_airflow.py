"""Issue 45: the console's task order (`catalog.task_order`) is the order Airflow 3.3.2's
grid lists them in: random Dags with nested task groups and dependencies against their
declaration order, built with the Task SDK and sorted by its own `TaskGroup.topological_sort`
(the grid's default `grid_view_sorting_order`), then by ours from the same declaration order,
upstream links and groups."""

import json
import subprocess

import pytest

from assets_app.catalog import task_order

from .airflow_worker_env import sdk_python

pytestmark = pytest.mark.slow

PROBE = r"""
import json, random, sys
from airflow.sdk import DAG, TaskGroup
from airflow.providers.standard.operators.empty import EmptyOperator

def build(seed):
    rng = random.Random(seed)
    with DAG(dag_id=f"d{seed}", schedule=None) as dag:
        created = []
        def make(depth, prefix):
            for _ in range(rng.randint(1, 4)):
                if depth < 2 and rng.random() < 0.3:
                    with TaskGroup(group_id=f"g{len(created)}_{depth}"):
                        make(depth + 1, prefix)
                else:
                    t = EmptyOperator(task_id=f"t{len(created)}")
                    created.append(t)
        make(0, "")
        # The dependencies follow a random order, not the declaration order: back edges too.
        tasks = list(created)
        rng.shuffle(tasks)
        for i, t in enumerate(tasks):
            for u in tasks[:i]:
                if rng.random() < 0.15:
                    u >> t
    return dag

def flatten(group, out, depth=0):
    from airflow.sdk.definitions.taskgroup import TaskGroup as TG
    for child in group.topological_sort():
        if isinstance(child, TG):
            out.append(["g", child.group_id, depth])
            flatten(child, out, depth + 1)
        else:
            out.append(["t", child.task_id, depth])

result = []
for seed in range(int(sys.argv[1])):
    dag = build(seed)
    order = []
    try:
        flatten(dag.task_group, order)
    except Exception as exc:  # groups that depend on each other both ways
        order = type(exc).__name__
    groups = {
        gid: sorted(t.task_id for t in g.iter_tasks())
        for gid, g in dag.task_group.get_task_group_dict().items()
        if gid
    }
    result.append({
        "task_ids": list(dag.task_dict),
        "upstream": {t.task_id: sorted(t.upstream_task_ids) for t in dag.tasks},
        "task_groups": groups,
        "order": order,
    })
print(json.dumps(result))
"""


def test_the_order_is_airflows_on_random_dags_with_groups():
    done = subprocess.run(
        [str(sdk_python()), "-c", PROBE, "300"], check=True, capture_output=True, text=True
    )
    cases = json.loads(done.stdout)
    with_groups = cycles = 0
    for case in cases:
        arguments = {
            "task_ids": case["task_ids"],
            "upstream": {t: set(up) for t, up in case["upstream"].items()},
            "task_groups": case["task_groups"],
        }
        if case["order"] == "AirflowDagCycleException":
            # Two groups wait for each other: Airflow cannot sort them, nor can `order`
            # (the console then lists the tasks without their groups, `dag_task_rows`).
            with pytest.raises(ValueError, match="cycle"):
                task_order.order(**arguments)
            cycles += 1
            continue
        rows = task_order.order(**arguments)
        ours = [
            ["t", r.task_id, r.depth] if r.task_id else ["g", r.group_id, r.depth] for r in rows
        ]
        assert ours == case["order"], case
        with_groups += bool(case["task_groups"])
    assert with_groups > 100 and cycles < 30  # the groups were exercised
