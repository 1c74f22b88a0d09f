"""The Task SDK's own interpreter for tests: `bin/airflow-worker --python` creates (once, cached
by a hash of requirements-airflow.txt) the virtualenv bin/airflow-worker runs in, with
apache-airflow-task-sdk 1.3.2, and prints its python. `validate_with_sdk` checks JSON bodies
against the SDK's own pydantic models there."""

import atexit
import contextlib
import functools
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]

_VALIDATE = r"""
import json, sys
from pydantic import TypeAdapter
from airflow.sdk.api.datamodels import _generated as sdk
from airflow.executors.workloads import ExecuteTask
failures = []
for name, body in json.load(sys.stdin):
    model = ExecuteTask if name == "ExecuteTask" else getattr(sdk, name)
    try:
        TypeAdapter(model).validate_json(json.dumps(body))
    except Exception as exc:
        failures.append(f"{name}: {exc}")
print(json.dumps(failures))
"""


@functools.cache
def sdk_python() -> Path:
    out = subprocess.run(
        [str(ROOT / "bin/airflow-worker"), "--python"], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip().splitlines()[-1])


# A fork server for `convert_folder`: one interpreter of the Task SDK's virtualenv imports Airflow
# and the worker's converter once (about 2 s of CPU), then forks a child per folder. Each child
# parses in a process of its own, as a fresh interpreter did (the Dag folder on sys.path, the
# modules it imports, Airflow's DagBag state all die with it), with the folder's own AIRFLOW_HOME
# in its environment; its output goes to a file, so the server's stdout carries only replies.
_CONVERT_SERVER = r"""
import json, os, sys, traceback
from pathlib import Path
from airflow_worker import dag_files
from airflow.dag_processing.dagbag import BundleDagBag  # noqa: F401  (imported once, here)
for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.environ["AIRFLOW_HOME"] = request["airflow_home"]
            folder = dag_files.parse_folder(
                Path(request["folder"]), manual_only=request["manual_only"]
            )
            converted = {f.rel_path: f.definitions for f in folder.files}
            converted["import_errors"] = {e.rel_path: e.error for e in folder.import_errors}
            Path(request["out"]).write_text(json.dumps(converted))
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"exit": os.waitstatus_to_exitcode(status)}), flush=True)
"""
_convert_server: subprocess.Popen | None = None


def _stop_converter() -> None:
    if _convert_server is not None and _convert_server.poll() is None:
        _convert_server.kill()
        _convert_server.wait()


def _converter() -> subprocess.Popen:
    global _convert_server
    if _convert_server is None or _convert_server.poll() is not None:
        atexit.register(_stop_converter)
        _convert_server = subprocess.Popen(
            [str(sdk_python()), "-c", _CONVERT_SERVER],
            cwd=ROOT,
            env={
                "PYTHONPATH": str(ROOT),
                "AIRFLOW_HOME": tempfile.mkdtemp(prefix="sdk-convert-home-"),
                "PATH": "/usr/bin",
            },
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
    return _convert_server


def convert_folder(folder: Path, *, manual_only: bool = False) -> dict:
    """{file: its definitions, ..., "import_errors": {file: error}} of an Airflow DAG folder, as
    `airflow_worker.dag_files.parse_folder` converts it in the Task SDK's virtualenv (a child of
    the fork server above, AIRFLOW_HOME `folder/.airflow`). A parse that crashes raises
    CalledProcessError with the child's output."""
    server = _converter()
    with tempfile.TemporaryDirectory(prefix="sdk-convert-") as scratch:
        request = {
            "folder": str(folder),
            "manual_only": manual_only,
            "airflow_home": str(folder / ".airflow"),
            "out": f"{scratch}/out.json",
            "log": f"{scratch}/log.txt",
        }
        assert server.stdin is not None and server.stdout is not None
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        reply = server.stdout.readline()
        log = Path(request["log"]).read_text() if Path(request["log"]).exists() else ""
        if not reply:
            raise RuntimeError(f"the conversion server died (exit {server.wait()}): {log}")
        code = json.loads(reply)["exit"]
        if code != 0:
            raise subprocess.CalledProcessError(code, ["parse_folder", str(folder)], output=log)
        return json.loads(Path(request["out"]).read_text())


def validate_with_sdk(bodies: list[tuple[str, object]]) -> list[str]:
    """Validate each (model name in task-sdk's `_generated`, or "ExecuteTask" of airflow-core;
    JSON body) with that model; returns the failures (empty: all valid)."""
    done = subprocess.run(
        [str(sdk_python()), "-c", _VALIDATE],
        input=json.dumps(bodies),
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_worker(
    service: dict, tmp_path: Path, dags: Path, *args: str, timeout: float = 900
) -> subprocess.CompletedProcess:
    """`bin/airflow-worker` on `dags` against a running service (`{"url", "env"}`), its logs and
    AIRFLOW_HOME under `tmp_path`, with `args` (`--sync-only`, `--no-sync --idle-exit 20`...)."""
    return subprocess.run(
        [
            str(ROOT / "bin/airflow-worker"),
            "--dags",
            str(dags),
            "--url",
            service["url"],
            "--logs",
            str(tmp_path / "airflow-logs"),
            *args,
        ],
        env={**service["env"], "AIRFLOW_HOME": str(tmp_path / "airflow-home")},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def synced_dag_folder(
    tmp_path: Path, url: str, files: dict[str, str], *, worker_key: str, env: dict | None = None
) -> tuple[list[str], dict[str, str]]:
    """`files` (name: text) written to `tmp_path/dags` and synced to the service at `url` by
    `bin/airflow-worker --sync-only`; returns the worker's base argv (folder, url, logs under
    `tmp_path`) and its environment (the worker key, AIRFLOW_HOME under `tmp_path`, `env`)."""
    dags = tmp_path / "dags"
    dags.mkdir()
    for name, text in files.items():
        (dags / name).write_text(text)
    environ = {
        **os.environ,
        "WORKER_API_KEY": worker_key,
        "AIRFLOW_HOME": str(tmp_path / "airflow-home"),
        **(env or {}),
    }
    base = [str(ROOT / "bin/airflow-worker"), "--dags", str(dags), "--url", url]
    base += ["--logs", str(tmp_path / "logs")]
    synced = subprocess.run([*base, "--sync-only"], env=environ, capture_output=True, text=True)
    assert synced.returncode == 0, synced.stderr[-3000:]
    return base, environ


def start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """A worker or triggerer in the background, its stderr (where it says everything) in `log`;
    in a session of its own (a test's Ctrl-C is not its signal); `stop` stops it."""
    return subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        start_new_session=True,
    )


def wait_for(predicate: Callable[[], object], *, seconds: float, what: str, logs: list[Path]):
    """Poll `predicate` (every 0.2 s) until it is truthy; fail naming `what`, with the tails of
    `logs`, after `seconds`."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in logs if p.exists())
            raise AssertionError(f"{what} not within {seconds} s\n{tails}")
        time.sleep(0.2)


def tree(pid: int) -> list[psutil.Process]:
    """`pid` and every living descendant of it (pool processes, supervisors, task processes,
    whatever their process group)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def gone(processes: list[psutil.Process], seconds: float) -> list[psutil.Process]:
    """Those of `processes` still alive (not zombies) after up to `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        alive = [p for p in processes if _alive(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.1)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def stop(process: subprocess.Popen, *, timeout: float = 90) -> None:
    """Stop a worker or triggerer as a user does (`kill <pid>`: SIGTERM to it alone) and check it
    left nothing: every process of its tree, collected before the signal, is gone once it has
    exited (issue 44). It has `timeout` s to exit (its grace period and cleanup time); then its
    group and tree are SIGKILLed and the test fails, as it fails when it left a process behind
    (those are SIGKILLed too, so one test's leak does not outlive the test)."""
    processes = tree(process.pid)[1:]
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
        exited = True
    except subprocess.TimeoutExpired:
        exited = False
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    # A moment for init to reap what exited with it.
    left = gone(processes, 2 if exited else 0)
    for leftover in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            leftover.kill()
    assert exited, f"{process.args[:1]} did not exit within {timeout} s of SIGTERM"
    assert not left, "left behind after it exited: " + ", ".join(
        f"{p.pid} {_name(p)}" for p in left
    )


def _name(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())[:120] or process.name()
    except psutil.Error:
        return "?"
