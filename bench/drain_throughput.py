"""Drain throughput: events registered per second by one drain, by batch size and fan-out.

Each outbox row declares OUTLETS assets (one event each); every asset is scheduled on by
`fan-out` Dags, so each event also writes `fan-out` ADRQ rows. The target Dags are paused, so the
scheduler the drain runs after each batch finds nothing to do and the figure is registration
alone. For comparison the same batch shape is inserted with plain SQL (unnest INSERTs of the
events and ADRQ rows, one transaction per batch, no Django): the raw PostgreSQL ceiling.

Target (issue 6): at least 5,000 events/s at batch 500, fan-out 4, on 2 cores.
"""

from __future__ import annotations

import time
import uuid

import _harness as h

NAME = "drain_throughput"
OUTLETS = 10
BATCHES = (1, 50, 500)
FANOUTS = (1, 4, 8)
TARGET = 5000.0


def main() -> None:
    args = h.parse_args(__doc__)
    h.record_machine_start()
    url = h.fresh_database(NAME)
    h.setup_django(url)
    import _fixtures as fx
    from django.db import connection

    from assets_app.models import AssetDagRunQueue, AssetEvent, AssetEventQueue
    from assets_app.outbox import drain

    rounds = args.rounds or (1 if args.quick else 3)
    warmup = 0 if args.quick else 1
    events_per_round = (
        {1: 200, 50: 1000, 500: 2000} if args.quick else {1: 2000, 50: 10000, 500: 20000}
    )

    asset_sets = {}
    for fanout in FANOUTS:
        assets = fx.make_assets(OUTLETS, prefix=f"f{fanout}")
        fx.make_scheduled_dags(assets, count=fanout, prefix=f"f{fanout}_dag", paused=True)
        asset_sets[fanout] = assets

    def one(batch: int, fanout: int) -> dict[str, float]:
        rows = events_per_round[batch] // OUTLETS
        events = fx.fill_outbox(
            rows=rows,
            outlets=asset_sets[fanout],
            prefix=f"b{batch}f{fanout}x{uuid.uuid4().hex[:6]}",
        )
        before_events = AssetEvent.objects.count()
        before_adrq = AssetDagRunQueue.objects.count()
        connection.close()  # start each round on a fresh connection, like a new task would
        with h.Stopwatch() as watch:
            drain.drain(batch_size=batch, time_budget=3600)
        written = AssetEvent.objects.count() - before_events
        queued = AssetDagRunQueue.objects.count() - before_adrq
        left = AssetEventQueue.objects.count()
        if written != events or queued != events * fanout or left:
            raise SystemExit(
                f"drain did not register everything: events {written}/{events}, "
                f"ADRQ {queued}/{events * fanout}, outbox rows left {left}"
            )
        return {"events": events, "seconds": watch.seconds, "events_per_s": events / watch.seconds}

    results = []
    for fanout in FANOUTS:
        for batch in BATCHES:
            runs = h.run_rounds(
                lambda _i, b=batch, f=fanout: one(b, f), warmup=warmup, rounds=rounds
            )
            rate = h.stats(r["events_per_s"] for r in runs)
            results.append({"batch": batch, "fanout": fanout, "rounds": runs, "events_per_s": rate})
            print(
                f"  batch {batch:>3} fan-out {fanout}: {rate['median']:,.0f} events/s", flush=True
            )

    raw = [raw_insert_rate(url, batch=500, fanout=f, events=events_per_round[500]) for f in FANOUTS]

    h.print_table(
        f"drain throughput, events/s ({OUTLETS} outlets per outbox row, {rounds} rounds)",
        ["batch", "fan-out", "median", "min", "max"],
        [
            [
                r["batch"],
                r["fanout"],
                r["events_per_s"]["median"],
                r["events_per_s"]["min"],
                r["events_per_s"]["max"],
            ]
            for r in results
        ],
    )
    h.print_table(
        "raw PostgreSQL insert rate, same batch shape (events + ADRQ rows, no Django)",
        ["batch", "fan-out", "events/s"],
        [[500, r["fanout"], r["events_per_s"]] for r in raw],
    )
    target_row = next(r for r in results if r["batch"] == 500 and r["fanout"] == 4)
    verdict = target_row["events_per_s"]["median"] >= TARGET
    print(
        f"target: >= {TARGET:,.0f} events/s at batch 500, fan-out 4: "
        f"{target_row['events_per_s']['median']:,.0f} -> {'MET' if verdict else 'MISSED'}\n"
    )
    h.write_results(
        NAME,
        {
            "outlets_per_row": OUTLETS,
            "target": {"events_per_s_at_batch_500_fanout_4": TARGET, "met": verdict},
            "results": results,
            "raw_postgresql": raw,
        },
        args,
    )
    h.plot_lines(
        NAME,
        args,
        title="Drain throughput (one drain process)",
        xlabel="batch size (outbox rows per transaction)",
        ylabel="events registered / s",
        series={
            f"fan-out {f}": (
                [r["batch"] for r in results if r["fanout"] == f],
                [r["events_per_s"]["median"] for r in results if r["fanout"] == f],
            )
            for f in FANOUTS
        },
        target=TARGET,
        logx=True,
    )
    if not args.keep_db:
        connection.close()
        h.drop_database(NAME)


def raw_insert_rate(url: str, *, batch: int, fanout: int, events: int) -> dict[str, float]:
    """Insert `events` events (and fan-out ADRQ rows each) in transactions of `batch` rows x
    OUTLETS events with two unnest INSERTs, as fast as psycopg allows; return events/s."""
    import psycopg

    with psycopg.connect(url) as conn:
        asset_ids = [
            r[0]
            for r in conn.execute(
                "SELECT id FROM assets_app_asset WHERE name LIKE %s ORDER BY id", [f"f{fanout}-%"]
            )
        ]
        dag_ids = [
            r[0]
            for r in conn.execute(
                "SELECT dag_id FROM assets_app_dag WHERE dag_id LIKE %s ORDER BY dag_id",
                [f"f{fanout}\\_dag\\_%"],
            )
        ]
        conn.commit()
        per_txn = batch * OUTLETS
        done = 0
        started = time.perf_counter()
        while done < events:
            n = min(per_txn, events - done)
            ti_ids = [uuid.uuid4() for _ in range(n // OUTLETS + 1)]
            assets = [asset_ids[i % OUTLETS] for i in range(n)]
            tis = [ti_ids[i // OUTLETS] for i in range(n)]
            ids = [
                r[0]
                for r in conn.execute(
                    "INSERT INTO assets_app_assetevent (asset_id, extra, timestamp, source_dag_id, "
                    "source_run_id, source_task_id, source_map_index, source_ti_id, "
                    "source_try_number, source_ordinal) SELECT u.a, '{}'::jsonb, now(), 'raw', "
                    "'raw', 'raw', -1, u.t, 1, 0 FROM unnest(%s::bigint[], %s::uuid[]) AS u(a, t) "
                    "RETURNING id",
                    [assets, tis],
                )
            ]
            rows = sorted((d, e, a) for d in dag_ids for e, a in zip(ids, assets, strict=True))
            conn.execute(
                "INSERT INTO assets_app_assetdagrunqueue (target_dag_id, asset_event_id, "
                "asset_id, created_at) SELECT u.d, u.e, u.a, now() FROM "
                "unnest(%s::text[], %s::bigint[], %s::bigint[]) AS u(d, e, a)",
                [[r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]],
            )
            conn.commit()
            done += n
        seconds = time.perf_counter() - started
    return {
        "batch": batch,
        "fanout": fanout,
        "events": events,
        "seconds": seconds,
        "events_per_s": events / seconds,
    }


if __name__ == "__main__":
    main()
