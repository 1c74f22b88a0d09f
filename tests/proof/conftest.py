"""Shared fixtures of the proof suites: real server processes against the pytest-django test
database, thread helpers that always close their connections, and whole-database snapshots.

Every scenario here uses `transaction=True` databases: the subprocesses (gunicorn, qcluster) and
the test's own threads must see each other's commits. Subprocesses get `DATABASE_URL` built from
the live test connection, so they talk to `test_<name>`, never to a developer's database. They
are started in their own session (process group) so a test can SIGKILL the whole server at once,
and every one still alive is killed before pytest-django flushes the database.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests
from django.apps import apps
from django.conf import settings
from django.db import connection, connections

ROOT = Path(__file__).resolve().parents[2]
FIGURES: list[str] = []


def figure(line: str) -> None:
    """Record a scenario's figures: printed now (with -s) and again in pytest's terminal summary,
    so a plain `bin/test` run (CI's log) shows them too."""
    print(f"\n{line}")
    FIGURES.append(line)


def pytest_terminal_summary(terminalreporter) -> None:
    if FIGURES:
        terminalreporter.section("proof suite figures")
        for line in FIGURES:
            terminalreporter.write_line(line)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def database_url() -> str:
    """The URL of the database this test process uses (the pytest-django test database)."""
    s = connection.settings_dict
    auth = quote(s["USER"] or "", safe="")
    if s.get("PASSWORD"):
        auth += ":" + quote(s["PASSWORD"], safe="")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def wait_until(predicate: Callable[[], Any], *, timeout: float, interval: float = 0.05) -> Any:
    """Poll `predicate` until it returns something truthy; fail the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout} s: {predicate}")
        time.sleep(interval)


def run_in_threads(targets: list[Callable[[], Any]], *, timeout: float) -> list[Any]:
    """Run each callable in its own thread and return their results in order.

    Each thread closes its database connection when done. An exception in any thread is
    re-raised here (the first one), after all threads have finished.
    """
    results: list[Any] = [None] * len(targets)
    errors: list[BaseException] = []

    def wrap(i: int, fn: Callable[[], Any]) -> None:
        try:
            results[i] = fn()
        except BaseException as exc:  # re-raised in the main thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=wrap, args=(i, fn), daemon=True) for i, fn in enumerate(targets)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    alive = [t for t in threads if t.is_alive()]
    if alive:
        pytest.fail(f"{len(alive)} thread(s) still running after {timeout} s")
    if errors:
        raise errors[0]
    return results


def app_table_counts() -> dict[str, int]:
    """Row count of every table of the app, django_q and auth: a cheap whole-database snapshot.

    The metric counters are left out: every request, rejected ones included, is counted in the
    request-latency histogram (that is what it is for)."""
    tables = sorted(
        model._meta.db_table
        for model in apps.get_models(include_auto_created=True)
        if model._meta.app_label in {"assets_app", "django_q", "auth"}
        and not model._meta.proxy
        and model._meta.managed
        and model._meta.db_table != "assets_app_metriccounter"
    )
    sql = " UNION ALL ".join(f"SELECT '{t}', count(*) FROM {t}" for t in tables)
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return dict(cursor.fetchall())


def pg_deadlocks() -> int:
    """Deadlocks PostgreSQL has detected in this database since its statistics were reset.

    Backends report their statistics when a transaction ends (at most once a second) and when
    they exit; callers close their threads' connections first, and this waits for the flush.
    """
    time.sleep(1.2)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


class ServiceProcess:
    """A server subprocess (gunicorn or qcluster) in its own process group, logging to a file."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.argv = argv
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.starts += 1
        log = open(self.log_path, "ab")  # noqa: SIM115 (owned by the child for its lifetime)
        log.write(f"\n===== start {self.starts}: {' '.join(self.argv)}\n".encode())
        log.flush()
        self.proc = subprocess.Popen(
            self.argv,
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL the whole process group (master and every child), like a host dying."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        # Children reparented to init may outlive the leader for a moment.
        deadline = time.monotonic() + 10
        while _group_alive(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.02)

    def stop(self, *, timeout: float = 15) -> None:
        """SIGTERM, then SIGKILL if it does not exit in time."""
        if self.proc is None or self.proc.poll() is not None:
            self.kill()
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=timeout)
        self.kill()

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Gunicorn(ServiceProcess):
    def __init__(self, env: dict[str, str], log_path: Path, *, workers: int, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        argv = [
            sys.executable,
            "-m",
            "gunicorn",
            "project.wsgi",
            "-w",
            str(workers),
            "-b",
            f"127.0.0.1:{port}",
            "--timeout",
            "60",
            "--graceful-timeout",
            "5",
        ]
        super().__init__(argv, env, log_path)

    def start(self, *, wait: float = 60) -> None:
        super().start()
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                pytest.fail(f"gunicorn exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                requests.get(f"{self.url}/execution/openapi.json", timeout=2)
                return
            except requests.RequestException:
                time.sleep(0.1)
        pytest.fail(f"gunicorn did not answer within {wait} s:\n{self.log_tail()}")


class QCluster(ServiceProcess):
    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        super().__init__([sys.executable, "manage.py", "qcluster"], env, log_path)


@pytest.fixture
def service_env(transactional_db, tmp_path) -> dict[str, str]:
    """Environment for a server subprocess: the test database, this process's secrets, a fresh
    multiprocess directory for the latency histogram (as bin/serve sets up)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DJANGO_SETTINGS"))}
    env.update(
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prometheus"),
        DATABASE_URL=database_url(),
        DJANGO_SETTINGS_MODULE="project.settings",
        SECRET_KEY=settings.SECRET_KEY,
        WORKER_API_KEY=settings.WORKER_API_KEY,
        DEBUG="false",
        ALLOWED_HOSTS="127.0.0.1,localhost",
        LOG_LEVEL="WARNING",
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.fixture
def servers(service_env, tmp_path) -> Iterator[Callable[..., ServiceProcess]]:
    """Factory: `servers("gunicorn", workers=4)` / `servers("qcluster", **env)`; all are killed
    at teardown, before the database is flushed."""
    started: list[ServiceProcess] = []

    def make(kind: str, *, workers: int = 2, env: dict[str, str] | None = None) -> Any:
        full_env = {**service_env, **(env or {})}
        log = tmp_path / f"{kind}-{len(started)}.log"
        if kind == "gunicorn":
            server: ServiceProcess = Gunicorn(full_env, log, workers=workers, port=free_port())
        elif kind == "qcluster":
            server = QCluster(full_env, log)
        else:
            raise ValueError(kind)
        started.append(server)
        server.start()
        return server

    yield make
    for server in started:
        server.stop(timeout=3)


def make_scheduled_dag(
    dag_id: str,
    schedule: Any,
    *,
    max_active_runs: int = 1_000_000,
    task_ids: tuple[str, ...] = ("consume",),
) -> Any:
    """A Dag scheduled on `schedule` (raw condition) with its schedule references and tasks, the
    way `sync_dags` stores them; assets named by the condition are created (name == uri when only
    one is given)."""
    from assets_app import conditions
    from assets_app.models import (
        Asset,
        AssetAlias,
        Dag,
        DagScheduleAliasReference,
        DagScheduleAssetReference,
        Task,
    )

    condition = conditions.parse(schedule)
    dag = Dag.objects.create(
        dag_id=dag_id, schedule=conditions.to_json(condition), max_active_runs=max_active_runs
    )
    for ref in conditions.referenced_assets(condition):
        asset, _ = Asset.objects.get_or_create(name=ref.name, defaults={"uri": ref.uri})
        DagScheduleAssetReference.objects.create(dag=dag, asset=asset)
    for name in conditions.referenced_aliases(condition):
        alias, _ = AssetAlias.objects.get_or_create(name=name)
        DagScheduleAliasReference.objects.create(dag=dag, alias=alias)
    for task_id in task_ids:
        Task.objects.create(dag=dag, task_id=task_id)
    return dag


def make_running_tis(dag_id: str, count: int, *, task_id: str = "emit") -> list[Any]:
    """`count` running TIs of one manual run of a producer Dag (map indexes 0..count-1)."""
    from django.utils import timezone

    from assets_app.models import Dag, DagRun, DagRunState, DagRunType, TaskInstance, TIState

    dag, _ = Dag.objects.get_or_create(dag_id=dag_id)
    run = DagRun.objects.create(
        dag=dag,
        run_id=f"manual__{dag_id}_{DagRun.objects.filter(dag=dag).count()}",
        run_type=DagRunType.MANUAL,
        state=DagRunState.RUNNING,
    )
    now = timezone.now()
    return TaskInstance.objects.bulk_create(
        TaskInstance(
            dag_run=run,
            dag_id=dag_id,
            run_id=run.run_id,
            task_id=task_id,
            map_index=i,
            try_number=1,
            state=TIState.RUNNING,
            hostname="proof-worker",
            unixname="proof",
            pid=4242,
            start_date=now,
        )
        for i in range(count)
    )


def consumption_report() -> dict[str, Any]:
    """Check invariant 8 over the whole database and return the figures.

    Every committed event of asset S is consumed exactly once by each Dag scheduled on S and by
    no other Dag; no asset-triggered run consumes zero events.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT count(*) FROM (
              SELECT r.dag_id, e.id FROM assets_app_assetevent e
              JOIN assets_app_dagscheduleassetreference r ON r.asset_id = e.asset_id
              EXCEPT
              SELECT dag_id, asset_event_id FROM assets_app_dagrunassetevent
            ) AS missing
            """
        )
        missed = cursor.fetchone()[0]
        cursor.execute(
            """
            SELECT count(*) FROM assets_app_dagrunassetevent c
            JOIN assets_app_assetevent e ON e.id = c.asset_event_id
            WHERE NOT EXISTS (
              SELECT 1 FROM assets_app_dagscheduleassetreference r
              WHERE r.asset_id = e.asset_id AND r.dag_id = c.dag_id)
            """
        )
        foreign = cursor.fetchone()[0]
        cursor.execute(
            """
            SELECT count(*) FROM (
              SELECT dag_id, asset_event_id FROM assets_app_dagrunassetevent
              GROUP BY 1, 2 HAVING count(*) > 1) AS d
            """
        )
        doubled = cursor.fetchone()[0]
        cursor.execute(
            """
            SELECT count(*) FROM assets_app_dagrun r
            WHERE r.run_type = 'asset_triggered' AND NOT EXISTS (
              SELECT 1 FROM assets_app_dagrunassetevent c WHERE c.dag_run_id = r.id)
            """
        )
        empty_runs = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM assets_app_dagrun WHERE run_type = 'asset_triggered'")
        runs = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM assets_app_dagrunassetevent")
        consumptions = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM assets_app_assetevent")
        events = cursor.fetchone()[0]
    return {
        "events": events,
        "runs": runs,
        "consumptions": consumptions,
        "missed": missed,
        "foreign": foreign,
        "doubled": doubled,
        "empty_runs": empty_runs,
    }
