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

The two systems are interleaved (issue 44): service, Airflow, service, Airflow ... for
`--rounds` rounds in one run, each round on a fresh database (the service keeps one `bin/serve`
and truncates its runs; Airflow starts anew on a new SQLite file), so a change of the machine's
load falls on both; the table has every round and the medians. `--tasks N` runs a Dag of N
no-op tasks (written to a temporary folder; 50 is `bench/airflow_dags/fifty.py`'s size). A round
stops waiting as soon as its worker or one of Airflow's processes has exited (a failed run is
reported, never waited out), and an Airflow whose api-server lost its port to someone else is
started again on another.

    BENCH_DB_PREFIX=room_27_bench .venv/bin/python bench/airflow_worker.py [--concurrency 4]
        [--tasks 50] [--rounds 2] [--old] [--skip-airflow]
"""

import argparse
import json
import os
import signal
import statistics
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
DAG_ID = "bench_tasks"
DAG_FILE = '''"""bench/airflow_worker.py's Dag: {tasks} independent tasks that do nothing."""

from airflow.sdk import dag, task


@dag(dag_id="{dag_id}", schedule=None, is_paused_upon_creation=False)
def bench_tasks():
    for i in range({tasks}):
        task(task_id=f"noop_{{i:04d}}")(lambda: None)()


bench_tasks()
'''


def dag_folder(tasks: int) -> Path:
    """A folder holding the bench's one Dag file, of `tasks` no-op tasks."""
    folder = Path(tempfile.mkdtemp(prefix="bench-airflow-dags-"))
    (folder / "bench_tasks.py").write_text(DAG_FILE.format(tasks=tasks, dag_id=DAG_ID))
    return folder


# A run is over when every TI is in one of these (a failed TI under a heavy load is counted
# and reported, never waited for until the timeout).
ENDED = "('success', 'failed', 'upstream_failed', 'skipped')"


def _sql(query: str, *args, db: str = DB):
    with psycopg.connect(f"{PG}/{db}", autocommit=True) as conn:
        cursor = conn.execute(query, args)
        return cursor.fetchall() if cursor.description else []


class RoundFailed(Exception):
    """A round that cannot finish (a process exited, or the time ran out): reported, not waited."""


def _wait(predicate, seconds: float, what: str, alive=lambda: None) -> None:
    """Until `predicate()`; `alive()` names a process that exited (the round failed) or None."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        gone = alive()
        if gone:
            raise RoundFailed(f"{what}: {gone} exited")
        time.sleep(0.5)
    raise RoundFailed(f"{what} not done within {seconds:g}s")


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


class Service:
    """`bin/serve` on its own database (started once) and, per round, `bin/airflow-worker`'s
    pool on the bench's Dag folder: the runs truncated, the worker started before the trigger."""

    def __init__(self, dags: Path) -> None:
        self.dags = dags
        with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{DB}"')
        port = h.free_port()
        self.env = {
            **os.environ,
            "DATABASE_URL": f"{PG}/{DB}",
            "PORT": str(port),
            "WORKER_API_KEY": KEY,
        }
        log = h.log_path("airflow_worker", "serve")
        self.serve = servers.bin_serve(self.env, log, ready_timeout=240)
        self.worker_args = [str(ROOT / "bin/airflow-worker"), "--dags", str(dags)]
        self.worker_args += [
            "--url",
            self.serve.url,
            "--logs",
            str(ROOT / "var/bench-airflow-logs"),
        ]
        subprocess.run(
            [*self.worker_args, "--sync-only"], env=self.env, check=True, capture_output=True
        )

    def round(self, label: str, tasks: int, concurrency: int, extra: list[str]) -> dict:
        _sql("TRUNCATE assets_app_dagrun CASCADE")
        log = h.log_path("airflow_worker", "worker").open("w")
        worker = subprocess.Popen(
            [*self.worker_args, "--no-sync", "--concurrency", str(concurrency), *extra],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            time.sleep(15)  # the pool forks and imports, as a scheduler is up before a trigger
            subprocess.run(
                [sys.executable, "manage.py", "trigger_dag", DAG_ID],
                cwd=ROOT,
                env=self.env,
                check=True,
                capture_output=True,
            )
            _wait(
                lambda: (
                    _sql(f"SELECT count(*) FROM assets_app_taskinstance WHERE state IN {ENDED}")[0][
                        0
                    ]
                    >= tasks
                ),
                900,
                label,
                alive=lambda: "the worker" if worker.poll() is not None else None,
            )
            load = os.getloadavg()[0]
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(90)
            log.close()
        (queued,) = _sql("SELECT queued_at FROM assets_app_dagrun")[0]
        tis = _sql("SELECT start_date, end_date, state FROM assets_app_taskinstance")
        done = [t for t in tis if t[2] == "success"]
        return _row(
            label,
            queued,
            [t[0] for t in done],
            [t[1] for t in done],
            load,
            failed=len(tis) - len(done),
        )

    def stop(self) -> None:
        self.serve.stop(timeout=60)


def _parse(value: str) -> datetime:
    return datetime.fromisoformat(value).replace(tzinfo=UTC)


AIRFLOW_LABEL = "Airflow 3.3.2 scheduler + LocalExecutor"


def bench_airflow(dags: Path, tasks: int, concurrency: int) -> dict:
    """One round on a new Airflow (new SQLite file); an api-server that lost its port to another
    process (it exits at once) is started again on another port, twice at most."""
    for attempt in range(3):
        try:
            return _airflow_round(dags, tasks, concurrency)
        except servers.ServerError as exc:
            if attempt == 2 or "address already in use" not in str(exc).lower():
                raise
            print(f"bench: Airflow's port was taken ({exc!s:.120}); again on another", flush=True)
    raise AssertionError("unreachable")


def _airflow_round(dags: Path, tasks: int, concurrency: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-airflow-") as tmp:
        logs = h.log_path("airflow_worker", "airflow").parent
        stock = StockAirflow(dags, Path(tmp), logs, parallelism=concurrency)
        with stock:

            def alive() -> str | None:
                gone = [p for p in stock.processes if not p.running]
                return gone[0].argv[1] if gone else None

            _wait(
                lambda: stock.rows(
                    f"SELECT 1 FROM dag WHERE dag_id = '{DAG_ID}' AND NOT is_paused"
                ),
                600,
                "Airflow: parse the Dag",
                alive=alive,
            )
            time.sleep(15)  # the scheduler's LocalExecutor workers are up
            subprocess.run(
                [str(AIRFLOW), "dags", "trigger", DAG_ID],
                env=stock.env,
                check=True,
                capture_output=True,
            )
            _wait(
                lambda: (
                    (
                        stock.rows(f"SELECT count(*) FROM task_instance WHERE state IN {ENDED}")
                        or [(0,)]
                    )[0][0]
                    >= tasks
                ),
                900,
                "Airflow: the run",
                alive=alive,
            )
            load = os.getloadavg()[0]
            (queued,) = stock.rows("SELECT queued_at FROM dag_run")[0]
            tis = stock.rows("SELECT start_date, end_date, state FROM task_instance")
    done = [t for t in tis if t[2] == "success"]
    return _row(
        AIRFLOW_LABEL,
        _parse(queued),
        [_parse(t[0]) for t in done],
        [_parse(t[1]) for t in done],
        load,
        failed=len(tis) - len(done),
    )


def _failed_row(system: str, error: Exception) -> dict:
    return {"system": system, "error": str(error)[:300], "load_1min": round(os.getloadavg()[0], 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, default=4, help="pool size and parallelism")
    parser.add_argument("--tasks", type=int, default=50, help="no-op tasks in the bench's Dag")
    parser.add_argument("--rounds", type=int, default=2, help="service, Airflow, ... rounds")
    parser.add_argument("--old", action="store_true", help="also --interpreter-per-task")
    parser.add_argument("--skip-airflow", action="store_true")
    options = parser.parse_args()
    dags = dag_folder(options.tasks)
    load_before = os.getloadavg()
    kinds = [("service, pool", [])]
    if options.old:
        kinds.append(("service, interpreter per task", ["--interpreter-per-task"]))
    rounds: list[list[dict]] = []
    service = Service(dags)
    try:
        for number in range(1, options.rounds + 1):
            rows = []
            for label, extra in kinds:
                try:
                    rows.append(service.round(label, options.tasks, options.concurrency, extra))
                except RoundFailed as exc:
                    rows.append(_failed_row(label, exc))
            if not options.skip_airflow:
                try:
                    rows.append(bench_airflow(dags, options.tasks, options.concurrency))
                except (RoundFailed, TimeoutError, servers.ServerError) as exc:
                    rows.append(_failed_row(AIRFLOW_LABEL, exc))
            for row in rows:
                row["round"] = number
            rounds.append(rows)
            _print_round(number, rows)
    finally:
        service.stop()
    load_after = os.getloadavg()
    medians = _medians([row for rows in rounds for row in rows])
    print(
        f"\n{options.tasks} independent no-op tasks, concurrency {options.concurrency}, "
        f"{options.rounds} interleaved round(s): medians"
    )
    for system, figures in medians.items():
        print(f"  {system:<42} " + ", ".join(f"{k} {v}" for k, v in figures.items()))
    out = ROOT / "bench/results/airflow_worker.json"
    out.write_text(
        json.dumps(
            {
                "dag": f"{options.tasks} no-op tasks (bench/airflow_worker.py DAG_FILE)",
                "tasks": options.tasks,
                "concurrency": options.concurrency,
                "rounds": rounds,
                "medians": medians,
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


def _print_round(number: int, rows: list[dict]) -> None:
    print(
        f"round {number}: {'system':<42} {'tasks/s':>8} {'trigger->first running':>23} "
        f"{'run':>7} {'load':>5} {'failed':>6}",
        flush=True,
    )
    for r in rows:
        if "error" in r:
            print(f"         {r['system']:<42} FAILED: {r['error']}", flush=True)
            continue
        print(
            f"         {r['system']:<42} {r['tasks_per_second']:>8} "
            f"{r['trigger_to_first_running_s']:>22}s {r['run_seconds']:>6}s {r['load_1min']:>5} "
            f"{r['failed']:>6}",
            flush=True,
        )


def _medians(rows: list[dict]) -> dict[str, dict]:
    """Per system, the median of its rounds' tasks/s and trigger -> first running; with Airflow's
    rows, each service's ratio of medians (tasks/s, x Airflow; latency, share of Airflow's)."""
    medians: dict[str, dict] = {}
    for system in dict.fromkeys(r["system"] for r in rows):
        done = [r for r in rows if r["system"] == system and "error" not in r]
        if done:
            medians[system] = {
                "tasks_per_second": round(
                    statistics.median(r["tasks_per_second"] for r in done), 3
                ),
                "trigger_to_first_running_s": round(
                    statistics.median(r["trigger_to_first_running_s"] for r in done), 2
                ),
                "rounds": len(done),
            }
    theirs = medians.get(AIRFLOW_LABEL)
    if theirs:
        for system, figures in medians.items():
            if system != AIRFLOW_LABEL:
                figures["x_airflow_tasks_per_second"] = round(
                    figures["tasks_per_second"] / theirs["tasks_per_second"], 2
                )
                figures["share_of_airflow_latency"] = round(
                    figures["trigger_to_first_running_s"]
                    / max(theirs["trigger_to_first_running_s"], 0.01),
                    2,
                )
    return medians


if __name__ == "__main__":
    main()
