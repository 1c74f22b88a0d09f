"""Stock Airflow 3.3.2 with LocalExecutor from `.venv-airflow-worker`, for the benchmarks and the
differential harness (issues 27 and 39): the lightest setup that runs real tasks.

`StockAirflow(dags, home)`: `airflow db migrate` on a SQLite file in `home` (a temporary
AIRFLOW_HOME), then `airflow api-server` (the execution API the task supervisor talks to, and the
public REST API), `airflow scheduler` (LocalExecutor, `[core] parallelism`) and
`airflow dag-processor` (and `airflow triggerer`, which runs deferred tasks, with `triggerer`),
each a `tests.servers.Server` in its own process group (a stop takes
the scheduler's LocalExecutor workers and task supervisors with it). `rows()` reads Airflow's
own metadata database (read only, a new connection per call: the scheduler writes it). SQLite
runs in write-ahead-log mode with a 60 s lock wait (`airflow_env`): with a 5 s wait, the API
answered 500 ("database is locked") while 80 Dags ran.

With `all_admins` (the harness), Airflow's simple auth manager treats every REST call as an
admin's (`[core] simple_auth_manager_all_admins`): the API is on 127.0.0.1 only.

Plain Python (no Django): run with the checkout's interpreter; Airflow itself runs in its own
virtualenv's processes.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import time
from pathlib import Path

from tests import servers

ROOT = Path(__file__).resolve().parents[1]
AIRFLOW_VENV = ROOT / ".venv-airflow-worker"
AIRFLOW = AIRFLOW_VENV / "bin/airflow"
SQLITE_MODULE = "stock_airflow_sqlite"


def airflow_env(
    home: Path,
    dags: Path,
    port: int,
    *,
    parallelism: int,
    paused_at_creation: bool = False,
    all_admins: bool = False,
) -> dict[str, str]:
    """The environment of every Airflow process: SQLite in `home`, `dags` as the Dag folder,
    LocalExecutor with `parallelism` slots, the API on 127.0.0.1:`port`."""
    from cryptography.fernet import Fernet

    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": str(parallelism),
        # A Dag's tasks all at once, as the service runs them (it has no max_active_tasks: a
        # Dag setting one is refused, issue 39, so the file leaves it to this setting).
        "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "64",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": str(paused_at_creation),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        # One secret for the scheduler (signs each task's token) and the API server (checks it).
        "AIRFLOW__API_AUTH__JWT_SECRET": "stock-" + os.urandom(16).hex(),
        "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": str(all_admins),
        # A TI queued for more than this is taken back and queued again at the next try (600 s
        # by default): 80 Dags on `parallelism` 2 of a loaded 2-core machine waited that long,
        # and ran at try 2 for it.
        "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "7200",
        # A task's calls to the api-server wait 60 s instead of 5 (Airflow's own advice "under
        # high load"): at load 10 its root tasks failed on httpx.ReadTimeout before running any
        # code, and the differential test counted that as Airflow's result (a suite run beside
        # other sessions: diff_branching and diff_mapping_second_order).
        "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",
    }
    # The checkout's interpreter may have set these for itself: not Airflow's business.
    for name in ("VIRTUAL_ENV", "DJANGO_SETTINGS_MODULE"):
        env.pop(name, None)
    # SQLite's lock wait: 60 s instead of 5 (the scheduler, the API's task updates and a client's
    # REST calls write at once; Airflow answers 500 on "database is locked"), for both of
    # Airflow's engines (sqlite3 and aiosqlite take the same `timeout`).
    env["PYTHONPATH"] = str(home)
    env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS"] = f"{SQLITE_MODULE}.CONNECT_ARGS"
    env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC"] = f"{SQLITE_MODULE}.CONNECT_ARGS"
    return env


class StockAirflow:
    """Airflow's api-server, scheduler and dag-processor on `dags`, logs in `logs/airflow-*.log`.

    Use as a context manager: entering migrates the database and starts the three processes
    (the API answering), leaving stops them all (SIGTERM, then SIGKILL to each group)."""

    def __init__(
        self,
        dags: Path,
        home: Path,
        logs: Path,
        *,
        parallelism: int = 4,
        paused_at_creation: bool = False,
        all_admins: bool = False,
        triggerer: bool = False,
        ready_timeout: float = 300.0,
    ) -> None:
        self.home = Path(home)
        self.db = self.home / "airflow.db"
        self.port = servers.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = airflow_env(
            self.home,
            Path(dags),
            self.port,
            parallelism=parallelism,
            paused_at_creation=paused_at_creation,
            all_admins=all_admins,
        )
        self.logs = Path(logs)
        self.ready_timeout = ready_timeout
        self.commands = [["api-server", "--workers", "1"], ["scheduler"], ["dag-processor"]]
        if triggerer:
            self.commands.append(["triggerer"])
        self.processes: list[servers.Server] = []

    def __enter__(self) -> StockAirflow:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / f"{SQLITE_MODULE}.py").write_text('CONNECT_ARGS = {"timeout": 60}\n')
        subprocess.run(
            [str(AIRFLOW), "db", "migrate"], env=self.env, check=True, capture_output=True
        )
        # Write-ahead logging (kept in the file): readers (the harness, the API) no longer wait
        # for the scheduler's writes. How SQLite journals, not what Airflow stores.
        with contextlib.closing(sqlite3.connect(self.db)) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
        try:
            for command in self.commands:
                server = servers.Server(
                    [str(AIRFLOW), *command],
                    self.env,
                    self.logs / f"airflow-{command[0]}.log",
                    url=self.url if command[0] == "api-server" else None,
                    ready_path="/api/v2/version",
                    ready_timeout=self.ready_timeout,
                    stop_timeout=30.0,
                )
                self.processes.append(server.start())
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        for server in self.processes:
            with contextlib.suppress(ProcessLookupError):
                if server.running:
                    server.proc.terminate()  # type: ignore[union-attr]
        for server in self.processes:
            server.stop()
        self.processes = []

    def rows(self, query: str, *args: object) -> list[tuple]:
        """`query`'s rows from Airflow's database; [] while a table does not exist yet."""
        try:
            with contextlib.closing(sqlite3.connect(self.db, timeout=30)) as conn:
                return conn.execute(query, args).fetchall()
        except sqlite3.OperationalError:
            return []

    def wait(self, predicate, seconds: float, what: str) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.5)
        raise TimeoutError(f"airflow: {what} not done within {seconds:g}s")
