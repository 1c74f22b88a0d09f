"""Stock Airflow workers, this service against Airflow 3.3.2 itself (issue 27), in one run on one
DAG file: `bench/airflow_dags/fifty.py`, 50 independent tasks that do nothing.

- service: `bin/serve` on its own PostgreSQL database (`<BENCH_DB_PREFIX>_airflow_worker`) and
  `bin/airflow-worker --concurrency C` (its pool of processes that imported the Task SDK once;
  `--interpreter-per-task` too with `--old`), started before the trigger, as a scheduler is.
- airflow: airflow-core 3.3.2 from `.venv-airflow-worker`, the lightest setup that runs
  LocalExecutor: `airflow db migrate` on a SQLite file in a temporary AIRFLOW_HOME, then
  `airflow api-server` (the execution API the supervisor talks to), `airflow scheduler`
  (LocalExecutor, `[core] parallelism` = C) and `airflow dag-processor`; the run is triggered
  with `airflow dags trigger` once the Dag is parsed and unpaused (`tools/stock_airflow.py`,
  shared with the differential harness).

Both read from their own database: latency = first TI start_date - the run's queued_at (trigger
-> first task running), tasks/s = successful TIs / (their last end_date - the run's queued_at);
a run is over when every TI has ended, and TIs that failed (a heavy load) are counted apart. The
machine's 1-minute load is printed with each row (a shared 2-core machine: see the README's
figures).

    BENCH_DB_PREFIX=room_27_bench .venv/bin/python bench/airflow_worker.py [--concurrency 4]
        [--old] [--skip-airflow]
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import _harness as h  # bench/ is sys.path[0]: puts the checkout on sys.path
import psycopg

from tests import servers
from tools.stock_airflow import AIRFLOW, StockAirflow

ROOT = Path(__file__).resolve().parents[1]
PG = os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432")
DB = f"{h.DB_PREFIX}_airflow_worker"
KEY = "bench-worker-key-" + "x" * 24
DAGS = ROOT / "bench/airflow_dags"
DAG_ID = "bench_fifty"
TASKS = 50
# A run is over when every TI is in one of these (a failed TI under a heavy load is counted
# and reported, never waited for until the timeout).
ENDED = "('success', 'failed', 'upstream_failed', 'skipped')"


def _sql(query: str, *args, db: str = DB):
    with psycopg.connect(f"{PG}/{db}", autocommit=True) as conn:
        cursor = conn.execute(query, args)
        return cursor.fetchall() if cursor.description else []


def _wait(predicate, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise SystemExit(f"bench: {what} not done within {seconds:g}s")


def _row(
    system: str, queued: datetime, starts: list, ends: list, load: float, failed: int = 0
) -> dict:
    span = (max(ends) - queued).total_seconds()
    return {
        "system": system,
        "tis": len(starts),
        "failed": failed,
        "tasks_per_second": round(len(starts) / span, 3),
        "trigger_to_first_running_s": round((min(starts) - queued).total_seconds(), 2),
        "run_seconds": round(span, 1),
        "load_1min": round(load, 1),
    }


def bench_service(concurrency: int, *, old: bool) -> list[dict]:
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB}"')
        conn.execute(f'CREATE DATABASE "{DB}"')
    port = h.free_port()
    env = {**os.environ, "DATABASE_URL": f"{PG}/{DB}", "PORT": str(port), "WORKER_API_KEY": KEY}
    serve = servers.bin_serve(env, h.log_path("airflow_worker", "serve"), ready_timeout=240)
    rows = []
    worker_args = [str(ROOT / "bin/airflow-worker"), "--dags", str(DAGS), "--url", serve.url]
    worker_args += ["--logs", str(ROOT / "var/bench-airflow-logs")]
    try:
        subprocess.run([*worker_args, "--sync-only"], env=env, check=True, capture_output=True)
        for label, extra in [("service, pool", [])] + (
            [("service, interpreter per task", ["--interpreter-per-task"])] if old else []
        ):
            _sql("TRUNCATE assets_app_dagrun CASCADE")
            log = h.log_path("airflow_worker", "worker").open("w")
            worker = subprocess.Popen(
                [*worker_args, "--no-sync", "--concurrency", str(concurrency), *extra],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            time.sleep(15)  # the pool forks and imports, as a scheduler is up before a trigger
            subprocess.run(
                [sys.executable, "manage.py", "trigger_dag", DAG_ID],
                cwd=ROOT,
                env=env,
                check=True,
                capture_output=True,
            )
            _wait(
                lambda: (
                    _sql(f"SELECT count(*) FROM assets_app_taskinstance WHERE state IN {ENDED}")[0][
                        0
                    ]
                    >= TASKS
                ),
                900,
                label,
            )
            load = os.getloadavg()[0]
            worker.send_signal(signal.SIGTERM)
            worker.wait(60)
            log.close()
            (queued,) = _sql("SELECT queued_at FROM assets_app_dagrun")[0]
            tis = _sql("SELECT start_date, end_date, state FROM assets_app_taskinstance")
            done = [t for t in tis if t[2] == "success"]
            rows.append(
                _row(
                    label,
                    queued,
                    [t[0] for t in done],
                    [t[1] for t in done],
                    load,
                    failed=len(tis) - len(done),
                )
            )
    finally:
        serve.stop(timeout=60)
    return rows


def _parse(value: str) -> datetime:
    return datetime.fromisoformat(value).replace(tzinfo=UTC)


def bench_airflow(concurrency: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-airflow-") as tmp:
        logs = h.log_path("airflow_worker", "airflow").parent
        stock = StockAirflow(DAGS, Path(tmp), logs, parallelism=concurrency)
        with stock:
            stock.wait(
                lambda: stock.rows(
                    f"SELECT 1 FROM dag WHERE dag_id = '{DAG_ID}' AND NOT is_paused"
                ),
                600,
                "parse the Dag",
            )
            time.sleep(15)  # the scheduler's LocalExecutor workers are up
            subprocess.run(
                [str(AIRFLOW), "dags", "trigger", DAG_ID],
                env=stock.env,
                check=True,
                capture_output=True,
            )
            stock.wait(
                lambda: (
                    (
                        stock.rows(f"SELECT count(*) FROM task_instance WHERE state IN {ENDED}")
                        or [(0,)]
                    )[0][0]
                    >= TASKS
                ),
                900,
                "the run",
            )
            load = os.getloadavg()[0]
            (queued,) = stock.rows("SELECT queued_at FROM dag_run")[0]
            tis = stock.rows("SELECT start_date, end_date, state FROM task_instance")
    done = [t for t in tis if t[2] == "success"]
    return _row(
        "Airflow 3.3.2 scheduler + LocalExecutor",
        _parse(queued),
        [_parse(t[0]) for t in done],
        [_parse(t[1]) for t in done],
        load,
        failed=len(tis) - len(done),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, default=4, help="pool size and parallelism")
    parser.add_argument("--old", action="store_true", help="also --interpreter-per-task")
    parser.add_argument("--skip-airflow", action="store_true")
    options = parser.parse_args()
    load_before = os.getloadavg()
    rows = bench_service(options.concurrency, old=options.old)
    if not options.skip_airflow:
        rows.append(bench_airflow(options.concurrency))
    load_after = os.getloadavg()
    print(f"{TASKS} independent no-op tasks, concurrency {options.concurrency}")
    print(
        f"{'system':<42} {'tasks/s':>8} {'trigger->first running':>23} {'run':>7} {'load':>5} "
        f"{'failed':>6}"
    )
    for r in rows:
        print(
            f"{r['system']:<42} {r['tasks_per_second']:>8} "
            f"{r['trigger_to_first_running_s']:>22}s {r['run_seconds']:>6}s {r['load_1min']:>5} "
            f"{r['failed']:>6}"
        )
    out = ROOT / "bench/results/airflow_worker.json"
    out.write_text(
        json.dumps(
            {
                "dag": "bench/airflow_dags/fifty.py",
                "concurrency": options.concurrency,
                "rows": rows,
                "load_before": load_before,
                "load_after": load_after,
                "cpus": os.cpu_count(),
            },
            indent=2,
        )
        + "\n"
    )
    print(
        f"load (1/5/15 min) {load_before[0]:.1f}/{load_before[1]:.1f}/{load_before[2]:.1f} -> "
        f"{load_after[0]:.1f}/{load_after[1]:.1f}/{load_after[2]:.1f} on {os.cpu_count()} "
        f"cores; wrote {out}"
    )


if __name__ == "__main__":
    main()
