"""Stock Airflow Task SDK workers against the service: tasks per second and claim -> running
latency with `bin/airflow-worker --concurrency 1` and `8` (issue 11).

Starts `bin/serve` on its own PostgreSQL database (`<BENCH_DB_PREFIX>_airflow_worker`), syncs
`bench/airflow_dags/` (one Dag of 8 no-op tasks), and per concurrency triggers runs, runs the
worker until it is idle, and reads from the database: tasks/s = TIs / (last end - first claim),
latency = TI start_date (the SDK's `start` call) - claimed_at. Each TI costs two Python
processes importing Airflow (the supervisor and the task it forks), so on a small machine the
figures are the SDK's start-up cost, not the service's.

    .venv/bin/python bench/airflow_worker.py [--runs 1] [--concurrency 1 8]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import _harness as h  # bench/ is sys.path[0]: puts the checkout on sys.path
import psycopg

from tests import servers

ROOT = Path(__file__).resolve().parents[1]
PG = os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432")
DB = f"{os.environ.get('BENCH_DB_PREFIX', 'bench')}_airflow_worker"
KEY = "bench-worker-key"


def _sql(query: str, *args, db: str = DB):
    with psycopg.connect(f"{PG}/{db}", autocommit=True) as conn:
        return (
            conn.execute(query, args).fetchall()
            if query.lstrip().upper().startswith("SELECT")
            else conn.execute(query, args)
        )


def _worker(url: str, env: dict, *args: str) -> None:
    subprocess.run(
        [
            str(ROOT / "bin/airflow-worker"),
            "--dags",
            str(ROOT / "bench/airflow_dags"),
            "--url",
            url,
            "--logs",
            str(ROOT / "var/bench-airflow-logs"),
            *args,
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1, help="runs (8 TIs each) per concurrency")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    options = parser.parse_args()
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB}"')
        conn.execute(f'CREATE DATABASE "{DB}"')
    port = h.free_port()
    env = {**os.environ, "DATABASE_URL": f"{PG}/{DB}", "PORT": str(port), "WORKER_API_KEY": KEY}
    serve = servers.bin_serve(env, h.log_path("airflow_worker", "serve"), ready_timeout=120)
    url = f"http://127.0.0.1:{port}"
    rows = []
    try:
        _worker(url, env, "--sync-only")
        load_before = os.getloadavg()[0]
        for concurrency in options.concurrency:
            _sql("TRUNCATE assets_app_dagrun CASCADE")
            for _ in range(options.runs):
                subprocess.run(
                    [sys.executable, "manage.py", "trigger_dag", "bench_noop"],
                    cwd=ROOT,
                    env=env,
                    check=True,
                    capture_output=True,
                )
            _worker(url, env, "--no-sync", "--concurrency", str(concurrency), "--idle-exit", "5")
            tis = _sql(
                "SELECT claimed_at, start_date, end_date, state FROM assets_app_taskinstance"
            )
            assert all(state == "success" for *_, state in tis), tis
            latency = [(start - claimed).total_seconds() for claimed, start, _, _ in tis]
            span = (max(t[2] for t in tis) - min(t[0] for t in tis)).total_seconds()
            rows.append(
                {
                    "concurrency": concurrency,
                    "tis": len(tis),
                    "tasks_per_second": round(len(tis) / span, 3),
                    "claim_to_running_median_s": round(statistics.median(latency), 2),
                    "claim_to_running_max_s": round(max(latency), 2),
                }
            )
        load_after = os.getloadavg()[0]
    finally:
        serve.stop(timeout=60)
    print(f"{'concurrency':>11} {'TIs':>4} {'tasks/s':>8} {'claim->running median':>22} {'max':>6}")
    for r in rows:
        print(
            f"{r['concurrency']:>11} {r['tis']:>4} {r['tasks_per_second']:>8} "
            f"{r['claim_to_running_median_s']:>21}s {r['claim_to_running_max_s']:>5}s"
        )
    out = ROOT / "bench/results/airflow_worker.json"
    out.write_text(
        json.dumps(
            {
                "rows": rows,
                "load_before": load_before,
                "load_after": load_after,
                "cpus": os.cpu_count(),
            },
            indent=2,
        )
        + "\n"
    )
    print(f"load {load_before:.1f} -> {load_after:.1f} on {os.cpu_count()} cores; wrote {out}")


if __name__ == "__main__":
    main()
