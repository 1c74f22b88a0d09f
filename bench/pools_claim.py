"""pools_claim: a worker claim's statements and latency with 0, 10 and 100 pools (issue 39).

1,000 queued TIs (10 runs of one Dag with 100 tasks; `--runs 100`: 10,000) whose tasks are
spread over N pools (N = 0: all in `default_pool`), every pool with room for all of them, the
Dag's `max_active_tasks` too; weights differ per task. Each round one `claims.claim_workloads`
(limit 10, the default queue) runs in process against PostgreSQL and its claims are undone
after it, so every round sees the same claimable TIs. `--bundle` claims as a stock worker
does (issue 44: `bundles=["dags-folder"]`, the Dag of that bundle; one more statement, the
worker-seen upsert, which writes at most every 30 s). `--explain` adds the EXPLAIN ANALYZE of
the pool lock and the claim statement (run once more, rolled back) to the JSON. Results go to
bench/results/pools_claim.json (`--runs` other than 10: pools_claim_<TIs>.json; `--label X`
appends _X).

Target: flat: the same statement count whatever N (the pool lock, one claim statement, one
UPDATE, three reads) and a latency that grows neither with the number of pools nor with the
backlog of queued TIs.
"""

from __future__ import annotations

import _harness as h

NAME = "pools_claim"
POOLS = (0, 10, 100)
TASKS = 100
RUNS = 10
LIMIT = 10
BUNDLES: list[str] | None = None  # --bundle: the claim names the Dag's bundle


def main() -> None:
    args = h.parse_args(__doc__, _options)
    h.record_machine_start()
    warmup, rounds = (2, 10) if args.quick else (5, 50)
    rounds = args.rounds or rounds
    url = h.fresh_database(NAME)
    h.setup_django(url)
    runs = args.runs
    global BUNDLES
    BUNDLES = ["dags-folder"] if args.bundle else None
    results = [
        _measure(pools, runs=runs, warmup=warmup, rounds=rounds, explain=args.explain)
        for pools in POOLS
    ]
    if not args.keep_db:
        from django.db import connection

        connection.close()
        h.drop_database(NAME)

    h.print_table(
        f"claim of {LIMIT} among {TASKS * runs} queued TIs vs pools ({rounds} claims after "
        f"{warmup} warm-up; in process)",
        ["pools", "statements", "claimed", "latency med ms", "p90", "max", "claim stmt med ms"],
        [
            [
                r["pools"],
                r["statements"],
                r["claimed"],
                r["latency_ms"]["median"],
                r["latency_ms"]["p90"],
                r["latency_ms"]["max"],
                r["claim_statement_ms"]["median"],
            ]
            for r in results
        ],
    )
    flat = len({r["statements"] for r in results}) == 1
    print(f"statements flat in the number of pools: {flat}")
    name = NAME if runs == RUNS else f"{NAME}_{TASKS * runs}"
    h.write_results(
        f"{name}_{args.label}" if args.label else name,
        {
            "queued_tis": TASKS * runs,
            "limit": LIMIT,
            "rounds": rounds,
            "warmup": warmup,
            "results": results,
            "statements_flat": flat,
        },
        args,
    )


def _options(parser) -> None:
    parser.add_argument("--runs", type=int, default=RUNS, help="runs of 100 queued TIs each")
    parser.add_argument("--explain", action="store_true", help="EXPLAIN ANALYZE into the JSON")
    parser.add_argument("--label", default="", help="suffix of the results file")
    parser.add_argument("--bundle", action="store_true", help="claim naming the Dag's bundle")


def _measure(pools: int, *, runs: int, warmup: int, rounds: int, explain: bool) -> dict:
    import time

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from assets_app.models import Dag, DagRun, Pool, Task, TaskInstance
    from assets_app.task_state import claims

    Dag.objects.all().delete()  # the previous size's Dag, runs, tasks and TIs
    Pool.objects.exclude(name="default_pool").delete()
    names = [f"pool_{i:03d}" for i in range(pools)]
    Pool.objects.bulk_create(Pool(name=name, slots=TASKS * runs) for name in names)
    dag = Dag.objects.create(
        dag_id="bench_pools", max_active_tasks=TASKS * runs, bundle_name="dags-folder"
    )
    Task.objects.bulk_create(
        Task(
            dag=dag,
            task_id=f"t{i:03d}",
            pool=names[i % pools] if pools else "default_pool",
            priority_weight_total=i % 7,
        )
        for i in range(TASKS)
    )
    Pool.objects.filter(name="default_pool").update(slots=TASKS * runs)
    for r in range(runs):
        run = DagRun.objects.create(dag=dag, run_id=f"manual__{r}", run_type="manual")
        TaskInstance.objects.bulk_create(
            TaskInstance(dag_run=run, dag_id=dag.dag_id, run_id=run.run_id, task_id=f"t{i:03d}")
            for i in range(TASKS)
        )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")

    latency, statement_ms, counts, claimed = [], [], set(), set()
    for n in range(warmup + rounds):
        with CaptureQueriesContext(connection) as ctx:
            started = time.perf_counter()
            got = claims.claim_workloads(hostname="bench", limit=LIMIT, bundles=BUNDLES)
            seconds = time.perf_counter() - started
        TaskInstance.objects.filter(id__in=[w.ti.id for w in got]).update(
            claimed_at=None, claimed_by=""
        )
        if n < warmup:
            continue
        latency.append(seconds * 1000.0)
        counts.add(len(ctx.captured_queries))
        claimed.add(len(got))
        statement_ms.append(
            sum(
                float(q["time"]) * 1000.0
                for q in ctx.captured_queries
                if "AS claim_pool_slots" in q["sql"]
            )
        )
    if len(counts) != 1 or claimed != {LIMIT}:
        raise SystemExit(f"pools={pools}: statements {counts}, claimed {claimed}")
    return {
        "pools": pools,
        "statements": counts.pop(),
        "claimed": LIMIT,
        "latency_ms": h.stats(latency),
        "claim_statement_ms": h.stats(statement_ms),
        **({"explain": _explain()} if explain else {}),
    }


def _explain() -> dict[str, list[str]]:
    """EXPLAIN (ANALYZE, BUFFERS) of one more claim's pool lock and claim statements, each
    run again inside a transaction that is rolled back."""
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from assets_app.task_state import claims

    with CaptureQueriesContext(connection) as ctx:
        claims.claim_workloads(hostname="bench", limit=LIMIT, bundles=BUNDLES)
    wanted = {"lock": "FOR NO KEY UPDATE", "claim": "AS claim_pool_slots"}
    plans: dict[str, list[str]] = {}
    with transaction.atomic(), connection.cursor() as cursor:
        for key, marker in wanted.items():
            for n, q in enumerate(x for x in ctx.captured_queries if marker in x["sql"]):
                cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {q['sql']}")
                plans[f"{key}_{n}"] = [row[0] for row in cursor.fetchall()]
        transaction.set_rollback(True)
    from assets_app.models import TaskInstance

    TaskInstance.objects.update(claimed_at=None, claimed_by="")
    return plans


if __name__ == "__main__":
    main()
