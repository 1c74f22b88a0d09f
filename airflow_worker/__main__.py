"""bin/airflow-worker: sync Airflow DAG files into the service, then claim TIs and run each
through the stock Task SDK's `supervise_task`, `--concurrency` at a time, in a pool of processes
that imported Airflow once (airflow_worker/pool.py, as Airflow's LocalExecutor does; the
supervisor forks each task's process). `--interpreter-per-task` starts `python -m
airflow.sdk.execution_time.execute_workload` per TI instead.

    bin/airflow-worker --dags examples/airflow_dags --url http://127.0.0.1:8000 \\
        [--api-key KEY] [--sync-key KEY] [--wait S] [--concurrency 8] [--max-tis N] \\
        [--max-seconds S] [--idle-exit S] [--logs var/airflow-logs] [--manual-only] \\
        [--queues default,gpu] [--bundle dags-folder] [--grace-period S] [--cleanup-time S] \\
        [--sync-only | --no-sync | --triggerer]

SIGTERM / SIGINT stop claiming, let running tasks finish for `--grace-period`, then end them as
Airflow's supervisor does (SIGTERM, SIGKILL after `--cleanup-time`); a second signal skips the
rest of the grace. Every process the worker forks dies with it, even when it is SIGKILLed
(airflow_worker/lifeline.py; README, "Stopping").

`--triggerer` runs, instead of TIs, the triggers of deferred TIs (`airflow_worker/triggerer.py`:
many on one asyncio loop, as Airflow's triggerer), with the same url, key and `--max-seconds` /
`--idle-exit`; `--queues` there names triggerer queues (default: any trigger).

`--bundle NAME` (default Airflow's `dags-folder`) names the Dag bundle the folder is: the sync
records it on each Dag and replaces that bundle's import errors only, and the worker claims only
TIs of that bundle's Dags (a JSON-defined Dag, or a Dag of another folder, is left to the
workers that serve it, instead of failing here with "Dag not found during start up").

Task code runs here, with this machine's environment. Airflow's settings for the supervisor
come from the environment it is started with (`AIRFLOW__CORE__DAGS_FOLDER`,
`AIRFLOW__CORE__EXECUTION_API_SERVER_URL`, `AIRFLOW__LOGGING__BASE_LOG_FOLDER` are set from the
options; anything else `AIRFLOW__...` passes through).
"""

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from airflow_worker import dag_callbacks, service_key

ROOT = Path(__file__).resolve().parents[1]


def _options(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bin/airflow-worker", description=__doc__.split("\n")[0])
    parser.add_argument("--dags", required=True, type=Path, help="folder of Airflow DAG files")
    parser.add_argument(
        "--url",
        default=_default_url(),
        help="the service's base URL (default: http://$HOST:$PORT as bin/serve binds, "
        "127.0.0.1:8000)",
    )
    parser.add_argument(
        "--api-key",
        default=None,
        help="worker API key for claiming work (default: the service's own, as it finds it: "
        "$WORKER_API_KEY, .env, else the key it generated under KEY_DIR)",
    )
    parser.add_argument(
        "--sync-key",
        default=None,
        help="deploy key (or an API token with add_dag and change_dag) for the sync (default: "
        "$DAG_SYNC_KEY, else the service's generated KEY_DIR/dag_sync_key on this host)",
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=120,
        help="seconds to wait for the service to answer at start (bin/serve & starting)",
    )
    parser.add_argument("--concurrency", type=int, default=4, help="TIs run at once")
    parser.add_argument("--max-tis", type=int, default=0, help="stop after claiming this many")
    parser.add_argument("--max-seconds", type=float, default=0, help="stop claiming after this")
    parser.add_argument(
        "--idle-exit", type=float, default=0, help="exit after this long with nothing to do"
    )
    parser.add_argument("--logs", type=Path, default=ROOT / "var/airflow-logs", help="log folder")
    parser.add_argument("--hostname", default=socket.gethostname())
    parser.add_argument(
        "--queues",
        type=_queue_list,
        default=None,
        help="claim only TIs of tasks in these queues, comma-separated (default: Airflow's "
        "[operators] default_queue, 'default')",
    )
    parser.add_argument(
        "--bundle",
        default="dags-folder",
        help="the Dag bundle the --dags folder is (Airflow's bundle name; default its "
        "'dags-folder'): synced as that bundle, and only its Dags' TIs are claimed",
    )
    parser.add_argument(
        "--manual-only",
        action="store_true",
        help="sync Dags with a schedule the service cannot run (cron, ...) as manual-only",
    )
    parser.add_argument(
        "--interpreter-per-task",
        action="store_true",
        help="start a new interpreter per TI (execute_workload) instead of the forked pool",
    )
    parser.add_argument(
        "--grace-period",
        type=float,
        default=None,
        help="on SIGTERM/SIGINT: seconds running tasks may take to finish before they are "
        "ended (default: Airflow's [core] killed_task_cleanup_time, 60); a second signal ends "
        "them at once",
    )
    parser.add_argument(
        "--cleanup-time",
        type=float,
        default=5.0,
        help="seconds an ended task has between SIGTERM (its on_kill runs) and SIGKILL "
        "(default: 5, the escalation delay of Airflow's supervisor kill())",
    )
    parser.add_argument("--apply-pause", action="store_true", help="as sync_dags --apply-pause")
    parser.add_argument(
        "--triggerer-capacity",
        type=int,
        default=1000,
        help="with --triggerer: triggers run at once (Airflow's [triggerer] capacity)",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--triggerer",
        action="store_true",
        help="run deferred TIs' triggers (airflow_worker/triggerer.py) instead of TIs; no sync",
    )
    mode.add_argument("--sync-only", action="store_true", help="sync the DAG files and exit")
    mode.add_argument("--no-sync", action="store_true", help="do not sync, only run TIs")
    options = parser.parse_args(argv)
    if options.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    if not options.dags.is_dir():
        parser.error(f"--dags {options.dags}: no such folder")
    return options


def _default_url() -> str:
    host = os.environ.get("HOST") or "127.0.0.1"
    if host in ("0.0.0.0", "::"):  # bound to every address: reach it on loopback
        host = "127.0.0.1"
    return f"http://{host}:{os.environ.get('PORT') or 8000}"


def _wait_for_service(client: httpx.Client, seconds: float) -> None:
    """Until the service answers (any status: bin/serve migrates, so its keys exist, before it
    serves); SystemExit after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            client.get("/api/v2/version", timeout=5)
            return
        except httpx.TransportError as exc:
            if time.monotonic() >= deadline:
                raise SystemExit(
                    f"[airflow-worker] the service at {client.base_url} did not answer within "
                    f"{seconds:g}s ({exc!r})"
                ) from None
            time.sleep(0.5)


def _airflow_environment(options: argparse.Namespace) -> None:
    """Airflow's configuration for this process and the supervisors it starts."""
    home = options.logs.resolve().parent / "airflow-home"
    home.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("AIRFLOW_HOME", str(home))
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(options.dags.resolve())
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    os.environ["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] = options.url.rstrip("/") + "/execution/"
    os.environ["AIRFLOW__LOGGING__BASE_LOG_FOLDER"] = str(options.logs.resolve() / "tasks")
    if options.bundle != "dags-folder":
        # The Task SDK loads a workload's Dag from the bundle its `bundle_info` names (the
        # Dag's bundle: this one): Airflow's local bundle over the folder, under that name.
        os.environ["AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST"] = json.dumps(
            [
                {
                    "name": options.bundle,
                    "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                    "kwargs": {"path": str(options.dags.resolve())},
                }
            ]
        )


def _say(message: str) -> None:
    print(f"[airflow-worker] {message}", file=sys.stderr, flush=True)


def sync(options: argparse.Namespace, client: httpx.Client) -> None:
    """Convert the folder and sync it: the files that imported, and the ones that did not as
    the service's import errors (each said here with its last line)."""
    from airflow_worker.dag_files import parse_folder

    folder = parse_folder(options.dags, manual_only=options.manual_only)
    for failure in folder.import_errors:
        _say(f"{failure.rel_path}: not synced: {(failure.error.strip().splitlines() or ['?'])[-1]}")
    body = {
        "files": [f.payload() for f in folder.files],
        "apply_pause": options.apply_pause,
        "import_errors": [{"file": e.rel_path, "error": e.error} for e in folder.import_errors],
        "bundle_name": options.bundle,
    }
    response = client.post(
        "/execution/dags/sync",
        json=body,
        headers={"Authorization": f"Bearer {_sync_key(options)}"},
    )
    if response.status_code != 200:
        raise SystemExit(
            f"[airflow-worker] sync refused ({response.status_code}): {response.text}"
            + _key_hint(options, response)
        )
    _say(response.json()["summary"].replace("\n", "\n  "))


# ---- issue 26: the sync's own credential ----
def _sync_key(options: argparse.Namespace) -> str:
    """The deploy key: --sync-key, $DAG_SYNC_KEY, or the key the service generated under its
    KEY_DIR (default var/keys of this checkout) when this worker runs on its host."""
    if options.sync_key:
        return options.sync_key
    if os.environ.get("DAG_SYNC_KEY"):
        return os.environ["DAG_SYNC_KEY"]
    key_dir = Path(os.environ.get("KEY_DIR") or "var/keys")
    key_file = (key_dir if key_dir.is_absolute() else ROOT / key_dir) / "dag_sync_key"
    try:
        return key_file.read_text().strip()
    except OSError:
        raise SystemExit(
            "[airflow-worker] no deploy key for the sync: pass --sync-key or set DAG_SYNC_KEY "
            f"(the service's key; {key_file} is not readable here)"
        ) from None


# ---- end issue 26 ----


class _InterpreterPerTask:
    """`--interpreter-per-task`: the old way, one `python -m ...execute_workload` per TI (a new
    interpreter importing Airflow each time); the same interface as pool.Pool."""

    def __init__(self, size: int, *, logs: Path) -> None:
        self._size = size
        self._logs = logs
        self._running: list[tuple[subprocess.Popen, dict, object, float]] = []

    def idle(self) -> int:
        return self._size - len(self._running)

    def busy(self) -> int:
        return len(self._running)

    def submit(self, workload: dict) -> None:
        ti = workload["ti"]
        folder = self._logs / "supervisor"
        folder.mkdir(parents=True, exist_ok=True)
        log = open(  # noqa: SIM115  (closed when the supervisor exits, in finished())
            folder / f"{ti['dag_id']}.{ti['task_id']}.{ti['id']}.try{ti['try_number']}.log", "ab"
        )
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "airflow.sdk.execution_time.execute_workload",
                "--json-string",
                json.dumps(workload),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self._running.append((process, ti, log, time.monotonic()))

    def finished(self, *, restart: bool = True):
        for item in [r for r in self._running if r[0].poll() is not None]:
            self._running.remove(item)
            process, ti, log, started = item
            log.close()
            yield ti, process.returncode, time.monotonic() - started, None

    def wait(self, timeout: float) -> None:
        time.sleep(min(timeout, 0.02))

    def signal_busy(self, signum: int) -> None:
        for process, *_ in self._running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signum)

    def pids(self) -> list[int]:
        return [process.pid for process, *_ in self._running]

    def close(self, timeout: float = 10) -> None:
        for process, *_ in self._running:
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _key_hint(options: argparse.Namespace, response: httpx.Response) -> str:
    if response.status_code in (401, 403):
        return f" (the key sent came from {options.key_source}: is it this service's key?)"
    return ""


def _queue_list(text: str) -> list[str]:
    queues = [q.strip() for q in text.split(",") if q.strip()]
    if not queues:
        raise argparse.ArgumentTypeError("name at least one queue")
    return queues


def _default_queues() -> list[str]:
    """Airflow's `[operators] default_queue`, as this interpreter's Airflow config gives it (the
    queue a task that names none is in, so the one a worker listens on by default)."""
    from airflow.configuration import conf

    return [conf.get("operators", "default_queue")]


def _claim(client: httpx.Client, options: argparse.Namespace, *, limit: int) -> list[dict]:
    """Claimed workloads; none (after a pause) when the service is unreachable or answers 5xx,
    so a restart of the service does not stop the worker. A 4xx (a wrong key) stops it."""
    try:
        response = client.post(
            "/execution/workloads/claim",
            json={
                "hostname": options.hostname,
                "limit": limit,
                "queues": options.queues,
                "bundles": [options.bundle],
            },
        )
    except httpx.TransportError as exc:
        _say(f"claim failed ({exc!r}); retrying in 2 s")
        time.sleep(2)
        return []
    if response.status_code >= 500:
        _say(f"claim answered {response.status_code}; retrying in 2 s")
        time.sleep(2)
        return []
    if response.status_code != 200:
        raise SystemExit(
            f"[airflow-worker] claim refused ({response.status_code}): {response.text}"
            + _key_hint(options, response)
        )
    return response.json()["workloads"]


class _LogShipper:
    """Ships each try's log file (`--logs`/tasks/<the workload's log_path>, where the supervisor
    writes it) to the service in chunks (PUT /execution/task-instances/{id}/logs/{try}): what
    was appended, every `every` seconds while the task runs and once more when it ends. A chunk
    is idempotent by its offset, so a retry after a lost answer changes nothing."""

    CHUNK = 128 * 1024

    def __init__(self, client: httpx.Client, logs: Path, every: float = 0.5) -> None:
        self._client = client
        self._folder = logs / "tasks"
        self._every = every
        self._tries: dict[str, dict] = {}  # ti id -> {path, try_number, offset, off}
        self._last = 0.0

    def track(self, workload: dict) -> None:
        ti = workload["ti"]
        if workload.get("log_path"):
            self._tries[ti["id"]] = {
                "path": self._folder / workload["log_path"],
                "try_number": ti["try_number"],
                "offset": 0,
                "off": False,
            }

    def tick(self) -> None:
        if time.monotonic() - self._last >= self._every:
            self._last = time.monotonic()
            for ti_id in list(self._tries):
                self._ship(ti_id)

    def finish(self, ti_id: str) -> None:
        self._ship(ti_id)
        self._tries.pop(ti_id, None)

    def _ship(self, ti_id: str) -> None:
        state = self._tries.get(ti_id)
        if state is None or state["off"]:
            return
        try:
            with open(state["path"], "rb") as file:
                file.seek(state["offset"])
                data = file.read()
        except FileNotFoundError:
            return
        # Whole lines only (the supervisor may be mid-line), cut at CHUNK bytes.
        data = data[: data.rfind(b"\n") + 1]
        while data:
            piece = data[: self.CHUNK]
            if len(piece) == self.CHUNK and b"\n" in piece:
                piece = piece[: piece.rfind(b"\n") + 1]
            body = {"offset": state["offset"], "content": piece.decode(errors="replace")}
            url = f"/execution/task-instances/{ti_id}/logs/{state['try_number']}"
            try:
                response = self._client.put(url, json=body)
            except httpx.TransportError as exc:
                _say(f"log of {ti_id} not shipped ({exc!r}); next time")
                return
            if response.status_code == 409 and "stored_bytes" in response.text:
                # The service has more or less than we think: continue from what it stored.
                state["offset"] = response.json()["detail"].get("stored_bytes", state["offset"])
                return
            if response.status_code != 200:
                _say(f"log of {ti_id} refused ({response.status_code}): {response.text[:300]}")
                state["off"] = response.status_code in (404, 413, 422)
                return
            state["offset"] += len(piece)
            data = data[len(piece) :]


def _runner(options: argparse.Namespace):
    if options.interpreter_per_task:
        return _InterpreterPerTask(options.concurrency, logs=options.logs)
    from airflow_worker import pool

    pool.route_queues(options.queues)
    pool.preload()
    return pool.Pool(
        options.concurrency,
        logs=options.logs,
        server=os.environ["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"],
        cleanup=options.cleanup_time,
    )


# ---- issue 44: a worker that stops cleanly ----
class _Stop:
    """SIGTERM / SIGINT: the first stops claiming (`requested`), the second ends the grace
    (`hurried`). Handlers only set flags; the loop acts on them."""

    def __init__(self) -> None:
        self.at: float | None = None
        self.signals: list[str] = []
        self.hurried = False
        signums = (signal.SIGTERM, signal.SIGINT)
        self._previous = {signum: signal.signal(signum, self._handle) for signum in signums}

    def _handle(self, signum: int, _frame) -> None:
        self.signals.append(signal.Signals(signum).name)
        if self.at is None:
            self.at = time.monotonic()
        else:
            self.hurried = True

    @property
    def requested(self) -> bool:
        return self.at is not None

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def _grace_default() -> float:
    """Airflow's `[core] killed_task_cleanup_time` (60 s): how long Airflow gives a task it is
    killing before SIGKILL, read from this interpreter's Airflow config."""
    try:
        from airflow.configuration import conf

        return conf.getfloat("core", "killed_task_cleanup_time", fallback=60.0)
    except Exception:
        return 60.0


_FAILED = {"failed", "up_for_retry", "upstream_failed"}


def _result(ti: dict, code: int, seconds: float, state: str | None) -> str:
    what = f"{ti['dag_id']}.{ti['task_id']} try {ti['try_number']}"
    if state is None:  # no supervisor answer (--interpreter-per-task, a pool process that died)
        return f"{what} exited {code} (its state as the service has it) after {seconds:.1f}s"
    return f"{what} ended {state} (supervisor exit {code}) after {seconds:.1f}s"


def _end_tasks(runner, options: argparse.Namespace, stop: _Stop, report) -> None:
    """After the grace: as Airflow's supervisor ends a task (`kill`): SIGTERM to the supervisors,
    which forward it to their tasks (`on_kill` runs); SIGKILL to the task processes and their
    groups left after `--cleanup-time`; the supervisors then report each task's state. A
    supervisor that has not answered `cleanup + 10 s` later is SIGKILLed with its tree."""
    import psutil

    from airflow_worker.pool import kill_task_processes

    busy = runner.busy()
    _say(f"ending {busy} running task(s): SIGTERM, SIGKILL after {options.cleanup_time:g}s")
    tree: dict[int, psutil.Process] = {}
    for pid in runner.pids():
        with contextlib.suppress(psutil.NoSuchProcess):
            for process in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
                tree[process.pid] = process
    runner.signal_busy(signal.SIGTERM)
    deadline = time.monotonic() + options.cleanup_time
    while runner.busy() and time.monotonic() < deadline:
        runner.wait(min(0.2, max(0.0, deadline - time.monotonic())))
        report(restart=False)
    if runner.busy():
        kill_task_processes(runner.pids())
        deadline = time.monotonic() + options.cleanup_time + 10
        while runner.busy() and time.monotonic() < deadline:
            runner.wait(0.2)
            report(restart=False)
    for pid in runner.pids():  # what was forked since
        with contextlib.suppress(psutil.NoSuchProcess):
            for process in psutil.Process(pid).children(recursive=True):
                tree[process.pid] = process
    runner.close(timeout=options.cleanup_time)
    left = []
    for process in tree.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                process.kill()
                left.append(process)
    if left:
        _say(f"SIGKILLed {len(left)} process(es) left after the supervisors' report time")
    report(restart=False)


def run(options: argparse.Namespace, client: httpx.Client) -> int:
    started = time.monotonic()
    stop = _Stop()  # before anything is forked: a signal while the pool starts stops it cleanly
    # Dag-level callbacks (issue 39): a process of its own, forked before the pool (it holds
    # none of the pool's pipes).
    callbacks = dag_callbacks.Runner(
        url=options.url.rstrip("/"),
        api_key=options.api_key_value,
        hostname=options.hostname,
        folder=options.dags,
        logs=options.logs,
    )
    runner = _runner(options)
    shipper = _LogShipper(client, options.logs)
    claimed = finished = failed = 0
    grace = _grace_default() if options.grace_period is None else options.grace_period
    ended: list[str] = []

    def report(restart: bool = True) -> None:
        nonlocal finished, failed
        for ti, code, seconds, state in runner.finished(restart=restart):
            ended.append(ti["id"])
            finished += 1
            failed += state in _FAILED if state is not None else code != 0
            _say(_result(ti, code, seconds, state))

    idle_since = time.monotonic()
    said_stopping = False
    try:
        while True:
            report(restart=not stop.requested)
            if stop.requested and not said_stopping:
                said_stopping = True
                _say(
                    f"{stop.signals[0]}: claiming nothing more; {runner.busy()} running task(s) "
                    f"may take {grace:g}s to finish (signal again to end them now)"
                )
            out_of_time = options.max_seconds and time.monotonic() - started >= options.max_seconds
            out_of_tis = options.max_tis and claimed >= options.max_tis
            free = runner.idle()
            if options.max_tis:
                free = min(free, options.max_tis - claimed)
            got = []
            if free > 0 and not out_of_time and not out_of_tis and not stop.requested:
                got = _claim(client, options, limit=free)
                for workload in got:
                    shipper.track(workload)
                    runner.submit(workload)
                claimed += len(got)
            # The freed slots are claimed for first; the ended tries' last log lines follow.
            for ti_id in ended:
                shipper.finish(ti_id)
            ended.clear()
            shipper.tick()
            busy = runner.busy()
            if stop.requested:
                if not busy:
                    break
                if stop.hurried or time.monotonic() - stop.at >= grace:
                    _end_tasks(runner, options, stop, report)
                    break
            if busy or got or callbacks.active():
                idle_since = time.monotonic()
            elif (out_of_time or out_of_tis) or (
                options.idle_exit and time.monotonic() - idle_since >= options.idle_exit
            ):
                break
            if busy and (runner.idle() == 0 or out_of_time or out_of_tis or stop.requested):
                runner.wait(0.5)  # nothing to claim for until a slot frees: wake when one does
            else:
                time.sleep(0.02 if got or busy else 0.1)
    finally:
        callbacks.close()
        runner.close()
        for ti_id in ended:
            shipper.finish(ti_id)
        stop.restore()
    elapsed = time.monotonic() - started
    _say(
        f"{claimed} TIs claimed, {finished} finished ({failed} failed) in {elapsed:.1f}s"
        + (f"; stopped on {', '.join(stop.signals)}" if stop.requested else "")
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    options = _options(sys.argv[1:] if argv is None else argv)
    options.logs.mkdir(parents=True, exist_ok=True)
    _airflow_environment(options)
    with httpx.Client(base_url=options.url.rstrip("/"), timeout=60) as client:
        _wait_for_service(client, options.wait)
        try:
            key = service_key.find(options.api_key)
        except service_key.KeyNotFound as exc:
            raise SystemExit(f"[airflow-worker] {exc}") from None
        options.key_source = key.source
        options.api_key_value = key.value
        _say(f"worker API key from {key.source}")
        client.headers["Authorization"] = f"Bearer {key.value}"
        if options.triggerer:
            from airflow_worker import triggerer

            return triggerer.run(
                url=options.url.rstrip("/"),
                api_key=key.value,
                name=f"{options.hostname}:{os.getpid()}",
                capacity=options.triggerer_capacity,
                max_seconds=options.max_seconds,
                idle_exit=options.idle_exit,
                queues=options.queues,
            )
        if not options.no_sync:
            sync(options, client)
        if options.sync_only:
            return 0
        if options.queues is None:
            options.queues = _default_queues()
        _say(
            f"logs under {options.logs.resolve()}; claiming as {options.hostname} from the "
            f"queue(s) {', '.join(options.queues)}"
        )
        return run(options, client)


if __name__ == "__main__":
    sys.exit(main())
