"""Shared fixtures of the proof suites: real server processes against the pytest-django test
database, thread helpers that always close their connections, and whole-database snapshots.

Every scenario here uses `transaction=True` databases: the subprocesses (gunicorn, qcluster) and
the test's own threads must see each other's commits. Subprocesses get `DATABASE_URL` built from
the live test connection, so they talk to `test_<name>`, never to a developer's database. They
are started in their own session (process group) so a test can SIGKILL the whole server at once,
and every one still alive is killed before pytest-django flushes the database.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.apps import apps
from django.conf import settings
from django.db import connection, connections

import tests.conftest
from tests.servers import Server, gunicorn, qcluster, timers

ROOT = Path(__file__).resolve().parents[2]
# The proof suites' gunicorn: a request may wait a minute on a loaded machine; stop quickly.
GUNICORN_ARGS = ("--timeout", "60", "--graceful-timeout", "5")


def figure(line: str) -> None:
    """Record a scenario's figures: printed now (with -s) and again in pytest's terminal summary
    (tests/conftest.py), so a plain `bin/test` run (CI's log) shows them too, from every
    pytest-xdist worker."""
    print(f"\n{line}")
    tests.conftest.record_figure(line)


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


def holds_row_locks(table: str) -> bool:
    """Does another session hold row locks on `table` (SELECT ... FOR UPDATE in an open
    transaction: a drain batch, a scheduler pass)? A kill timed on this lands mid-transaction."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
            WHERE c.relname = %s AND l.mode = 'RowShareLock'
              AND l.granted AND l.pid <> pg_backend_pid()
            """,
            [table],
        )
        return cursor.fetchone()[0] > 0


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


def service_environment(prometheus_dir: Path) -> dict[str, str]:
    """Environment for a server subprocess: the test database, this process's secrets, a fresh
    multiprocess directory for the latency histogram (as bin/serve sets up) at `prometheus_dir`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DJANGO_SETTINGS"))}
    env.update(
        PROMETHEUS_MULTIPROC_DIR=str(prometheus_dir),
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
def service_env(transactional_db, tmp_path) -> dict[str, str]:
    """`service_environment` for a test (its histogram directory under `tmp_path`)."""
    return service_environment(tmp_path / "prometheus")


@pytest.fixture
def servers(service_env, tmp_path) -> Iterator[Callable[..., Server]]:
    """Factory: `servers("gunicorn", workers=4)` / `servers("qcluster", env=...)` /
    `servers("timers")`, started (a gunicorn answering HTTP); all are killed at teardown,
    before the database is flushed."""
    started: list[Server] = []

    def make(kind: str, *, workers: int = 2, env: dict[str, str] | None = None) -> Server:
        full_env = {**service_env, **(env or {})}
        log = tmp_path / f"{kind}-{len(started)}.log"
        if kind == "gunicorn":
            server = gunicorn(full_env, log, workers=workers, args=GUNICORN_ARGS, start=False)
        elif kind == "qcluster":
            server = qcluster(full_env, log, start=False)
        elif kind == "timers":
            server = timers(full_env, log, start=False)
        else:
            raise ValueError(kind)
        started.append(server)
        return server.start()

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
    from assets_app.definitions import conditions
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
