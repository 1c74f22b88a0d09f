"""Scheduler: asset-triggered runs created per second over many Dags with waiting events.

DAGS Dags, each scheduled on one of ASSETS assets (DAGS / ASSETS Dags per asset); each round
registers EVENTS_PER_ASSET events per asset with their ADRQ rows (set-up), then times one
`scheduling.schedule_dags()` pass, which must create exactly one run (with its TI) per Dag. Runs
are marked finished between rounds so `max_active_runs` never gets in the way.

Target (issue 6): at least 200 runs/s. The client CPU per run (this process's CPU time over the
pass) is shown beside it: on a shared machine it varies much less than the wall time.
"""

from __future__ import annotations

import time

import _harness as h

NAME = "scheduler"
ASSETS = 100
EVENTS_PER_ASSET = 3
TARGET = 200.0


def main() -> None:
    args = h.parse_args(__doc__)
    h.record_machine_start()
    url = h.fresh_database(NAME)
    h.setup_django(url)
    import _fixtures as fx
    from django.db import connection

    from assets_app.models import AssetEvent, DagRun, DagRunState
    from assets_app.scheduling import asset_runs as scheduling

    dags_count = 300 if args.quick else 1000
    rounds = args.rounds or (1 if args.quick else 5)
    assets = fx.make_assets(ASSETS, prefix="s")
    per_asset = dags_count // ASSETS
    dags_by_asset = {
        a.id: fx.make_scheduled_dags([a], count=per_asset, prefix=f"sched_{a.id}") for a in assets
    }

    def one(_i: int) -> dict[str, float]:
        DagRun.objects.filter(state=DagRunState.QUEUED).update(state=DagRunState.SUCCESS)
        events = AssetEvent.objects.bulk_create(
            [AssetEvent(asset=a) for a in assets for _ in range(EVENTS_PER_ASSET)]
        )
        for event_asset in assets:
            fx.queue_events_for(
                dags=dags_by_asset[event_asset.id],
                events=[e for e in events if e.asset_id == event_asset.id],
            )
        connection.close()
        cpu = time.process_time()
        with h.Stopwatch() as watch:
            result = scheduling.schedule_dags()
        cpu = time.process_time() - cpu
        created = len(result.run_ids)
        if created != dags_count:
            raise SystemExit(f"expected {dags_count} runs, the scheduler created {created}")
        return {
            "runs": created,
            "seconds": watch.seconds,
            "runs_per_s": created / watch.seconds,
            "client_cpu_ms_per_run": cpu * 1000 / created,
        }

    runs = h.run_rounds(one, warmup=1, rounds=rounds)
    rate = h.stats(r["runs_per_s"] for r in runs)
    met = rate["median"] >= TARGET
    h.print_table(
        f"scheduler: {dags_count} Dags x {EVENTS_PER_ASSET} waiting events, {rounds} rounds",
        ["metric", "median", "min", "max", "target"],
        [
            ["runs/s", rate["median"], rate["min"], rate["max"], f">= {TARGET:g}"],
            [
                "pass seconds",
                *(h.stats(r["seconds"] for r in runs)[k] for k in ("median", "min", "max")),
                "",
            ],
            [
                "client CPU ms per run",
                *(
                    h.stats(r["client_cpu_ms_per_run"] for r in runs)[k]
                    for k in ("median", "min", "max")
                ),
                "",
            ],
        ],
    )
    print(f"target: >= {TARGET:g} runs/s: {rate['median']:,.0f} -> {'MET' if met else 'MISSED'}\n")
    h.write_results(
        NAME,
        {
            "dags": dags_count,
            "events_per_dag": EVENTS_PER_ASSET,
            "target": {"runs_per_s": TARGET, "met": met},
            "rounds": runs,
            "runs_per_s": rate,
        },
        args,
    )
    h.plot_lines(
        NAME,
        args,
        title=f"Scheduler: runs created per second ({dags_count} Dags)",
        xlabel="round",
        ylabel="runs / s",
        series={"runs/s": (list(range(1, len(runs) + 1)), [r["runs_per_s"] for r in runs])},
        target=TARGET,
    )
    if not args.keep_db:
        connection.close()
        h.drop_database(NAME)


if __name__ == "__main__":
    main()
