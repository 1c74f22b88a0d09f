"""Cost of a TI finish (success) vs the size of its run: 1 / 100 / 1,000 tasks.

Each run is of a chain Dag of N tasks (t0 >> t1 >> ... ), its upstream already succeeded. Two
finishes: the middle TI (its finish evaluates its one downstream TI and queues it, the run's N
TIs in the table; not for N = 1) and the last one (nothing downstream: the run finishes).
`task_state.success.succeed` is called in-process (queue mode, the worker API's code path) and
measured from the call to its return: latency, every statement it runs, and the statements
after the TI's commit (the downstream evaluation and, when nothing was queued, the run-finish
check).

Target (issue 10): statements identical per position and latency flat (median at 1,000 over
the median of the smallest run of that position at most 1.5).
"""

from __future__ import annotations

import json
import time

import _harness as h

NAME = "ti_finish"
SIZES = (1, 100, 1000)
TARGET_FLATNESS = 1.5


POSITIONS = ("middle", "last")


def _prepare(dag_id: str, k: int, count: int) -> list:
    """`count` runs with t0..t(k-1) succeeded and t(k) running; their t(k) (id, try number)."""
    from django.utils import timezone

    from assets_app.models import TaskInstance, TIState
    from assets_app.scheduling import runs

    prepared = []
    before = [f"t{i:04d}" for i in range(k)]
    for _ in range(count):
        run = runs.trigger_dag(dag_id=dag_id)
        TaskInstance.objects.filter(dag_run=run, task_id__in=before).update(
            state=TIState.SUCCESS, end_date=timezone.now()
        )
        ti = TaskInstance.objects.get(dag_run=run, task_id=f"t{k:04d}")
        TaskInstance.objects.filter(id=ti.id).update(
            state=TIState.RUNNING, hostname="bench", pid=1, start_date=timezone.now()
        )
        prepared.append((ti.id, ti.try_number))
    return prepared


def _finish(ti: tuple) -> dict:
    """One `task_state.success.succeed`, timed, with its statements logged."""
    from django.db import connection
    from django.utils import timezone

    from assets_app.task_state import success

    log: list[tuple[str, bool]] = []

    def wrapper(execute, sql, params, many, context):
        log.append((sql, context["connection"].in_atomic_block))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        started = time.perf_counter()
        ti_id, try_number = ti
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
    return {
        "ms": seconds * 1000,
        "statements": len(log),
        "after_commit": len(after),
        "evaluation": sum(1 for sql in after if sql.lstrip().startswith("WITH")),
    }


def main() -> None:
    args = h.parse_args(__doc__)
    h.record_machine_start()
    url = h.fresh_database(NAME)
    h.setup_django(url)
    from django.db import connection

    from assets_app.definitions import sync as definitions

    warmup, rounds = (2, 8) if args.quick else (5, 40)
    rounds = args.rounds or rounds
    prepared: dict[tuple[int, str], list] = {}
    for n in SIZES:
        dag_id = f"chain_{n}"
        dag = {
            "dag_id": dag_id,
            "is_paused": False,  # a sync pauses a new Dag unless it says so (issue 39)
            "tasks": [
                {"task_id": f"t{i:04d}", **({"upstream": [f"t{i - 1:04d}"]} if i else {})}
                for i in range(n)
            ],
        }
        definitions.sync_definitions(dags=definitions.parse_text(json.dumps(dag), file=dag_id))
        for position in POSITIONS:
            if n == 1 and position == "middle":
                continue  # the only task is the last one
            k = n // 2 if position == "middle" else n - 1
            prepared[(n, position)] = _prepare(dag_id, k, warmup + rounds)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # as autovacuum would have, on tables this size
    # Interleaved: round i finishes one TI of every case, so a change in the machine's load
    # (it is shared) weighs on every size alike.
    samples: dict[tuple[int, str], list[dict]] = {case: [] for case in prepared}
    for i in range(warmup + rounds):
        for case, ti_ids in prepared.items():
            sample = _finish(ti_ids.pop())
            if i >= warmup:
                samples[case].append(sample)
    results = {
        case: {
            "latency_ms": h.stats(s["ms"] for s in got),
            "statements": sorted({s["statements"] for s in got}),
            "after_commit": sorted({s["after_commit"] for s in got}),
            "evaluation": sorted({s["evaluation"] for s in got}),
        }
        for case, got in samples.items()
    }
    rows = []
    for (n, position), r in results.items():
        base = results[(SIZES[0], "last")] if position == "last" else results[(SIZES[1], position)]
        rows.append(
            (
                n,
                position,
                r["latency_ms"]["median"],
                r["latency_ms"]["p90"],
                r["latency_ms"]["median"] / base["latency_ms"]["median"],
                "/".join(map(str, r["statements"])),
                "/".join(map(str, r["after_commit"])),
                "/".join(map(str, r["evaluation"])),
            )
        )
    h.print_table(
        f"TI finish (success) in a chain Dag vs run size, {rounds} rounds",
        [
            "tasks",
            "finished TI",
            "median ms",
            "p90 ms",
            "x smallest",
            "statements",
            "after commit",
            "eval",
        ],
        rows,
    )
    flatness = max(row[4] for row in rows)
    same_statements = all(
        len({tuple(r["statements"]) for (n, p), r in results.items() if p == position}) == 1
        for position in POSITIONS
    )
    ok = flatness <= TARGET_FLATNESS and same_statements
    print(
        f"flatness {flatness:.2f} (target <= {TARGET_FLATNESS}); statements identical per "
        f"position: {same_statements} -> {'MET' if ok else 'NOT MET'}"
    )
    h.write_results(
        NAME,
        {
            "cases": {f"{n}:{p}": r for (n, p), r in results.items()},
            "flatness": flatness,
            "target_flatness": TARGET_FLATNESS,
            "same_statements": same_statements,
            "met": ok,
        },
        args,
    )
    if not args.keep_db:
        connection.close()
        h.drop_database(NAME)


if __name__ == "__main__":
    main()
