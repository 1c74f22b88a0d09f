"""Operator console render time: the lineage graph at 300 Dags and the runs grid at 25 x 50.

In-process (Django's test client, a logged-in superuser) on a fresh benchmark database holding
the suite's own console data (`tests/admin/test_console.py`: `lineage_data`, `grid_data`), so
the figures are for the pages the query-count pins cover. Each round of the graph renders it
once with the layout cache emptied ("cold": layout computed) and once more ("cached"); the grid
has no layout cache. The first request of the process (URL conf import, template loading) is a
warm-up and not counted.

Target (issue 12): each page renders in under 500 ms on the suite's data.

Issue 45's rows, on a Dag of 1,000 tasks (20 task groups of 50, each a chain, the groups one
after the other) with 100 runs (100,000 TIs): the Dag page with its graph (groups folded, as it
opens; cold and cached layout), the graph with one group open, a run page (the graph coloured by
that run's states, the failed-TI excerpt and TI table), and the grid of the last 100 runs
(`?runs=100`). Target: < 1 s each.
"""

from __future__ import annotations

import _harness as h

NAME = "console_render"
TARGET_MS = 500.0
BIG_TARGET_MS = 1000.0
BIG_TASKS, BIG_GROUPS, BIG_RUNS = 1000, 20, 100


def big_dag(tasks: int = BIG_TASKS, groups: int = BIG_GROUPS, runs: int = BIG_RUNS):
    """A Dag of `tasks` tasks in `groups` task groups (each a chain, the groups chained), and
    `runs` finished runs with a TI of every task (states and durations varied)."""
    from datetime import timedelta

    from django.utils import timezone

    from assets_app.models import (
        Dag,
        DagRun,
        DagRunType,
        Task,
        TaskInstance,
        TaskUpstream,
        TIState,
    )

    per_group = tasks // groups
    ids = [f"g{g:02}.t{t:03}" for g in range(groups) for t in range(per_group)]
    dag = Dag.objects.create(
        dag_id="big",
        task_groups={f"g{g:02}": ids[g * per_group : (g + 1) * per_group] for g in range(groups)},
    )
    made = Task.objects.bulk_create([Task(dag=dag, task_id=t) for t in ids])
    TaskUpstream.objects.bulk_create(
        [TaskUpstream(task=made[i], upstream=made[i - 1]) for i in range(1, len(made))]
    )
    now = timezone.now()
    created = DagRun.objects.bulk_create(
        [
            DagRun(
                dag=dag,
                run_id=f"scheduled__{r:03}",
                run_type=DagRunType.SCHEDULED,
                state="failed" if r % 7 == 0 else "success",
                logical_date=now - timedelta(days=runs - r),
                run_after=now - timedelta(days=runs - r),
                start_date=now - timedelta(days=runs - r),
                end_date=now - timedelta(days=runs - r) + timedelta(minutes=5 + r % 13),
            )
            for r in range(runs)
        ]
    )
    states = [TIState.SUCCESS] * 6 + [TIState.FAILED, TIState.SKIPPED, TIState.UPSTREAM_FAILED]
    for run_index, run in enumerate(created):
        start = run.start_date
        TaskInstance.objects.bulk_create(
            [
                TaskInstance(
                    dag_run=run,
                    dag_id=dag.dag_id,
                    run_id=run.run_id,
                    task_id=task_id,
                    state=states[(run_index + t) % len(states)],
                    try_number=1,
                    start_date=start,
                    end_date=start + timedelta(seconds=1 + (t * 7 + run_index) % 60),
                )
                for t, task_id in enumerate(ids)
            ],
            batch_size=5000,
        )
    return dag, created[-1]


def main() -> None:
    args = h.parse_args(__doc__)
    h.record_machine_start()
    url = h.fresh_database(NAME)
    h.setup_django(url)
    from django.contrib.auth import get_user_model
    from django.core.cache import cache
    from django.test import Client
    from django.test.utils import setup_test_environment
    from django.urls import reverse

    from tests.admin.test_console import LINEAGE, grid_data, lineage_data

    setup_test_environment()  # lets the test client's host through ALLOWED_HOSTS
    rounds = args.rounds or (3 if args.quick else 10)
    lineage_data(300)
    dag = grid_data(25, 50)
    grid = reverse("admin:assets_app_dag_grid", args=[dag.pk])
    user = get_user_model().objects.create_superuser(username="bench", password="bench-pw")
    client = Client()
    client.force_login(user)

    def get(path: str) -> float:
        with h.Stopwatch() as watch:
            response = client.get(path)
        if response.status_code != 200:
            raise SystemExit(f"{path}: HTTP {response.status_code}")
        return watch.seconds * 1000.0

    get(LINEAGE)
    get(grid)
    cold, cached, grid_ms = [], [], []
    for _ in range(rounds):
        cache.clear()
        cold.append(get(LINEAGE))
        cached.append(get(LINEAGE))
        grid_ms.append(get(grid))

    # Issue 45: 1,000 tasks x 100 runs.
    big, last_run = big_dag()
    page = reverse("admin:assets_app_dag_change", args=[big.pk])
    opened = f"{page}?open=g10"
    run_page = reverse("admin:assets_app_dagrun_change", args=[last_run.pk])
    big_grid = reverse("admin:assets_app_dag_grid", args=[big.pk]) + "?runs=100"
    for path in (page, opened, run_page, big_grid):
        get(path)
    big_rows: dict[str, list[float]] = {
        "dag_page_graph_1000_cold_ms": [],
        "dag_page_graph_1000_cached_ms": [],
        "dag_page_graph_1000_group_open_ms": [],
        "run_page_graph_1000_ms": [],
        "grid_1000x100_ms": [],
    }
    for _ in range(rounds):
        cache.clear()
        big_rows["dag_page_graph_1000_cold_ms"].append(get(page))
        big_rows["dag_page_graph_1000_cached_ms"].append(get(page))
        big_rows["dag_page_graph_1000_group_open_ms"].append(get(opened))
        big_rows["run_page_graph_1000_ms"].append(get(run_page))
        big_rows["grid_1000x100_ms"].append(get(big_grid))

    results = {
        "lineage_300_cold_ms": h.stats(cold),
        "lineage_300_cached_ms": h.stats(cached),
        "grid_25x50_ms": h.stats(grid_ms),
    }
    big_results = {name: h.stats(values) for name, values in big_rows.items()}
    h.print_table(
        f"console render ({rounds} rounds, in-process test client; target < {TARGET_MS:.0f} ms, "
        f"issue 45's 1,000 x 100 rows < {BIG_TARGET_MS:.0f} ms)",
        ["page", "median ms", "p90 ms", "max ms", "target met"],
        [
            [name, r["median"], r["p90"], r["max"], "yes" if r["median"] < target else "NO"]
            for rows, target in ((results, TARGET_MS), (big_results, BIG_TARGET_MS))
            for name, r in rows.items()
        ],
    )
    h.write_results(
        NAME,
        {
            "target_ms": TARGET_MS,
            "big_target_ms": BIG_TARGET_MS,
            "rounds": rounds,
            **results,
            **big_results,
        },
        args,
    )


if __name__ == "__main__":
    main()
