"""Issue 45: the task graph of the Dag page and the run page (Airflow's graph view): tasks and
their upstream edges laid out left to right, task groups folded until opened, a run's states."""

import re

from django.urls import reverse

from assets_app.admin import task_graph as task_graph_view
from assets_app.catalog import task_graph
from assets_app.models import Task, TaskUpstream
from tests.factories import DagFactory, DagRunFactory, TaskInstanceFactory


def shape(edges, groups=None, mapped=()):
    ids = []
    for up, down in edges:
        for t in (up, down):
            if t not in ids:
                ids.append(t)
    tasks = [
        task_graph.TaskShape(
            pk=i,
            task_id=t,
            mapped=t in mapped,
            is_setup=False,
            is_teardown=False,
            trigger_rule="all_success",
        )
        for i, t in enumerate(ids)
    ]
    return task_graph.Shape(tasks=tasks, edges=list(edges), task_groups=groups or {})


NESTED = shape(
    [
        ("start", "g.a"),
        ("g.a", "g.b"),
        ("g.b", "g.inner.x"),
        ("g.inner.x", "end"),
        ("start", "end"),
    ],
    groups={"g": ["g.a", "g.b", "g.inner.x"], "g.inner": ["g.inner.x"]},
)


def test_a_folded_group_is_one_node_and_takes_its_members_edges():
    folded = task_graph.fold(NESTED)
    assert list(folded.nodes) == ["task:start", "group:g", "task:end"]
    assert folded.nodes["group:g"].members == ("g.a", "g.b", "g.inner.x")
    assert folded.edges == [
        ("group:g", "task:end"),
        ("task:start", "group:g"),
        ("task:start", "task:end"),
    ]
    assert folded.open_groups == {}


def test_an_open_group_shows_its_tasks_and_its_folded_subgroups():
    folded = task_graph.fold(NESTED, open_groups=["g", "unknown"])
    assert list(folded.nodes) == ["task:start", "task:g.a", "task:g.b", "group:g.inner", "task:end"]
    assert folded.nodes["task:g.a"].label == "a"  # without the group's prefix, as Airflow
    assert ("task:g.b", "group:g.inner") in folded.edges
    assert folded.open_groups == {"g": ["task:g.a", "task:g.b", "group:g.inner"]}
    # An inner group opened inside a folded one stays folded with it.
    assert list(task_graph.fold(NESTED, open_groups=["g.inner"]).nodes) == list(
        task_graph.fold(NESTED).nodes
    )
    both = task_graph.fold(NESTED, open_groups=["g", "g.inner"])
    assert "task:g.inner.x" in both.nodes and set(both.open_groups) == {"g", "g.inner"}


def test_groups_that_wait_for_each_other_are_still_drawn():
    # a.x -> b.y and b.z -> a.w: neither group can come first (Airflow's grid refuses them).
    crossed = shape(
        [("a.x", "b.y"), ("b.z", "a.w")], groups={"a": ["a.x", "a.w"], "b": ["b.y", "b.z"]}
    )
    folded = task_graph.fold(crossed)
    assert sorted(folded.nodes) == ["group:a", "group:b"]
    assert folded.edges == [("group:a", "group:b"), ("group:b", "group:a")]


def test_a_run_colours_tasks_mapped_tasks_and_groups_by_airflows_summary():
    folded = task_graph.fold(shape([("start", "m"), ("m", "g.a")], {"g": ["g.a"]}, mapped={"m"}))
    states = task_graph.node_states(
        folded,
        [
            ("start", "success", "u1"),
            ("m", "success", "u2"),
            ("m", "failed", "u3"),
            ("m", "running", "u4"),
            ("g.a", "upstream_failed", "u5"),
        ],
    )
    assert states["task:start"].state == "success" and states["task:start"].ti_id == "u1"
    assert states["task:m"].state == "failed" and states["task:m"].count == 3
    assert states["task:m"].ti_id is None
    assert states["group:g"].state == "upstream_failed"


def diamond_dag(dag_id="graphed", extra=0):
    """start -> side.left, side.right -> join (the group `side`), and `extra` more tasks after
    join in a chain."""
    dag = DagFactory(dag_id=dag_id, task_groups={"side": ["side.left", "side.right"]})
    ids = ["start", "side.left", "side.right", "join", *(f"more_{i}" for i in range(extra))]
    tasks = {t: Task.objects.create(dag=dag, task_id=t) for t in ids}
    links = [("start", "side.left"), ("start", "side.right"), ("side.left", "join")]
    links += [("side.right", "join")]
    links += [(ids[3 + i], f"more_{i}") for i in range(extra)]
    TaskUpstream.objects.bulk_create(
        [TaskUpstream(task=tasks[d], upstream=tasks[u]) for u, d in links]
    )
    return dag


def graph_of(page: str) -> str:
    return page[page.index('id="task-graph"') : page.index("</svg>", page.index('id="task-graph"'))]


def test_the_dag_page_draws_its_graph_with_a_pinned_query_count(
    staff_client, django_assert_num_queries
):
    small = diamond_dag("small")
    big = diamond_dag("big", extra=80)
    urls = [reverse("admin:assets_app_dag_change", args=[d.pk]) for d in (small, big)]
    staff_client.get(urls[0])
    # session, user, the Dag, its shape (tasks, upstream links: the graph and the task table's
    # order), the task table (tasks, their outlets, aliases, upstream), queued events, runs: the
    # same for 4 tasks and 84.
    with django_assert_num_queries(11):
        page = staff_client.get(urls[0]).content.decode()
    with django_assert_num_queries(11):
        assert staff_client.get(urls[1]).status_code == 200
    graph = graph_of(page)
    keys = re.findall(r'data-key="([^"]+)"', graph)
    assert keys == ["start", "side", "join"]  # the group folded, in task order
    assert len(re.findall(r'class="aes-edge"', graph)) == 2
    # Left to right: each node's x after its upstream's.
    node = r'data-key="([^"]+)" data-state=""><title>[^<]*</title><rect x="([\d.]+)"'
    xs = {key: float(x) for key, x in re.findall(node, graph)}
    assert xs["start"] < xs["side"] < xs["join"]
    start = Task.objects.get(dag=small, task_id="start")
    assert f'href="{reverse("admin:assets_app_task_change", args=[start.pk])}"' in graph
    assert "2 tasks · ▸ open" in graph and f"{urls[0]}?open=side#task-graph" in graph
    opened = graph_of(staff_client.get(urls[0], {"open": "side"}).content.decode())
    assert re.findall(r'data-key="([^"]+)"', opened) == ["start", "side.left", "side.right", "join"]
    assert 'class="aes-tg-group-box" data-group="side"' in opened
    assert len(re.findall(r'class="aes-edge"', opened)) == 4


def test_the_run_page_colours_the_graph_by_the_runs_states(staff_client):
    dag = diamond_dag()
    run = DagRunFactory(dag=dag, state="running")
    start = TaskInstanceFactory(dag_run=run, task_id="start", succeeded=True)
    TaskInstanceFactory(dag_run=run, task_id="side.left", state="failed")
    TaskInstanceFactory(dag_run=run, task_id="side.right", state="running")
    url = reverse("admin:assets_app_dagrun_change", args=[run.pk])
    graph = graph_of(staff_client.get(url).content.decode())
    assert 'data-key="start" data-state="success"' in graph
    ti_url = reverse("admin:assets_app_taskinstance_change", args=[start.pk])
    assert f'href="{ti_url}"' in graph
    assert 'data-key="side" data-state="failed"' in graph  # Airflow's priority: failed first
    assert "1 failed, 1 running" in graph
    assert 'data-key="join" data-state=""' in graph and "no task instance" in graph
    opened = graph_of(staff_client.get(url, {"open": "side"}).content.decode())
    assert 'data-key="side.right" data-state="running"' in opened


def test_a_graph_over_the_cap_is_not_drawn(staff_client, monkeypatch):
    monkeypatch.setattr(task_graph_view, "MAX_NODES", 3)
    dag = diamond_dag(extra=1)  # start, side (folded), join, more_0: 4 nodes
    page = staff_client.get(reverse("admin:assets_app_dag_change", args=[dag.pk])).content
    assert "4 nodes to draw: more than the graph draws (3)" in page.decode()
    assert 'class="aes-task-graph"' not in page.decode()
