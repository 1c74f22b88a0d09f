"""Operator console render time: the lineage graph at 300 Dags and the runs grid at 25 x 50.

In-process (Django's test client, a logged-in superuser) on a fresh benchmark database holding
the suite's own console data (`tests/admin/test_console.py`: `lineage_data`, `grid_data`), so
the figures are for the pages the query-count pins cover. Each round of the graph renders it
once with the layout cache emptied ("cold": layout computed) and once more ("cached"); the grid
has no layout cache. The first request of the process (URL conf import, template loading) is a
warm-up and not counted.

Target (issue 12): each page renders in under 500 ms on the suite's data.
"""

from __future__ import annotations

import _harness as h

NAME = "console_render"
TARGET_MS = 500.0


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

    results = {
        "lineage_300_cold_ms": h.stats(cold),
        "lineage_300_cached_ms": h.stats(cached),
        "grid_25x50_ms": h.stats(grid_ms),
    }
    h.print_table(
        f"console render ({rounds} rounds, in-process test client; target < {TARGET_MS:.0f} ms)",
        ["page", "median ms", "p90 ms", "max ms", "target met"],
        [
            [name, r["median"], r["p90"], r["max"], "yes" if r["median"] < TARGET_MS else "NO"]
            for name, r in results.items()
        ],
    )
    h.write_results(NAME, {"target_ms": TARGET_MS, "rounds": rounds, **results}, args)


if __name__ == "__main__":
    main()
