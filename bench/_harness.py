"""Shared benchmark harness: databases, Django set-up, rounds, tables, JSON/PNG, servers.

Every benchmark script imports this module first (`import _harness as h`; bench/ is sys.path[0]
when a script runs) and then:

    args = h.parse_args(__doc__)
    url = h.fresh_database("ti_lock_success")   # bench_ti_lock_success, dropped and migrated
    h.setup_django(url)                          # DJANGO_SETTINGS_MODULE=bench.settings_bench
    ...
    h.print_table(...); h.write_results("ti_lock_success", data, args); h.plot_lines(...)

PostgreSQL is reached at $BENCH_PG_URL (default postgres://postgres@127.0.0.1:5432); the
benchmark databases are named <prefix>_<name> and dropped at the start of the next run, where
<prefix> is $BENCH_DB_PREFIX (default `bench`): two checkouts benchmarking on one server at the
same time give themselves different prefixes, so neither drops the other's databases.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests import servers  # noqa: E402 (after ROOT is importable)
from tests.servers import Server  # noqa: E402

RESULTS = ROOT / "bench" / "results"
PYTHON = sys.executable
PG_URL = os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432").rstrip("/")
SETTINGS_MODULE = "bench.settings_bench"
DB_PREFIX = os.environ.get("BENCH_DB_PREFIX", "bench")
# Ports this project's benchmarks may bind (house rule); servers pick a free one in range.
PORT_RANGE = range(8400, 8500)


# --- arguments -----------------------------------------------------------------------------


def parse_args(doc: str | None, extra: Callable[[argparse.ArgumentParser], None] | None = None):
    parser = argparse.ArgumentParser(
        description=(doc or "").strip().splitlines()[0] if doc else None
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, few rounds (~10 s)")
    parser.add_argument("--rounds", type=int, default=None, help="override the round count")
    parser.add_argument("--keep-db", action="store_true", help="keep the bench_* database")
    if extra:
        extra(parser)
    return parser.parse_args()


# --- databases -----------------------------------------------------------------------------


def _admin_connect():
    import psycopg

    return psycopg.connect(f"{PG_URL}/postgres", autocommit=True)


def db_url(name: str) -> str:
    return f"{PG_URL}/{DB_PREFIX}_{name}"


def drop_database(name: str) -> None:
    with _admin_connect() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB_PREFIX}_{name}" WITH (FORCE)')


def _template_name() -> str:
    """<prefix>_tpl_<hash of the migrations and requirements>: a migrated, empty database."""
    digest = hashlib.sha256()
    for path in sorted((ROOT / "assets_app" / "migrations").glob("*.py")):
        digest.update(path.read_bytes())
    digest.update((ROOT / "requirements.txt").read_bytes())
    return f"{DB_PREFIX}_tpl_{digest.hexdigest()[:10]}"


def _ensure_template() -> str:
    """Create and migrate the template database once per schema; drop stale templates."""
    template = _template_name()
    with _admin_connect() as conn:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE %s",
                [DB_PREFIX.replace("_", "\\_") + "\\_tpl\\_%"],
            )
        ]
        for stale in names:
            if stale != template:
                conn.execute(f'ALTER DATABASE "{stale}" WITH IS_TEMPLATE false')
                conn.execute(f'DROP DATABASE IF EXISTS "{stale}" WITH (FORCE)')
        if template in names:
            return template
        conn.execute(f'CREATE DATABASE "{template}_tmp"')
    try:
        subprocess.run(
            [PYTHON, "manage.py", "migrate", "--no-input", "--skip-checks", "-v", "0"],
            cwd=ROOT,
            env=server_env(f"{PG_URL}/{template}_tmp"),
            check=True,
        )
        with _admin_connect() as conn:
            conn.execute(f'ALTER DATABASE "{template}_tmp" RENAME TO "{template}"')
            # No connections (autovacuum included): CREATE DATABASE ... TEMPLATE refuses to copy
            # a database someone is connected to.
            conn.execute(
                f'ALTER DATABASE "{template}" WITH ALLOW_CONNECTIONS false IS_TEMPLATE true'
            )
    finally:
        with _admin_connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{template}_tmp" WITH (FORCE)')
    return template


def fresh_database(name: str) -> str:
    """Drop and re-create <prefix>_<name> as a copy of the migrated template, return its URL.

    The template (<prefix>_tpl_<hash>) is migrated with `manage.py migrate` the first time a schema
    is seen, so a run does not pay for seven migrations.
    """
    import psycopg

    template = _ensure_template()
    drop_database(name)
    for attempt in range(20):
        try:
            with _admin_connect() as conn:
                conn.execute(f'CREATE DATABASE "{DB_PREFIX}_{name}" TEMPLATE "{template}"')
            break
        except psycopg.errors.ObjectInUse:  # a straggler on the template: wait for it
            if attempt == 19:
                raise
            time.sleep(0.5)
    return db_url(name)


def server_env(url: str, **extra: str) -> dict[str, str]:
    """Environment for a child process (manage.py, gunicorn, qcluster) on database `url`."""
    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": url,
            "DJANGO_SETTINGS_MODULE": SETTINGS_MODULE,
            "PYTHONPATH": str(ROOT),
            "DEBUG": "false",
            "LOG_LEVEL": "WARNING",
        }
    )
    env.update({key: str(value) for key, value in extra.items()})
    return env


def setup_django(url: str, **settings_env: str) -> None:
    """Configure Django in this process on `url` (env vars override project settings)."""
    os.environ.update(server_env(url, **settings_env))
    import django

    django.setup()


def pg_version() -> str:
    with _admin_connect() as conn:
        return conn.execute("SHOW server_version").fetchone()[0]


# --- rounds and statistics -----------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def stats(values: Iterable[float]) -> dict[str, float]:
    data = list(values)
    if not data:
        return {"n": 0}
    return {
        "n": len(data),
        "median": statistics.median(data),
        "min": min(data),
        "max": max(data),
        "mean": statistics.fmean(data),
        "p90": percentile(data, 90),
        "p99": percentile(data, 99),
    }


def run_rounds(fn: Callable[[int], Any], *, warmup: int, rounds: int) -> list[Any]:
    """Call fn(i) `warmup` times (results dropped) and then `rounds` times; return the results."""
    for i in range(warmup):
        fn(-1 - i)
    return [fn(i) for i in range(rounds)]


class Stopwatch:
    def __enter__(self) -> Stopwatch:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start


# --- output --------------------------------------------------------------------------------


def fmt(value: Any) -> str:
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e9:
            return f"{int(value):,}"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}" if abs(value) >= 0.1 else f"{value:.3f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def print_table(title: str, headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Print (and return) a plain-text table with right-aligned columns."""
    cells = [[fmt(value) for value in row] for row in rows]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]
    lines = [title, "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    text = "\n".join(lines)
    print(text + "\n", flush=True)
    return text


def results_dir(args: argparse.Namespace) -> Path:
    """Full runs write bench/results/, quick runs bench/results/quick/ (never clobbering)."""
    path = RESULTS / "quick" if args.quick else RESULTS
    path.mkdir(parents=True, exist_ok=True)
    return path


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on, including how busy the machine was meanwhile."""
    import psutil

    me = os.getpid()
    busy = []
    for proc in psutil.process_iter(["pid", "name", "cmdline", "cpu_percent"]):
        try:
            proc.cpu_percent(None)
        except psutil.Error:
            continue
    time.sleep(0.5)
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            cpu = proc.cpu_percent(None)
        except psutil.Error:
            continue
        if cpu >= 10 and proc.pid != me:
            cmd = " ".join(proc.info["cmdline"] or [proc.info["name"] or "?"])[:120]
            busy.append({"pid": proc.pid, "cpu_percent": cpu, "cmd": cmd})
    # BENCH_GIT_COMMIT names the commit when the tree is an export without .git.
    commit = (
        os.environ.get("BENCH_GIT_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    )
    return {
        "cpus": os.cpu_count(),
        "load_avg_1m_5m_15m": list(os.getloadavg()),
        "other_busy_processes": busy,
        "python": platform.python_version(),
        "postgresql": pg_version(),
        "git_commit": commit,
        "platform": platform.platform(),
    }


def write_results(name: str, data: Mapping[str, Any], args: argparse.Namespace) -> Path:
    """Write bench/results[/quick]/<name>.json with the machine context before and after."""
    path = results_dir(args) / f"{name}.json"
    payload = {
        "benchmark": name,
        "quick": bool(args.quick),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {**STARTED_MACHINE, "after": machine_info()},
        **data,
    }
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"wrote {path.relative_to(ROOT)}", flush=True)
    return path


STARTED_MACHINE: dict[str, Any] = {}


def record_machine_start() -> None:
    STARTED_MACHINE.update(machine_info())


def plot_lines(
    name: str,
    args: argparse.Namespace,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    target: float | None = None,
    logx: bool = False,
    logy: bool = False,
    suffix: str = "",
) -> Path:
    """One PNG with a line per series (x, y) and an optional horizontal target line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", label=label)
    if target is not None:
        ax.axhline(target, color="crimson", linestyle="--", linewidth=1, label=f"target {target:g}")
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = results_dir(args) / f"{name}{suffix}.png"
    fig.savefig(path)
    plt.close(fig)
    print(f"wrote {path.relative_to(ROOT)}", flush=True)
    return path


def plot_hist(
    name: str,
    args: argparse.Namespace,
    *,
    title: str,
    xlabel: str,
    values: Sequence[float],
    markers: Mapping[str, float] = (),
    suffix: str = "",
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    ax.hist(values, bins=60, color="steelblue")
    colors = ("darkorange", "crimson", "seagreen", "purple")
    for (label, value), color in zip(dict(markers).items(), colors, strict=False):
        ax.axvline(value, color=color, linestyle="--", linewidth=1, label=f"{label} {value:.0f}")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("count")
    if markers:
        ax.legend()
    fig.tight_layout()
    path = results_dir(args) / f"{name}{suffix}.png"
    fig.savefig(path)
    plt.close(fig)
    print(f"wrote {path.relative_to(ROOT)}", flush=True)
    return path


# --- servers -------------------------------------------------------------------------------


def free_port() -> int:
    return servers.free_port(PORT_RANGE)


def start_gunicorn(
    url: str, *, workers: int, log: Path, threads: int = 1, **env: str
) -> tuple[Server, str]:
    """gunicorn on 127.0.0.1:<free port>; returns (server, base URL) once it answers HTTP."""
    port = free_port()
    # The latency histogram's multiprocess directory (bin/serve sets one up the same way).
    metrics_dir = log.parent / f"prometheus-{port}"
    metrics_dir.mkdir(parents=True, exist_ok=True)
    for stale in metrics_dir.glob("*.db"):
        stale.unlink()
    env = {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir), **env}
    args = ("--threads", str(threads), "--backlog", "2048", "--timeout", "120")
    server = servers.gunicorn(
        server_env(url, **env),
        log,
        workers=workers,
        port=port,
        args=(*args, "--log-level", "warning"),
    )
    assert server.url is not None
    return server, server.url


def start_qcluster(url: str, *, log: Path, **env: str) -> Server:
    # The measurements are over when a cluster is stopped, and a django-q2 cluster takes
    # 10 s or more to stop on SIGTERM: give it 2 s, then SIGKILL its process group.
    return servers.qcluster(server_env(url, **env), log, stop_timeout=2.0)


def start_service(url: str, *, log: Path, ready_timeout: float = 300.0, **env: str) -> Server:
    """The service as the README starts it (issue 41): `bin/serve` (migrate, setup_schedules,
    then the Procfile's processes under honcho: gunicorn, the django-q2 cluster, the timers, the
    queue watchers) on database `url` with `project.settings`, answering HTTP. `env` overrides
    settings the way an operator's environment would (none by default)."""
    port = free_port()
    full = {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "PORT": str(port),
        "LOG_LEVEL": "WARNING",
        **{key: str(value) for key, value in env.items()},
    }
    return servers.bin_serve(full, log, port=port, ready_timeout=ready_timeout)


def service_pids(service: Server, *, timeout: float = 60.0) -> dict[str, int]:
    """The pids of `start_service`'s Procfile processes (under honcho; the Procfile's lines
    `exec` their program): "web" (the gunicorn master), "cluster" (qcluster), "timers"
    (run_timers' supervisor) and "watcher", once each has started."""
    import psutil

    wanted = {"web": "gunicorn", "cluster": "qcluster", "timers": "run_timers"}
    wanted["watcher"] = "watch_queues"
    deadline = time.monotonic() + timeout
    while True:
        found: dict[str, int] = {}
        lines: dict[int, tuple[int, str]] = {}
        for child in psutil.Process(service.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                lines[child.pid] = (child.ppid(), " ".join(child.cmdline()))
        for pid, (parent, line) in lines.items():
            for name, marker in wanted.items():
                # The topmost process of each: not a worker a matching parent forked.
                if marker in line and marker not in lines.get(parent, (0, ""))[1]:
                    found[name] = pid
        if len(found) == len(wanted) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def database_transactions(dbname: str) -> int:
    """Transactions the database `dbname` committed or rolled back so far (pg_stat_database,
    read from another database; a backend reports its counts when its transaction ends, within
    a second)."""
    with _admin_connect() as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
            [dbname],
        ).fetchone()
    return int(row[0])


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and all its descendants alive now."""
    import psutil

    total = 0.0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


def idle_cost(pid: int, dbname: str, seconds: float) -> dict[str, float]:
    """Transactions per second of `dbname` and CPU (share of one core) of `pid`'s process tree
    over `seconds` of whatever the service does by itself."""
    before, cpu_before = database_transactions(dbname), tree_cpu_seconds(pid)
    started = time.monotonic()
    time.sleep(seconds)
    time.sleep(1.5)  # the last transactions' counts reach pg_stat_database
    after, cpu_after = database_transactions(dbname), tree_cpu_seconds(pid)
    elapsed = time.monotonic() - started
    return {
        "seconds": round(elapsed, 1),
        "transactions_per_second": round((after - before) / elapsed, 2),
        "cpu_percent_of_one_core": round(100 * (cpu_after - cpu_before) / elapsed, 2),
    }


def notify_on_insert_sql(channel: str, table: str, payload: str, *, when: str = "") -> str:
    """A bench-only trigger (never in the product): NOTIFY `channel` with `payload` (an
    expression over NEW) for each row inserted into `table` (only rows meeting `when`, a
    condition over NEW, when given), delivered at the inserting transaction's commit."""
    condition = f"WHEN ({when}) " if when else ""
    return f"""
CREATE OR REPLACE FUNCTION {channel}() RETURNS trigger AS $$
BEGIN
  PERFORM pg_notify('{channel}', ({payload})::text);
  RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER {channel} AFTER INSERT ON {table}
  FOR EACH ROW {condition}EXECUTE FUNCTION {channel}();
"""


# NOTIFY `bench_consumed` with the event id when a run's consumed-event link is inserted,
# delivered at that run's commit.
CONSUMED_NOTIFY_SQL = notify_on_insert_sql(
    "bench_consumed", "assets_app_dagrunassetevent", "NEW.asset_event_id"
)


class NotifyListener:
    """LISTENs on `channels` of database `url` in a thread of its own and records, per channel,
    the wall-clock time each payload was first received (a NOTIFY is delivered at the commit of
    the transaction that sent it: the receipt is the moment its rows became visible)."""

    def __init__(self, url: str, channels: Sequence[str]) -> None:
        import threading

        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)
        for channel in channels:
            self.conn.execute(f'LISTEN "{channel}"')
        self.received: dict[str, dict[str, float]] = {channel: {} for channel in channels}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for note in self.conn.notifies(timeout=0.2):
                self.received[note.channel].setdefault(note.payload, time.time())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        with contextlib.suppress(Exception):
            self.conn.close()


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss
    return total


def log_path(name: str, what: str) -> Path:
    path = ROOT / "var" / "bench-logs"  # git-ignored
    path.mkdir(parents=True, exist_ok=True)
    return path / f"{name}.{what}.log"
