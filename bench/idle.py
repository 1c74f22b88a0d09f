"""Idle cost: what a service with nothing to do costs the database and the CPU.

Real processes, as `bin/serve` runs them: gunicorn (2 sync workers) and a django-q2 qcluster
(Q_CLUSTER_WORKERS=2), on an empty bench database with the sweep schedules installed. After a
warm-up, for SECONDS seconds: the bench database's transactions per second (pg_stat_database
xact_commit + xact_rollback, read from another database) and the CPU
the service's processes used (psutil, user + system, as a share of one core). Each broker is
measured: `assets_app.cluster.broker.ListeningORM` (the default: NOTIFY wakes the cluster, an idle
one looks once per Q_CLUSTER_IDLE_WAIT_SECONDS) and django-q2's polling `ORM` (Q_CLUSTER_POLL 0.02
s, the default before issue 15).

Targets (issue 15): at most 2 queries a second per cluster and under 2 % of a core for the whole
service (an idle query is one SELECT in its own transaction, so transactions/s bound queries/s).
"""

from __future__ import annotations

import subprocess
import sys
import time

import _harness as h

NAME = "idle"
TARGET_TPS = 2.0
TARGET_CPU_PERCENT = 2.0
BROKERS = {
    "ListeningORM (NOTIFY)": "assets_app.cluster.broker.ListeningORM",
    "django-q2 ORM (poll 0.02 s)": "django_q.brokers.orm.ORM",
}


def _transactions(conn, dbname: str) -> int:
    row = conn.execute(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", [dbname]
    ).fetchone()
    return int(row[0])


def _cpu_seconds(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for proc in procs:
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
    return total


def measure(url: str, dbname: str, broker: str, *, seconds: float, warmup: float) -> dict:

    env = {"Q_CLUSTER_BROKER_CLASS": broker, "Q_CLUSTER_POLL": "0.02"}
    web, _ = h.start_gunicorn(url, workers=2, log=h.log_path(NAME, "gunicorn"), **env)
    cluster = h.start_qcluster(url, log=h.log_path(NAME, "qcluster"), **env)
    try:
        time.sleep(warmup)
        # Stats reach pg_stat_database when a backend's transaction ends (at most once a second).
        with h._admin_connect() as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            before, cpu_before = _transactions(conn, dbname), _cpu_seconds([web.pid, cluster.pid])
            started = time.monotonic()
            time.sleep(seconds)
            conn.execute("SELECT pg_stat_clear_snapshot()")
            after, cpu_after = _transactions(conn, dbname), _cpu_seconds([web.pid, cluster.pid])
            elapsed = time.monotonic() - started
    finally:
        cluster.stop()
        web.stop()
    return {
        "seconds": round(elapsed, 1),
        "transactions_per_second": round((after - before) / elapsed, 2),
        "cpu_percent_of_one_core": round(100 * (cpu_after - cpu_before) / elapsed, 2),
    }


def main() -> None:
    args = h.parse_args(__doc__)
    h.record_machine_start()
    seconds, warmup = (10.0, 5.0) if args.quick else (30.0, 10.0)
    url = h.fresh_database(NAME)
    dbname = url.rsplit("/", 1)[1]
    subprocess.run(
        [sys.executable, "manage.py", "setup_schedules"],
        cwd=h.ROOT,
        env=h.server_env(url),
        check=True,
        capture_output=True,
    )
    results = {
        label: measure(url, dbname, broker, seconds=seconds, warmup=warmup)
        for label, broker in BROKERS.items()
    }
    h.print_table(
        f"idle service (gunicorn -w 2 + qcluster, {seconds:.0f} s after {warmup:.0f} s warm-up)",
        ["broker", "transactions/s", "CPU % of a core"],
        [
            [label, r["transactions_per_second"], r["cpu_percent_of_one_core"]]
            for label, r in results.items()
        ],
    )
    default = results["ListeningORM (NOTIFY)"]
    h.write_results(
        NAME,
        {
            "results": results,
            "targets": {"transactions_per_second": TARGET_TPS, "cpu_percent": TARGET_CPU_PERCENT},
            "met": default["transactions_per_second"] <= TARGET_TPS
            and default["cpu_percent_of_one_core"] <= TARGET_CPU_PERCENT,
        },
        args,
    )
    if not args.keep_db:
        h.drop_database(NAME)


if __name__ == "__main__":
    main()
