"""Issue 45: tasks in Airflow's grid order (topological, group by group) on the grid, the run
page and the Dag page."""

import random

import pytest
from django.urls import reverse

from assets_app.catalog import task_order
from assets_app.models import Dag, Task, TaskUpstream
from tests.factories import DagFactory, DagRunFactory, TaskInstanceFactory


def ids(rows):
    return [row.task_id or f"[{row.group_id}]" for row in rows]


def test_a_task_comes_after_its_upstream_whatever_the_alphabet():
    # `join` waits for `left` and `right`; alphabetically it would come first.
    rows = task_order.order(
        task_ids=["join", "left", "right", "start"],
        upstream={"left": {"start"}, "right": {"start"}, "join": {"left", "right"}},
        task_groups={},
    )
    assert ids(rows) == ["start", "left", "right", "join"]


def test_groups_are_one_node_among_their_siblings_and_sorted_inside():
    rows = task_order.order(
        task_ids=["extract", "g.b", "g.a", "g.inner.x", "load"],
        upstream={"g.a": {"extract"}, "g.b": {"g.a"}, "g.inner.x": {"g.b"}, "load": {"g.inner.x"}},
        task_groups={"g": ["g.a", "g.b", "g.inner.x"], "g.inner": ["g.inner.x"]},
    )
    assert ids(rows) == ["extract", "[g]", "g.a", "g.b", "[g.inner]", "g.inner.x", "load"]
    assert [(r.label, r.depth) for r in rows] == [
        ("extract", 0), ("g", 0), ("a", 1), ("b", 1), ("inner", 1), ("x", 2), ("load", 0)
    ]  # fmt: skip
    # A group declared before its upstream task waits for it: the dependency wins.
    rows = task_order.order(
        task_ids=["g.a", "start"], upstream={"g.a": {"start"}}, task_groups={"g": ["g.a"]}
    )
    assert ids(rows) == ["start", "[g]", "g.a"]


def test_airflows_sweep_keeps_declaration_order_where_no_dependency_decides():
    # Airflow's sweep: pass 1 emits every child whose upstream is out, in declaration order
    # (`a`, `c`); `b` waits for `d`, declared after it, so it goes to pass 2 after `d`.
    rows = task_order.order(task_ids=["a", "b", "c", "d"], upstream={"b": {"d"}}, task_groups={})
    assert ids(rows) == ["a", "c", "d", "b"]


def test_every_upstream_comes_first_in_random_dags():
    rng = random.Random(45)
    for _ in range(50):
        n = rng.randint(1, 30)
        task_ids = [f"t{i:02}" for i in range(n)]
        rng.shuffle(task_ids)  # declaration order unrelated to the dependencies
        topo = sorted(task_ids)
        upstream = {t: {u for u in topo[:i] if rng.random() < 0.2} for i, t in enumerate(topo)}
        rows = task_order.order(task_ids=task_ids, upstream=upstream, task_groups={})
        seen = [r.task_id for r in rows]
        assert sorted(seen) == topo
        assert all(seen.index(u) < seen.index(t) for t in topo for u in upstream[t])


def test_a_cycle_is_refused():
    with pytest.raises(ValueError, match="cycle"):
        task_order.order(task_ids=["a", "b"], upstream={"a": {"b"}, "b": {"a"}}, task_groups={})


def diamond() -> Dag:
    dag = DagFactory(dag_id="diamond", task_groups={"side": ["side.left", "side.right"]})
    tasks = {
        t: Task.objects.create(dag=dag, task_id=t)
        for t in ("join", "side.right", "side.left", "start")
    }
    for task, up in [
        ("side.left", "start"), ("side.right", "start"), ("join", "side.left"),
        ("join", "side.right"),
    ]:  # fmt: skip
        TaskUpstream.objects.create(task=tasks[task], upstream=tasks[up])
    return dag


def test_grid_run_page_and_dag_page_list_tasks_in_order(staff_client):
    dag = diamond()
    run = DagRunFactory(dag=dag, state="success")
    for t in ("join", "side.left", "side.right", "start"):
        TaskInstanceFactory(dag_run=run, task_id=t, succeeded=True)
    grid = staff_client.get(reverse("admin:assets_app_dag_grid", args=["diamond"])).content
    grid = grid.decode()
    positions = [
        grid.index(marker)
        for marker in (
            'data-task="start"',
            'data-group="side"',
            'data-task="side.right"',
            'data-task="side.left"',
            'data-task="join"',
        )
    ]
    assert positions == sorted(positions)
    run_page = staff_client.get(reverse("admin:assets_app_dagrun_change", args=[run.pk]))
    text = run_page.content.decode()
    table = text[text.index('id="run-task-instances"') :]
    order = [table.index(f">{t}<") for t in ("start", "side.right", "side.left", "join")]
    assert order == sorted(order)
    dag_page = staff_client.get(reverse("admin:assets_app_dag_change", args=["diamond"]))
    text = dag_page.content.decode()
    text = text[text.index('id="tasks-group"') :]  # the task table, not the graph above it
    order = [text.index(f'value="{t}"') if f'value="{t}"' in text else text.index(f">{t}<")
             for t in ("start", "side.right", "side.left", "join")]  # fmt: skip
    assert order == sorted(order)
