"""The Task SDK's own interpreter for tests: `bin/airflow-worker --python` creates (once, cached
by a hash of requirements-airflow.txt) the virtualenv bin/airflow-worker runs in, with
apache-airflow-task-sdk 1.3.2, and prints its python. `validate_with_sdk` checks JSON bodies
against the SDK's own pydantic models there."""

import functools
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

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
    in its own process group: `stop` stops the task processes it forked too."""
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


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the process group, SIGKILL after 20 s."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=20)
            break
        except subprocess.TimeoutExpired:
            continue
