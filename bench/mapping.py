"""Cost of expanding a mapped task (issue 25): the success of the upstream whose return value a
task maps over, for 1 / 10 / 100 / 1,000 values.

Each run is of `list_files >> each (expand over list_files' return value) >> sum`, with
`list_files` running and its return value pushed (`xcoms.push` with the `mapped_length` the
Task SDK sends). `task_state.success.succeed` is called in-process (the worker API's code path)
and measured from the call to its return: latency, every statement it runs, and the statements
after the TI's commit (the downstream evaluation, which expands `each` into its N map indexes
in the same statement on PostgreSQL). Afterwards every run must hold N queued TIs of `each`.

Target (issue 25): statements identical for every N (the expansion is constant in N).
"""

from __future__ import annotations

import json
import time

import _harness as h

NAME = "mapping"
SIZES = (1, 10, 100, 1000)


def _prepare(dag_id: str, n: int, count: int) -> list:
    """`count` runs with `list_files` running and its return value of `n` items pushed."""
    from django.utils import timezone

    from assets_app.models import TaskInstance, TIState
    from assets_app.runtime import xcoms
    from assets_app.scheduling import runs

    prepared = []
    for _ in range(count):
        run = runs.trigger_dag(dag_id=dag_id)
        ti = TaskInstance.objects.get(dag_run=run, task_id="list_files")
        TaskInstance.objects.filter(id=ti.id).update(
            state=TIState.RUNNING, hostname="bench", pid=1, start_date=timezone.now()
        )
        xcoms.push(
            dag_id=dag_id,
            run_id=run.run_id,
            task_id="list_files",
            key="return_value",
            value=[f"s3://bucket/part-{i:04d}" for i in range(n)],
            mapped_length=n,
        )
        prepared.append((run.pk, ti.id, ti.try_number))
    return prepared


def _finish(prepared: tuple) -> dict:
    from django.db import connection
    from django.utils import timezone

    from assets_app.task_state import success

    log: list[tuple[str, bool]] = []

    def wrapper(execute, sql, params, many, context):
        log.append((sql, context["connection"].in_atomic_block))
        return execute(sql, params, many, context)

    _, ti_id, try_number = prepared
    with connection.execute_wrapper(wrapper):
        started = time.perf_counter()
        success.succeed(
            ti_id=ti_id,
            try_number=try_number,
            end_date=timezone.now(),
            task_outlets=[],
            outlet_events=[],
        )
        seconds = time.perf_counter() - started
    last_in_txn = max(i for i, (_, in_txn) in enumerate(log) if in_txn)
    after = [sql for sql, _ in log[last_in_txn + 1 :]]
    return {"ms": seconds * 1000, "statements": len(log), "after_commit": len(after)}


def main() -> None:
    args = h.parse_args(__doc__)
    h.record_machine_start()
    url = h.fresh_database(NAME)
    h.setup_django(url)
    from django.db import connection

    from assets_app.definitions import sync as definitions
    from assets_app.models import TaskInstance, TIState

    warmup, rounds = (1, 4) if args.quick else (3, 20)
    rounds = args.rounds or rounds
    prepared: dict[int, list] = {}
    for n in SIZES:
        dag_id = f"fan_out_{n}"
        dag = {
            "dag_id": dag_id,
            "is_paused": False,  # a sync pauses a new Dag unless it says so (issue 39)
            "tasks": [
                {"task_id": "list_files"},
                {
                    "task_id": "each",
                    "upstream": ["list_files"],
                    "expand": {"path": {"xcom": "list_files"}},
                },
                {"task_id": "sum", "upstream": ["each"]},
            ],
        }
        definitions.sync_definitions(dags=definitions.parse_text(json.dumps(dag), file=dag_id))
        prepared[n] = _prepare(dag_id, n, warmup + rounds)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    samples: dict[int, list[dict]] = {n: [] for n in SIZES}
    finished: dict[int, list] = {n: [] for n in SIZES}
    # Interleaved, so a change in the shared machine's load weighs on every size alike.
    for i in range(warmup + rounds):
        for n in SIZES:
            item = prepared[n].pop()
            sample = _finish(item)
            finished[n].append(item[0])
            if i >= warmup:
                samples[n].append(sample)
    expanded = {
        n: all(
            sorted(
                TaskInstance.objects.filter(dag_run_id=run_pk, task_id="each").values_list(
                    "map_index", "state"
                )
            )
            == [(i, TIState.QUEUED) for i in range(n)]
            for run_pk in finished[n]
        )
        for n in SIZES
    }
    results = {
        n: {
            "latency_ms": h.stats(s["ms"] for s in got),
            "statements": sorted({s["statements"] for s in got}),
            "after_commit": sorted({s["after_commit"] for s in got}),
            "expanded": expanded[n],
        }
        for n, got in samples.items()
    }
    rows = [
        (
            n,
            r["latency_ms"]["median"],
            r["latency_ms"]["p90"],
            "/".join(map(str, r["statements"])),
            "/".join(map(str, r["after_commit"])),
            r["expanded"],
        )
        for n, r in results.items()
    ]
    h.print_table(
        f"Upstream success expanding a mapped task over N values, {rounds} rounds",
        ["N", "median ms", "p90 ms", "statements", "after commit", "N queued TIs"],
        rows,
    )
    same = len({tuple(r["statements"]) for r in results.values()}) == 1
    ok = same and all(expanded.values())
    print(f"statements identical for every N: {same} -> {'MET' if ok else 'NOT MET'}")
    h.write_results(
        NAME,
        {"cases": {str(n): r for n, r in results.items()}, "same_statements": same, "met": ok},
        args,
    )
    if not args.keep_db:
        connection.close()
        h.drop_database(NAME)


if __name__ == "__main__":
    main()
