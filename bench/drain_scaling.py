"""Drain scaling: throughput with 1, 2 and 4 drain processes working one outbox at once.

The outbox is pre-filled (OUTLETS outlets per row, fan-out 4, target Dags paused so only
registration is measured); the drain processes start together (each set up Django first and
waits for a "go" line) and run `drain.drain(batch_size=500)` until the queue is empty.
Throughput = events registered / (last drain end - first drain start). Claims use SKIP LOCKED, so
adding drains must not lower it; on 2 cores it cannot rise much either.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import _harness as h

NAME = "drain_scaling"
OUTLETS = 10
FANOUT = 4
BATCH = 500
PROCESSES = (1, 2, 4)


def child(url: str) -> None:
    """One drain process: set up, say ready, wait for go, drain, print timings as JSON."""
    h.setup_django(url)
    from django.db import connection

    from assets_app.outbox import drain

    connection.ensure_connection()
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.time()
    result = drain.drain(batch_size=BATCH, time_budget=3600)
    end = time.time()
    print(
        json.dumps(
            {
                "start": start,
                "end": end,
                "claimed": result.claimed,
                "events": result.events_written,
                "batches": result.batches,
            }
        ),
        flush=True,
    )


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return
    args = h.parse_args(__doc__)
    h.record_machine_start()
    url = h.fresh_database(NAME)
    h.setup_django(url)
    import _fixtures as fx
    from django.db import connection

    from assets_app.models import AssetEvent, AssetEventQueue

    events_per_round = 5000 if args.quick else 30000
    warmup = 0 if args.quick else 1
    rounds = args.rounds or (1 if args.quick else 3)
    assets = fx.make_assets(OUTLETS, prefix="a")
    fx.make_scheduled_dags(assets, count=FANOUT, prefix="target", paused=True)
    connection.close()

    def one(processes: int) -> dict[str, float]:
        fx.fill_outbox(rows=events_per_round // OUTLETS, outlets=assets, prefix=f"p{time.time()}")
        before = AssetEvent.objects.count()
        connection.close()
        children = [
            subprocess.Popen(
                [h.PYTHON, __file__, "--child", url],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(processes)
        ]
        for proc in children:
            if proc.stdout.readline().strip() != "ready":
                raise SystemExit("a drain process failed to start")
        for proc in children:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        reports = []
        for proc in children:
            out, _ = proc.communicate(timeout=600)
            reports.append(json.loads(out.strip().splitlines()[-1]))
        written = AssetEvent.objects.count() - before
        left = AssetEventQueue.objects.count()
        if written != events_per_round or left:
            raise SystemExit(f"registered {written}/{events_per_round}, {left} rows left")
        wall = max(r["end"] for r in reports) - min(r["start"] for r in reports)
        return {
            "processes": processes,
            "events": written,
            "seconds": wall,
            "events_per_s": written / wall,
            "per_process_claimed": [r["claimed"] for r in reports],
        }

    results = []
    for processes in PROCESSES:
        runs = h.run_rounds(lambda _i, p=processes: one(p), warmup=warmup, rounds=rounds)
        rate = h.stats(r["events_per_s"] for r in runs)
        results.append({"processes": processes, "rounds": runs, "events_per_s": rate})
        print(f"  {processes} drain(s): {rate['median']:,.0f} events/s", flush=True)

    base = results[0]["events_per_s"]["median"]
    no_drop = all(r["events_per_s"]["median"] >= 0.9 * base for r in results)
    h.print_table(
        f"drain scaling, events/s (batch {BATCH}, {OUTLETS} outlets/row, fan-out {FANOUT}, "
        f"{events_per_round:,} events/round, {rounds} rounds)",
        ["drains", "median", "min", "max", "vs 1 drain"],
        [
            [
                r["processes"],
                r["events_per_s"]["median"],
                r["events_per_s"]["min"],
                r["events_per_s"]["max"],
                f"{r['events_per_s']['median'] / base:.2f}x",
            ]
            for r in results
        ],
    )
    print(
        f"target: no drop as drains are added (>= 0.9x of 1 drain): "
        f"{'MET' if no_drop else 'MISSED'}\n"
    )
    h.write_results(
        NAME,
        {
            "outlets_per_row": OUTLETS,
            "fanout": FANOUT,
            "batch": BATCH,
            "events_per_round": events_per_round,
            "target": {"no_drop_vs_one_drain": True, "tolerance": 0.9, "met": no_drop},
            "results": results,
        },
        args,
    )
    h.plot_lines(
        NAME,
        args,
        title="Drain scaling: concurrent drain processes (SKIP LOCKED)",
        xlabel="drain processes",
        ylabel="events registered / s",
        series={
            "events/s": (
                [r["processes"] for r in results],
                [r["events_per_s"]["median"] for r in results],
            )
        },
    )
    if not args.keep_db:
        connection.close()
        h.drop_database(NAME)


if __name__ == "__main__":
    main()
