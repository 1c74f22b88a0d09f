"""The differential harness against Airflow itself (issue 39): one folder of DAG files run on
stock Airflow 3.3.2 and on this service, the same runs triggered on both, and the results
compared run by run.

    .venv/bin/python tools/differential.py DAG_FOLDER [--dags ID ...] [--examples]
        [--concurrency 2] [--timeout 600] [--out tools/results/differential.json]

- **Airflow**: `tools.stock_airflow.StockAirflow` (its api-server, scheduler with LocalExecutor,
  dag-processor and triggerer from `.venv-airflow-worker`, on a SQLite database of its own in a
  temporary AIRFLOW_HOME). The harness waits until the dag-processor's view of the folder (the
  Dags and the import errors it stored) has not changed for `SETTLE` seconds.
- **The service**: `bin/serve` on a PostgreSQL database of its own (`--database`, dropped and
  created), the folder synced with `bin/airflow-worker --sync-only`, the TIs run by
  `bin/airflow-worker --no-sync` (its pool of processes running Airflow's own supervisor).

Both start paused at creation (each side's default), then, through each side's public REST API
(the same calls: `POST /api/v2/dags/{id}/dagRuns` with `CONF` and the logical date
`LOGICAL_DATE`, `PATCH /api/v2/dags/{id}` `is_paused: false`), each Dag is triggered once and
unpaused: on both sides every Dag is triggered while paused (its run waits, queued) and unpaused
after the last trigger, so the burst of API calls does not meet the tasks' own. An
unpaused scheduled Dag may also get its scheduled run on either side (and a consumer its
asset-triggered run): only the manual runs the harness triggered are compared. It waits until
every triggered run is finished on both sides (or `--timeout`), then reads each side's own
database and compares per run (a trigger one side refuses and the other accepts is a
difference of the Dag's `trigger` field: the refusal's status and detail against the run id):

- the run's state;
- each TI, keyed by (task_id, map_index): its final state and try number (a TI on one side only
  is a difference too);
- the XCom return values (`return_value` key) as JSON;
- the asset events the run's tasks emitted: (asset uri, asset name, extra), as a sorted list.

Dags are chosen from those both sides load: every one (or `--dags`), less the ones
`tools/differential.json` skips (`skip`: Dag id -> why, e.g. an outside system it needs). A Dag
Airflow loads and the service refuses (an import error of its file) is reported as
`refused: <the service's reason>`, never as differences. A difference matching an entry of
`divergences` in `tools/differential.json` (Dag, task, field, and the two values when the entry
names them; `*` for any) is documented: reported apart with its kind (`deliberate`: the service
differs by design; `open`: not fixed yet; `environment`: the run's surroundings, such as a path
or the clock, not either system) and its reason, and not a failure.

Prints a table (one row per Dag: equal, differ, divergent, refused, skipped, unfinished) and the
differences (Dag, task, field, Airflow's value, ours), and writes the whole as JSON to `--out`.
Exit status 1 when an undocumented difference or an unfinished run is left.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python tools/differential.py`
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import requests  # noqa: E402

from tests import servers  # noqa: E402
from tools.stock_airflow import AIRFLOW_VENV, StockAirflow  # noqa: E402

PG = os.environ.get("DIFFERENTIAL_PG_URL", "postgres://postgres@127.0.0.1:5432")
DATA = ROOT / "tools/differential.json"
RESULTS = ROOT / "tools/results"
LOGICAL_DATE = "2026-01-01T00:00:00Z"
CONF: dict = {}
FINISHED = {"success", "failed"}
KINDS = ("deliberate", "open", "environment")
SETTLE = 20.0  # seconds without a change in what Airflow's dag-processor stored
KEY = "differential-worker-key-" + "x" * 24
EXAMPLE_FOLDERS = (
    AIRFLOW_VENV / "lib/python3.11/site-packages/airflow/example_dags",
    AIRFLOW_VENV / "lib/python3.11/site-packages/airflow/providers/standard/example_dags",
)


# ----------------------------------------------------------------------------------------------
# Comparison (pure: unit-testable without either side)


@dataclass
class RunResult:
    """What one side stored of one run."""

    state: str | None
    tis: dict[str, list] = field(default_factory=dict)  # "task[map_index]" -> [state, try]
    xcoms: dict[str, object] = field(default_factory=dict)  # "task[map_index]" -> return value
    events: list[list] = field(default_factory=list)  # sorted [uri, name, extra]


def ti_key(task_id: str, map_index: int) -> str:
    return task_id if map_index < 0 else f"{task_id}[{map_index}]"


def compare(dag_id: str, airflow: RunResult, ours: RunResult) -> list[dict]:
    """The differences between Airflow's run and ours: dicts of dag, task, field, airflow, ours
    (`task` is "" for a run's own field)."""
    out: list[dict] = []

    def differ(task: str, name: str, theirs: object, mine: object) -> None:
        if theirs != mine:
            out.append(
                {"dag": dag_id, "task": task, "field": name, "airflow": theirs, "ours": mine}
            )

    differ("", "run.state", airflow.state, ours.state)
    for key in sorted(set(airflow.tis) | set(ours.tis)):
        theirs, mine = airflow.tis.get(key), ours.tis.get(key)
        if theirs is None or mine is None:
            differ(key, "ti", theirs, mine)
            continue
        differ(key, "ti.state", theirs[0], mine[0])
        differ(key, "ti.try_number", theirs[1], mine[1])
    for key in sorted(set(airflow.xcoms) | set(ours.xcoms)):
        differ(key, "xcom.return_value", airflow.xcoms.get(key), ours.xcoms.get(key))
    differ("", "asset_events", airflow.events, ours.events)
    return out


def _matches(entry: dict, difference: dict) -> bool:
    for name in ("dag", "task", "field"):
        wanted = entry.get(name, "*")
        if wanted != "*" and wanted != difference[name]:
            return False
    return all(entry[side] == difference[side] for side in ("airflow", "ours") if side in entry)


def documented(difference: dict, divergences: Iterable[dict]) -> dict | None:
    """The entry of `divergences` that documents `difference`, if one does."""
    return next((entry for entry in divergences if _matches(entry, difference)), None)


def load_data(path: Path = DATA) -> dict:
    """`{"skip": {dag_id: reason}, "divergences": [{dag, task, field, [airflow, ours,] reason}]}`"""
    data = json.loads(path.read_text())
    for entry in data.get("divergences", []):
        if not entry.get("reason") or entry.get("kind") not in KINDS:
            raise ValueError(f"{path}: a divergence needs a reason and a kind {KINDS}: {entry}")
    return data


# ----------------------------------------------------------------------------------------------
# Reading each side's database


def _json(value: object) -> object:
    """A stored XCom or extra as plain JSON: Airflow's SQLite JSON column is text, and a value
    the Task SDK serialized may be stored as its JSON text."""
    for _ in range(2):
        if isinstance(value, str | bytes):
            try:
                value = json.loads(value)
            except ValueError:
                return value
        else:
            break
    return value


def airflow_result(stock: StockAirflow, dag_id: str, run_id: str) -> RunResult:
    rows = stock.rows("SELECT state FROM dag_run WHERE dag_id = ? AND run_id = ?", dag_id, run_id)
    result = RunResult(state=rows[0][0] if rows else None)
    for task_id, map_index, state, try_number in stock.rows(
        "SELECT task_id, map_index, state, try_number FROM task_instance"
        " WHERE dag_id = ? AND run_id = ?",
        dag_id,
        run_id,
    ):
        result.tis[ti_key(task_id, map_index)] = [state, try_number]
    for task_id, map_index, value in stock.rows(
        "SELECT task_id, map_index, value FROM xcom"
        " WHERE dag_id = ? AND run_id = ? AND key = 'return_value'",
        dag_id,
        run_id,
    ):
        result.xcoms[ti_key(task_id, map_index)] = _json(value)
    result.events = sorted(
        [uri, name, _json(extra)]
        for uri, name, extra in stock.rows(
            "SELECT a.uri, a.name, e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id"
            " WHERE e.source_dag_id = ? AND e.source_run_id = ?",
            dag_id,
            run_id,
        )
    )
    return result


def _by_json(rows: list[list]) -> list[list]:
    return sorted(rows, key=lambda row: json.dumps(row, sort_keys=True))


class Service:
    """`bin/serve` on its own database and `bin/airflow-worker` for one folder."""

    def __init__(self, dags: Path, database: str, logs: Path, *, concurrency: int) -> None:
        self.dags = dags
        self.database = database
        self.logs = logs
        self.concurrency = concurrency
        self.serve: servers.Server | None = None
        self.worker: servers.Server | None = None
        self.sync_output = ""

    def sql(self, query: str, *args: object) -> list[tuple]:
        with psycopg.connect(f"{PG}/{self.database}", autocommit=True) as conn:
            cursor = conn.execute(query, args)
            return cursor.fetchall() if cursor.description else []

    def start(self) -> None:
        with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{self.database}"')
        from cryptography.fernet import Fernet

        env = {
            **os.environ,
            "DATABASE_URL": f"{PG}/{self.database}",
            "WEB_WORKERS": "2",
            "WORKER_API_KEY": KEY,
            "FERNET_KEY": Fernet.generate_key().decode(),
            "ADMIN_PASSWORD": "differential-admin",
            "AIRFLOW_HOME": str(self.logs / "worker-airflow-home"),
        }
        self.serve = servers.bin_serve(
            env, self.logs / "serve.log", ready_path="/api/v2/version", ready_timeout=300
        )
        token = subprocess.run(
            [sys.executable, "manage.py", "create_api_token", "admin", "--name", "differential"],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        self.api = requests.Session()
        self.api.headers["Authorization"] = f"Bearer {token.stdout.strip().splitlines()[-1]}"
        done = subprocess.run(
            [*self._worker_argv(), "--sync-only"],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        self.sync_output = done.stderr
        if done.returncode != 0:
            raise RuntimeError(f"bin/airflow-worker --sync-only failed:\n{done.stderr[-3000:]}")

    def _worker_argv(self) -> list[str]:
        assert self.serve is not None and self.serve.url is not None
        return [
            str(ROOT / "bin/airflow-worker"),
            "--dags",
            str(self.dags),
            "--url",
            self.serve.url,
            "--logs",
            str(self.logs / "task-logs"),
        ]

    @property
    def url(self) -> str:
        assert self.serve is not None and self.serve.url is not None
        return self.serve.url

    def start_worker(self) -> None:
        assert self.serve is not None
        argv = [*self._worker_argv(), "--no-sync", "--concurrency", str(self.concurrency)]
        self.worker = servers.Server(argv, self.serve.env, self.logs / "worker.log").start()

    def stop(self) -> list[str]:
        """The worker as a user stops it (SIGTERM; its grace period and cleanup time), then the
        service. Returns what the worker left behind (issue 44: a product leak, which `run`
        fails on; the harness's own SIGKILL sweep still cleaned it up)."""
        left = self.worker.stop(timeout=90) if self.worker is not None else []
        if self.serve is not None:
            self.serve.stop(timeout=30)
        return left

    def dags_loaded(self) -> dict[str, str]:
        """dag_id -> file (relative to the folder), of the Dags synced."""
        return dict(self.sql("SELECT dag_id, fileloc FROM assets_app_dag"))

    def import_errors(self) -> dict[str, str]:
        return dict(self.sql("SELECT filename, stack_trace FROM assets_app_dagimporterror"))

    def result(self, dag_id: str, run_id: str) -> RunResult:
        rows = self.sql(
            "SELECT id, state FROM assets_app_dagrun WHERE dag_id = %s AND run_id = %s",
            dag_id,
            run_id,
        )
        if not rows:
            return RunResult(state=None)
        pk, state = rows[0]
        result = RunResult(state=state)
        for task_id, map_index, ti_state, try_number in self.sql(
            "SELECT task_id, map_index, state, try_number FROM assets_app_taskinstance"
            " WHERE dag_run_id = %s",
            pk,
        ):
            result.tis[ti_key(task_id, map_index)] = [ti_state, try_number]
        for task_id, map_index, value in self.sql(
            "SELECT task_id, map_index, value FROM assets_app_xcom"
            " WHERE dag_id = %s AND run_id = %s AND key = 'return_value'",
            dag_id,
            run_id,
        ):
            result.xcoms[ti_key(task_id, map_index)] = _json(value)
        result.events = sorted(
            [uri, name, _json(extra)]
            for uri, name, extra in self.sql(
                "SELECT a.uri, a.name, e.extra FROM assets_app_assetevent e"
                " JOIN assets_app_asset a ON a.id = e.asset_id"
                " WHERE e.source_dag_id = %s AND e.source_run_id = %s",
                dag_id,
                run_id,
            )
        )
        return result

    def run_states(self, runs: dict[str, str]) -> dict[str, str | None]:
        rows = self.sql(
            "SELECT dag_id, run_id, state FROM assets_app_dagrun WHERE dag_id = ANY(%s)",
            list(runs),
        )
        found = {dag_id: state for dag_id, run_id, state in rows if runs.get(dag_id) == run_id}
        return {dag_id: found.get(dag_id) for dag_id in runs}


def _airflow_dags(stock: StockAirflow) -> dict[str, str]:
    return dict(stock.rows("SELECT dag_id, relative_fileloc FROM dag WHERE NOT is_stale"))


def _airflow_run_states(stock: StockAirflow, runs: dict[str, str]) -> dict[str, str | None]:
    rows = stock.rows("SELECT dag_id, run_id, state FROM dag_run WHERE run_type = 'manual'")
    found = {dag_id: state for dag_id, run_id, state in rows if runs.get(dag_id) == run_id}
    return {dag_id: found.get(dag_id) for dag_id in runs}


def _settle(stock: StockAirflow, timeout: float) -> None:
    """Wait until the dag-processor has stored something and then nothing new for SETTLE s."""
    deadline = time.monotonic() + timeout
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        seen = (
            sorted(_airflow_dags(stock).items()),
            sorted(row[0] for row in stock.rows("SELECT filename FROM import_error")),
        )
        if seen != last:
            last, since = seen, time.monotonic()
        elif (seen[0] or seen[1]) and time.monotonic() - since >= SETTLE:
            return
        time.sleep(2)
    raise TimeoutError(f"airflow: the Dag folder was not parsed within {timeout:g}s")


def _call(method, url: str, body: dict) -> requests.Response:
    for attempt in range(3):  # a 5xx (a busy SQLite on Airflow's side) is tried again
        answer = method(url, json=body, timeout=120)
        if answer.status_code < 500:
            break
        time.sleep(2 * (attempt + 1))
    return answer


def unpause(api: requests.Session, url: str, dag_id: str) -> None:
    _call(api.patch, f"{url}/api/v2/dags/{dag_id}", {"is_paused": False}).raise_for_status()


def trigger(api: requests.Session, url: str, dag_id: str) -> str | list:
    """Trigger one manual run of `dag_id` (same body on both sides): its run_id, or
    [status, detail] when the trigger is refused."""
    answer = _call(
        api.post,
        f"{url}/api/v2/dags/{dag_id}/dagRuns",
        {"logical_date": LOGICAL_DATE, "conf": CONF},
    )
    if answer.status_code >= 300:
        try:
            detail = answer.json().get("detail", answer.text)
        except ValueError:
            detail = answer.text
        return [answer.status_code, json.dumps(detail)[:300]]
    return answer.json()["dag_run_id"]


def _refusal(dag_id: str, file: str | None, errors: dict[str, str]) -> str:
    """The service's reason for not having `dag_id`: its file's import error, the line naming
    the Dag if one does, else the error's last line."""
    text = errors.get(file or "", "")
    if not text:
        return "not synced (no import error)"
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    naming = [line for line in lines if dag_id in line]
    return (naming or lines)[-1][:300]


# ----------------------------------------------------------------------------------------------
# The run


def run(
    dags: Path,
    *,
    dag_ids: list[str] | None = None,
    data: dict | None = None,
    concurrency: int = 2,
    timeout: float = 600.0,
    database: str = "differential",
    logs: Path | None = None,
) -> dict:
    """Run `dags` on both sides and compare (see the module's docstring); the report as JSON."""
    data = load_data() if data is None else data
    skip: dict[str, str] = data.get("skip", {})
    divergences: list[dict] = data.get("divergences", [])
    logs = Path(logs or tempfile.mkdtemp(prefix="differential-logs-"))
    logs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    home = logs / "airflow"  # Airflow's AIRFLOW_HOME, its task logs kept with the others
    service = Service(dags, database, logs, concurrency=concurrency)
    report: dict = {"folder": str(dags), "dags": {}, "differences": [], "divergences": []}
    left: list[str] = []
    try:
        with StockAirflow(
            dags,
            home,
            logs,
            parallelism=concurrency,
            paused_at_creation=True,
            all_admins=True,
            triggerer=True,
        ) as stock:
            service.start()  # Airflow parses the folder meanwhile
            _settle(stock, timeout)
            theirs, ours = _airflow_dags(stock), service.dags_loaded()
            errors = service.import_errors()
            report["airflow_import_errors"] = {
                name: (trace or "").strip().splitlines()[-1:]
                for name, trace in stock.rows("SELECT filename, stacktrace FROM import_error")
            }
            chosen = sorted(dag_ids or set(theirs) | set(ours))
            runs: dict[str, tuple[str, str]] = {}  # dag_id -> (Airflow's run_id, ours)
            airflow_api = requests.Session()
            for dag_id in chosen:
                row = report["dags"][dag_id] = {"file": theirs.get(dag_id) or ours.get(dag_id)}
                if dag_id in skip:
                    row.update(status="skipped", reason=skip[dag_id])
                elif dag_id not in theirs:
                    row.update(status="skipped", reason="Airflow does not load it")
                elif dag_id not in ours:
                    row.update(status="refused", reason=_refusal(dag_id, theirs[dag_id], errors))
                else:
                    # Both take a run of a paused Dag: it waits, queued, for the unpause.
                    their_run = trigger(airflow_api, stock.url, dag_id)
                    our_run = trigger(service.api, service.url, dag_id)
                    if isinstance(their_run, str) and isinstance(our_run, str):
                        runs[dag_id] = (their_run, our_run)
                    elif isinstance(their_run, str) or isinstance(our_run, str):
                        difference = {"dag": dag_id, "task": "", "field": "trigger"}
                        difference.update(airflow=their_run, ours=our_run)
                        report["differences"].append(difference)
                        row.update(status="differ", differences=1)
                    else:
                        row.update(status="skipped", reason=f"both refuse the trigger: {our_run}")
            # The Dags unpaused only now: their tasks start after the burst of triggers (taken
            # while they ran, Airflow timed the tasks' API calls out on SQLite).
            for dag_id in runs:
                unpause(airflow_api, stock.url, dag_id)
                unpause(service.api, service.url, dag_id)
            service.start_worker()
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                states = [
                    *_airflow_run_states(stock, {d: r[0] for d, r in runs.items()}).values(),
                    *service.run_states({d: r[1] for d, r in runs.items()}).values(),
                ]
                if all(state in FINISHED for state in states):
                    break
                time.sleep(2)
            for dag_id, (their_run, our_run) in runs.items():
                mine = service.result(dag_id, our_run)
                other = airflow_result(stock, dag_id, their_run)
                row = report["dags"][dag_id]
                row["runs"] = {"airflow": their_run, "ours": our_run}
                if other.state not in FINISHED or mine.state not in FINISHED:
                    row.update(
                        status="unfinished",
                        reason=f"after {timeout:g}s: Airflow {other.state}, ours {mine.state}",
                    )
                    continue
                found = compare(dag_id, other, mine)
                undocumented = []
                for difference in found:
                    entry = documented(difference, divergences)
                    if entry is None:
                        undocumented.append(difference)
                    else:
                        report["divergences"].append(
                            {**difference, "kind": entry["kind"], "reason": entry["reason"]}
                        )
                report["differences"].extend(undocumented)
                row["status"] = "differ" if undocumented else ("divergent" if found else "equal")
                row["differences"] = len(undocumented)
    finally:
        left = service.stop()
        with contextlib.suppress(OSError):
            (home / "airflow.db").unlink()  # the logs stay
    if left:
        raise RuntimeError("bin/airflow-worker left processes behind: " + "; ".join(left))
    statuses = [row["status"] for row in report["dags"].values()]
    report["summary"] = {name: statuses.count(name) for name in sorted(set(statuses))}
    report["seconds"] = round(time.monotonic() - started, 1)
    report["logs"] = str(logs)
    return report


def table(report: dict) -> str:
    """The report as text: one row per Dag, each undocumented difference, then the documented
    divergences (each with a footnote number to its reason)."""
    lines = [f"{'dag':<48} {'status':<11} detail"]
    for dag_id, row in sorted(report["dags"].items()):
        detail = row.get("reason") or (
            f"{row['differences']} difference(s)" if row.get("differences") else ""
        )
        lines.append(f"{dag_id:<48} {row['status']:<11} {detail}")

    def line(item: dict) -> str:
        return (
            f"  {item['dag']} | {item['task'] or '-'} | {item['field']} | "
            f"{json.dumps(item['airflow'])} | {json.dumps(item['ours'])}"
        )

    if report["differences"]:
        lines.append("\ndifferences: dag | task | field | Airflow | ours")
        lines.extend(line(item) for item in report["differences"])
    reasons: list[str] = []
    if report["divergences"]:
        lines.append("\ndocumented divergences: dag | task | field | Airflow | ours [note]")
        for item in report["divergences"]:
            note = f"{item['kind']}: {item['reason']}"
            if note not in reasons:
                reasons.append(note)
            lines.append(f"{line(item)} [{reasons.index(note) + 1}]")
        lines.extend(f"  [{number}] {note}" for number, note in enumerate(reasons, 1))
    summary = ", ".join(f"{count} {name}" for name, count in report["summary"].items())
    lines.append(f"\n{len(report['dags'])} Dags: {summary} ({report['seconds']}s)")
    return "\n".join(lines)


def example_folder(target: Path) -> Path:
    """Airflow's example Dags (core and the standard provider) copied into one folder."""
    for source in EXAMPLE_FOLDERS:
        shutil.copytree(
            source, target / source.parent.name, ignore=shutil.ignore_patterns("__pycache__")
        )
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", type=Path, help="a folder of DAG files")
    parser.add_argument("--examples", action="store_true", help="Airflow's example Dags")
    parser.add_argument("--dags", nargs="*", help="these Dag ids (default: every one)")
    parser.add_argument("--concurrency", type=int, default=2, help="TIs at once on each side")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for the runs")
    parser.add_argument(
        "--database", default=f"{os.environ.get('BENCH_DB_PREFIX', 'bench')}_differential"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "differential.json")
    parser.add_argument("--logs", type=Path, help="the processes' logs (default: a new temp dir)")
    options = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        folder = options.folder
        if options.examples:
            folder = example_folder(Path(stack.enter_context(tempfile.TemporaryDirectory())))
        if folder is None:
            parser.error("a folder, or --examples")
        report = run(
            folder.resolve(),
            dag_ids=options.dags,
            concurrency=options.concurrency,
            timeout=options.timeout,
            database=options.database,
            logs=options.logs,
        )
    print(table(report))
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"wrote {options.out}")
    return 1 if report["differences"] or "unfinished" in report["summary"] else 0


if __name__ == "__main__":
    sys.exit(main())
