"""Finding 6 of issue 13: a database that is full or away is a 503 with Retry-After, never a 500.

A private PostgreSQL cluster (initdb into a temporary directory, its own port, max_connections
16; never the shared server) serves a gunicorn with the connection pool and one without. While
the reference worker runs 24 task instances through them, the test takes every connection slot
of the cluster and terminates the service's sessions, so neither server can get a connection:
every answer is a 503 with `Retry-After` and `detail.reason` (the admin a plain 503 page), the
worker waits them out. Then the slots are released: every TI succeeds, every outlet is registered
once, nothing is lost, and no server logged a traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import requests

from tests.servers import Server, free_port, gunicorn

from .conftest import GUNICORN_ARGS, ROOT, figure

pytestmark = pytest.mark.slow

PG_BIN = Path("/usr/lib/postgresql/15/bin")
MAX_CONNECTIONS = 16
TASKS = 24


def _as_postgres(argv: list[str]) -> list[str]:
    """Run a PostgreSQL server binary as the `postgres` OS user when we are root (it refuses to
    run as root)."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *argv]
    return argv


@pytest.fixture
def private_postgres() -> Iterator[str]:
    """A throw-away cluster on its own port; yields its server URL (no database name)."""
    if not (PG_BIN / "initdb").exists():
        pytest.skip(f"no PostgreSQL server binaries in {PG_BIN}")
    if os.geteuid() == 0 and not shutil.which("runuser"):
        pytest.skip("running as root without runuser: cannot start a private cluster")
    base = Path(tempfile.mkdtemp(prefix="aes-private-pg-"))
    if os.geteuid() == 0:
        try:
            shutil.chown(base, user="postgres", group="postgres")
        except (LookupError, PermissionError) as exc:
            shutil.rmtree(base, ignore_errors=True)
            pytest.skip(f"cannot hand a directory to the postgres user: {exc}")
    data, log = base / "data", base / "server.log"
    port = free_port()
    initdb = subprocess.run(
        _as_postgres(
            [str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-N"]
        ),
        capture_output=True,
        text=True,
    )
    if initdb.returncode != 0:
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"initdb failed: {initdb.stderr[-500:]}")
    options = (
        f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c max_connections={MAX_CONNECTIONS} "
        "-c superuser_reserved_connections=0 -c fsync=off -c synchronous_commit=off"
    )
    pg_ctl = [str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60"]
    subprocess.run(_as_postgres([*pg_ctl, "-o", options, "start"]), check=True)
    try:
        yield f"postgres://postgres@127.0.0.1:{port}"
    finally:
        subprocess.run(_as_postgres([*pg_ctl, "-m", "immediate", "stop"]), capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def _manage(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


class SlotHolder:
    """Takes every free connection slot of the cluster and keeps the service out of it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.held: list[psycopg.Connection] = []

    def _fill(self) -> None:
        while True:
            try:
                self.held.append(psycopg.connect(self.url, autocommit=True, connect_timeout=5))
            except psycopg.OperationalError as exc:
                assert "too many clients" in str(exc), exc
                return

    def _others(self) -> list[int]:
        mine = [c.info.backend_pid for c in self.held]
        return [
            pid
            for (pid,) in self.held[0].execute(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' "
                "AND pid <> ALL(%s)",
                [mine],
            )
        ]

    def take_all(self, *, timeout: float = 30) -> None:
        """Every slot ours: fill, terminate everyone else, fill the slots they freed (the
        service's pools race us for them), until no other session is left."""
        self._fill()
        assert self.held, "no free slot at all"
        deadline = time.monotonic() + timeout
        while others := self._others():
            assert time.monotonic() < deadline, f"sessions still in: {others}"
            self.held[0].execute(
                "SELECT pg_terminate_backend(pid) FROM unnest(%s) AS pid", [others]
            )
            time.sleep(0.05)
            self._fill()

    def still_all_ours(self) -> bool:
        return not self._others()

    def release(self) -> None:
        for conn in self.held:
            conn.close()
        self.held.clear()


def _dag_file(directory: Path) -> Path:
    path = directory / "full.json"
    path.write_text(
        json.dumps(
            {
                "dag_id": "full_producer",
                "is_paused": False,  # a sync pauses a new Dag unless it says so (issue 39)
                "tasks": [
                    {"task_id": f"t{i}", "outlets": [{"name": f"full-{i}", "uri": f"full://{i}"}]}
                    for i in range(TASKS)
                ],
            }
        )
    )
    return path


def _wait_for_successes(url: str, count: int, *, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            done = conn.execute(
                "SELECT count(*) FROM assets_app_taskinstance WHERE state = 'success'"
            ).fetchone()[0]
            if done >= count:
                return
            assert time.monotonic() < deadline, f"only {done} TIs succeeded in {timeout} s"
            time.sleep(0.05)


def _outage_answers(pooled: Server, plain: Server, session: requests.Session, env) -> dict:
    """What the service answers while the database has no slot for it."""
    claim = {"hostname": "probe", "limit": 1}
    headers = {"Authorization": f"Bearer {env['WORKER_API_KEY']}"}
    answers = {}
    for name, server in (("pooled", pooled), ("plain", plain)):
        started = time.monotonic()
        response = requests.post(
            f"{server.url}/execution/workloads/claim", json=claim, headers=headers, timeout=30
        )
        answers[name] = (response, time.monotonic() - started)
    answers["admin"] = (session.get(f"{pooled.url}/admin/assets_app/dag/", timeout=30), 0.0)
    return answers


def test_database_out_of_connections_is_503_then_everything_recovers(private_postgres, tmp_path):
    url = f"{private_postgres}/aes_full"
    with psycopg.connect(f"{private_postgres}/postgres", autocommit=True) as admin:
        admin.execute("CREATE DATABASE aes_full")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DJANGO_"))}
    env.update(
        DATABASE_URL=url,
        DJANGO_SETTINGS_MODULE="project.settings",
        SECRET_KEY="db-full-proof-secret-" + "k" * 40,
        WORKER_API_KEY="db-full-proof-worker-" + "w" * 20,
        KEY_DIR=str(tmp_path / "keys"),
        DEBUG="false",
        LOG_LEVEL="WARNING",
        PYTHONUNBUFFERED="1",
        DATABASE_POOL="true",
        DATABASE_POOL_MAX_SIZE="2",
        DATABASE_POOL_TIMEOUT_SECONDS="1",
        DATABASE_RETRY_AFTER_SECONDS="1",
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prometheus"),
    )
    _manage(env, "migrate", "--noinput", "-v0")
    _manage(env, "sync_dags", str(_dag_file(tmp_path)))
    _manage(env, "trigger_dag", "full_producer")
    _manage(env, "bootstrap_admin", "--password", "db-full-proof-admin")

    pooled = gunicorn(
        env, tmp_path / "gunicorn-pooled.log", workers=2, args=GUNICORN_ARGS, start=False
    )
    plain = gunicorn(
        {**env, "DATABASE_POOL": "false"},
        tmp_path / "gunicorn-plain.log",
        workers=1,
        args=GUNICORN_ARGS,
        start=False,
    )
    worker = Server(
        [
            sys.executable,
            "manage.py",
            "run_worker",
            "--url",
            pooled.url,
            "--concurrency",
            "4",
            "--task-seconds",
            "0.3",
            "--max-tis",
            str(TASKS),
            "--max-seconds",
            "150",
        ],
        env,
        tmp_path / "worker.log",
    )
    holder = SlotHolder(f"{private_postgres}/aes_full")
    try:
        pooled.start()
        plain.start()
        session = requests.Session()
        login = session.get(f"{pooled.url}/admin/login/", timeout=30)
        assert login.status_code == 200
        session.post(
            f"{pooled.url}/admin/login/?next=/admin/",
            data={
                "username": "admin",
                "password": "db-full-proof-admin",
                "csrfmiddlewaretoken": session.cookies["csrftoken"],
            },
            timeout=30,
        )
        assert session.get(f"{pooled.url}/admin/assets_app/dag/", timeout=30).status_code == 200
        assert requests.get(f"{plain.url}/healthz", timeout=30).json()["database"] == "ok"

        worker.start()
        _wait_for_successes(url, 4)  # the worker is in the middle of its TIs
        holder.take_all()
        outage_started = time.monotonic()
        answers = _outage_answers(pooled, plain, session, env)
        time.sleep(3.0)  # the worker keeps asking and waiting through the outage
        assert holder.still_all_ours()
        holder.release()
        outage = time.monotonic() - outage_started

        for name in ("pooled", "plain"):
            response, _ = answers[name]
            assert response.status_code == 503, (name, response.status_code, response.text)
            assert response.headers["Retry-After"] == "1"
            detail = response.json()["detail"]
            assert detail["reason"] in {"database_busy", "database_unavailable"}, detail
            assert "retry" in detail["message"]
        assert answers["pooled"][1] < 10  # the pool timeout (1 s), not a hang
        page, _ = answers["admin"]
        assert page.status_code == 503 and page.headers["Retry-After"] == "1"
        assert page.headers["Content-Type"].startswith("text/html")

        assert worker.proc is not None
        worker.proc.wait(timeout=170)
        worker_log = worker.log_tail(20000)
        assert f"done: claimed {TASKS}, succeeded {TASKS}, failed 0, retried 0, errors 0" in (
            worker_log
        ), worker_log
        waited = int(worker_log.rsplit("503s waited out ", 1)[1].split()[0])
        assert waited >= 2  # the worker met the outage in the middle of its work

        # Recovered: both servers answer again, from the same processes.
        assert requests.get(f"{plain.url}/healthz", timeout=30).json()["database"] == "ok"
        assert session.get(f"{pooled.url}/admin/assets_app/dag/", timeout=30).status_code == 200
    finally:
        holder.release()
        worker.stop(timeout=3)
        pooled.stop(timeout=3)
        plain.stop(timeout=3)

    _manage(env, "drain_asset_queue", "--once")
    with psycopg.connect(url) as conn:
        states = dict(
            conn.execute("SELECT state, count(*) FROM assets_app_taskinstance GROUP BY 1")
        )
        events = conn.execute(
            "SELECT count(*), count(DISTINCT source_ti_id) FROM assets_app_assetevent"
        ).fetchone()
        outbox = conn.execute("SELECT count(*) FROM assets_app_asseteventqueue").fetchone()[0]
    assert states == {"success": TASKS}
    assert events == (TASKS, TASKS)  # every outlet registered, none twice
    assert outbox == 0
    for server in (pooled, plain):
        log = server.log_path.read_text(errors="replace")
        assert "Traceback" not in log, log[-3000:]
    figure(
        f"db full: every slot of a {MAX_CONNECTIONS}-connection cluster taken for {outage:.1f} s: "
        f"503 + Retry-After (pooled {answers['pooled'][0].json()['detail']['reason']} in "
        f"{answers['pooled'][1]:.1f} s, plain {answers['plain'][0].json()['detail']['reason']}), "
        f"the worker waited out {waited} 503s; {TASKS}/{TASKS} TIs succeeded, {events[0]} events, "
        "nothing lost"
    )
    with contextlib.suppress(Exception):
        shutil.rmtree(tmp_path / "prometheus")
