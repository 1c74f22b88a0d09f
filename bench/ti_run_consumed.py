"""ti_run vs consumed events: lock hold, statements and latency of starting a TI.

A real gunicorn (1 sync worker, lock meter on) serves `PATCH /execution/task-instances/{id}/run`
for queued TIs of an asset-triggered run that consumed K events (K = 1, 100, 1,000, 5,000); the
response carries the run context with all K events.

Targets (issue 6): lock hold at most 2 ms and flat, statements per request constant, latency
under 200 ms at 5,000 events. Airflow 3.3.2 on a machine like ours: 2.3 s at 5,000, the lock
held for all of it, 5,016 statements.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime

import _harness as h

NAME = "ti_run_consumed"
CONSUMED = (1, 100, 1000, 5000)
TARGET_HOLD_MS = 2.0
TARGET_LATENCY_MS = 200.0
AIRFLOW = {"latency_ms_at_5000": 2300.0, "statements_at_5000": 5016}


def main() -> None:
    args = h.parse_args(__doc__)
    h.record_machine_start()
    url = h.fresh_database(NAME)
    h.setup_django(url)
    import _fixtures as fx
    import requests
    from django.db import connection

    from assets_app.api.auth import issue_token
    from assets_app.models import DagRun, DagRunType, TIState

    warmup, rounds = (1, 5) if args.quick else (3, 20)
    rounds = args.rounds or rounds
    assets = fx.make_assets(50, prefix="src")
    tis = {}
    for k in CONSUMED:
        dag = fx.make_scheduled_dags(assets, count=1, prefix=f"consumer_k{k}")[0]
        run = DagRun.objects.create(
            dag=dag, run_id=f"asset_triggered__k{k}", run_type=DagRunType.ASSET_TRIGGERED
        )
        event_ids = fx.make_events(assets, per_asset=-(-k // len(assets)))[:k]
        fx.link_consumed(run=run, event_ids=event_ids)
        tis[k] = fx.make_tis(run=run, count=warmup + rounds, state=TIState.QUEUED)
    connection.close()

    meter_file = h.log_path(NAME, "lockmeter")
    meter_file.unlink(missing_ok=True)
    server, base = h.start_gunicorn(
        url, workers=1, log=h.log_path(NAME, "gunicorn"), BENCH_LOCKMETER_FILE=str(meter_file)
    )
    latency = {}
    sizes = {}
    try:
        with requests.Session() as http:
            for k in CONSUMED:
                for ti in tis[k]:
                    body = {
                        "state": "running",
                        "hostname": "bench-worker",
                        "unixname": "bench",
                        "pid": os.getpid(),
                        "start_date": datetime.now(UTC).isoformat(),
                    }
                    with h.Stopwatch() as watch:
                        response = http.patch(
                            f"{base}/execution/task-instances/{ti.id}/run",
                            json=body,
                            headers={
                                "Authorization": "Bearer "
                                + issue_token(ti.id, try_number=ti.try_number)
                            },
                            timeout=120,
                        )
                    consumed = len(response.json()["dag_run"]["consumed_asset_events"])
                    if response.status_code != 200 or consumed != k:
                        raise SystemExit(
                            f"k={k}: HTTP {response.status_code}, {consumed} events: "
                            f"{response.text[:300]}"
                        )
                    latency[str(ti.id)] = watch.seconds * 1000.0
                    sizes[k] = len(response.content)
    finally:
        server.stop()

    by_ti = {}
    for line in meter_file.read_text().splitlines():
        record = json.loads(line)
        if record["path"].endswith("/run"):
            by_ti[record["path"].split("/")[-2]] = record
    results = []
    for k in CONSUMED:
        measured = tis[k][warmup:]
        rows = [by_ti[str(ti.id)] for ti in measured]
        locks = [r["locks"][0] for r in rows]
        results.append(
            {
                "consumed_events": k,
                "response_bytes": sizes[k],
                "hold_ms": h.stats(lock["hold_ms"] for lock in locks),
                "commit_ms": h.stats(lock["commit_ms"] for lock in locks),
                "statements_under_lock": h.stats(lock["statements_under_lock"] for lock in locks),
                "statements_per_request": h.stats(r["statements"] for r in rows),
                "server_ms": h.stats(r["server_ms"] for r in rows),
                "latency_ms": h.stats(latency[str(ti.id)] for ti in measured),
            }
        )

    h.print_table(
        f"ti_run vs consumed events ({rounds} requests per K after {warmup} warm-up; "
        "1 gunicorn sync worker)",
        [
            "consumed",
            "hold med ms",
            "min",
            "max",
            "of it COMMIT",
            "stmts@lock",
            "stmts/req",
            "latency med ms",
            "p90",
            "max",
            "resp KB",
        ],
        [
            [
                r["consumed_events"],
                r["hold_ms"]["median"],
                r["hold_ms"]["min"],
                r["hold_ms"]["max"],
                r["commit_ms"]["median"],
                r["statements_under_lock"]["median"],
                r["statements_per_request"]["median"],
                r["latency_ms"]["median"],
                r["latency_ms"]["p90"],
                r["latency_ms"]["max"],
                r["response_bytes"] / 1024,
            ]
            for r in results
        ],
    )
    holds = [r["hold_ms"]["median"] for r in results]
    statements = {r["statements_per_request"]["median"] for r in results}
    at_5000 = results[-1]["latency_ms"]["median"]
    hold_ok = max(holds) <= TARGET_HOLD_MS
    flat_ok = holds[-1] / holds[0] <= 1.5
    statements_ok = len(statements) == 1
    latency_ok = at_5000 < TARGET_LATENCY_MS
    print(
        f"targets: hold <= {TARGET_HOLD_MS} ms: max {max(holds):.3f} -> "
        f"{'MET' if hold_ok else 'MISSED'}; flat (5000/1 <= 1.5): {holds[-1] / holds[0]:.2f} -> "
        f"{'MET' if flat_ok else 'MISSED'}; statements constant: {sorted(statements)} -> "
        f"{'MET' if statements_ok else 'MISSED'}; latency at 5,000 < {TARGET_LATENCY_MS:g} ms: "
        f"{at_5000:.0f} -> {'MET' if latency_ok else 'MISSED'}\n"
    )
    h.write_results(
        NAME,
        {
            "warmup": warmup,
            "rounds": rounds,
            "server": "gunicorn, 1 sync worker, lock meter in-process (bench/lockmeter.py)",
            "target": {
                "hold_ms_max": TARGET_HOLD_MS,
                "latency_ms_at_5000": TARGET_LATENCY_MS,
                "hold_met": hold_ok,
                "flat_met": flat_ok,
                "statements_constant_met": statements_ok,
                "latency_met": latency_ok,
            },
            "airflow_3_3_2": AIRFLOW,
            "results": results,
        },
        args,
    )
    h.plot_lines(
        NAME,
        args,
        title="ti_run: latency and lock hold vs consumed events (median)",
        xlabel="consumed events",
        ylabel="ms",
        series={
            "request latency": (list(CONSUMED), [r["latency_ms"]["median"] for r in results]),
            "TI lock hold": (list(CONSUMED), holds),
            "Airflow 3.3.2 latency (= hold)": ([5000], [AIRFLOW["latency_ms_at_5000"]]),
        },
        target=TARGET_LATENCY_MS,
        logx=True,
        logy=True,
    )
    if not args.keep_db:
        h.drop_database(NAME)


if __name__ == "__main__":
    main()
