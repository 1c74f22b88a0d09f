"""Dag-level callbacks in `bin/airflow-worker` (issue 39): a Dag's `on_success_callback` /
`on_failure_callback`, run from its file as Airflow 3.3.2's dag-processor runs them.

When a run of a Dag with one finishes, the service writes a callback request in the finish's
transaction (`assets_app/sql/callbacks.py`: reason "success", "task_failure" or "timed_out",
and the TI Airflow's context is built from). A runner process beside the worker's pool claims
them (`POST /execution/dag-callbacks/claim`: a lease, so a runner that dies leaves its request
due again), and runs each in a process of its own, as Airflow's dag-processor runs callbacks in
a process per file:

- the request becomes Airflow's own `DagCallbackRequest` model (its `DagRunContext`: the run as
  the execution API's `DagRun`, the relevant TI as its `TaskInstance`);
- the file is parsed with `BundleDagBag`, as the processor's `_parse_file` does for callbacks;
- Airflow's own `_execute_dag_callbacks` runs them: the context is the relevant TI's template
  context (`RuntimeTaskInstance.get_template_context()`) with `reason`, or `{dag, run_id,
  reason}` without one; a callback that raises is logged and the next one still runs;
- it ends within `[dag_processor] dag_file_processor_timeout` (Airflow kills a processor that
  takes longer), else it is killed.

The outcome is reported (`POST /execution/dag-callbacks/{id}/report`): `failed`, with the
traceback, when a callback raised or the Dag could not be loaded; `success` otherwise. Its log is
`--logs`/dag_callbacks/<dag_id>.log. The run's state never changes, as in Airflow.

Not as in Airflow: a callback runs without the dag-processor's supervisor, so a callback that
reads a Variable or Connection through the Task SDK fails (recorded as the request's failure).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import httpx

from airflow_worker import lifeline

POLL_SECONDS = 0.5


def _say(message: str) -> None:
    print(f"[airflow-worker callbacks] {message}", file=sys.stderr, flush=True)


class _RecordingLog:
    """The structlog-style logger Airflow's `_execute_dag_callbacks` is given: each line goes
    to the request's log file, and an `exception` (a callback raised) is kept as a failure."""

    def __init__(self, out: Any) -> None:
        self._out = out
        self.failures: list[str] = []

    def _line(self, level: str, event: str, *args: Any, **fields: Any) -> None:
        if args:
            event = event % args
        extra = " ".join(f"{k}={v}" for k, v in fields.items())
        self._out.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} [{level}] {event} {extra}\n")
        self._out.flush()

    def debug(self, event: str, *args: Any, **fields: Any) -> None:
        self._line("debug", event, *args, **fields)

    def info(self, event: str, *args: Any, **fields: Any) -> None:
        self._line("info", event, *args, **fields)

    def warning(self, event: str, *args: Any, **fields: Any) -> None:
        self._line("warning", event, *args, **fields)

    def error(self, event: str, *args: Any, **fields: Any) -> None:
        self._line("error", event, *args, **fields)

    def exception(self, event: str, *args: Any, **fields: Any) -> None:
        text = traceback.format_exc()
        self._line("error", event, *args, **fields)
        self._out.write(text)
        self.failures.append(f"{event}\n{text}")


def airflow_request(item: dict[str, Any]) -> Any:
    """The claimed item as Airflow's `DagCallbackRequest` (validated by its model)."""
    from airflow.callbacks.callback_requests import DagCallbackRequest

    return DagCallbackRequest.model_validate(
        {
            "filepath": item["dag_rel_path"],
            "bundle_name": item["bundle_name"],
            "bundle_version": None,
            "dag_id": item["dag_id"],
            "run_id": item["run_id"],
            "is_failure_callback": item["is_failure_callback"],
            "msg": item["msg"],
            "context_from_server": item["context_from_server"],
        }
    )


def run_request(item: dict[str, Any], *, folder: Path, out: Any) -> tuple[str, str]:
    """Run one claimed request's callbacks in this process, as the dag-processor does
    (`_parse_file` then `_execute_dag_callbacks`); ("success", "") or ("failed", why)."""
    from airflow.dag_processing.dagbag import BundleDagBag
    from airflow.dag_processing.processor import _execute_dag_callbacks

    log = _RecordingLog(out)
    try:
        request = airflow_request(item)
        path = folder / request.filepath
        bag = BundleDagBag(
            dag_folder=str(path), bundle_path=folder, bundle_name=request.bundle_name
        )
        if request.dag_id not in bag.dags:
            errors = "\n".join(str(e) for e in bag.import_errors.values())
            return "failed", (
                f"Dag {request.dag_id!r} not found in {request.filepath!r}"
                + (f":\n{errors}" if errors else "")
            )
        _execute_dag_callbacks(bag, request, log)
    except Exception:
        log.exception("Failed to execute callback request", dag_id=item.get("dag_id"))
    if log.failures:
        return "failed", "\n".join(log.failures)
    return "success", ""


def _child(item: dict[str, Any], folder: Path, logs: Path, conn: Any) -> None:
    """The process one request runs in: its output appended to the Dag's callback log."""
    # Dies with the runner (issue 44): SIGKILL, as the runner's own timeout ends it.
    lifeline.die_with_parent(signal.SIGKILL, multiprocessing.parent_process().pid)  # type: ignore[union-attr]
    target = logs / "dag_callbacks"
    target.mkdir(parents=True, exist_ok=True)
    with open(target / f"{item['dag_id']}.log", "a") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        out.write(
            f"--- {item['msg']}: {item['dag_id']} run {item['run_id']} "
            f"(request {item['id']}, attempt {item['attempt']})\n"
        )
        out.flush()
        conn.send(run_request(item, folder=folder, out=out))


def _timeout() -> float:
    from airflow.configuration import conf

    return conf.getfloat("dag_processor", "dag_file_processor_timeout")


def run_isolated(item: dict[str, Any], *, folder: Path, logs: Path) -> tuple[str, str]:
    """`run_request` in a forked process, killed after Airflow's processor timeout."""
    context = multiprocessing.get_context("fork")
    parent, child = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(item, folder, logs, child), daemon=True)
    process.start()
    child.close()
    timeout = _timeout()
    result: tuple[str, str] | None = None
    killed = False
    try:
        if parent.poll(timeout):
            try:
                result = parent.recv()
            except EOFError:
                result = None
        process.join(5 if result is not None else 0)
    finally:
        # Also when the runner is stopped meanwhile (SIGTERM: `serve`): never left behind.
        if process.is_alive():
            killed = True
            process.kill()
            process.join()
    if result is None and killed:
        return "failed", f"the callbacks did not end within {timeout:g} s: killed"
    if result is None:
        return "failed", f"the callback process died (exit code {process.exitcode})"
    return result


def _report(client: httpx.Client, item: dict[str, Any], state: str, error: str) -> None:
    body = {"attempt": item["attempt"], "state": state, "error": error[-100_000:]}
    for _ in range(5):
        try:
            response = client.post(f"/execution/dag-callbacks/{item['id']}/report", json=body)
        except httpx.TransportError as exc:
            _say(f"report of request {item['id']} failed ({exc!r}); retrying")
            time.sleep(1)
            continue
        if response.status_code < 500:
            if response.status_code != 200:
                _say(f"report of request {item['id']} refused: {response.text[:300]}")
            return
        time.sleep(1)


def serve(
    *, url: str, api_key: str, hostname: str, folder: Path, logs: Path, activity: Any
) -> None:
    """The runner's loop: claim one request at a time, run it, report it. `activity` (a
    shared counter) moves on every request, so the worker's `--idle-exit` waits for them."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the worker stops it (close)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # Dies with the worker, even a SIGKILLed one (issue 44): SIGTERM, the exit `close` asks for.
    lifeline.die_with_parent(signal.SIGTERM, multiprocessing.parent_process().pid)  # type: ignore[union-attr]
    # What the processor imports to run callbacks, once here (not in each request's process).
    from airflow.dag_processing import processor  # noqa: F401

    headers = {"Authorization": f"Bearer {api_key}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
        while True:
            try:
                response = client.post(
                    "/execution/dag-callbacks/claim", json={"hostname": hostname, "limit": 1}
                )
                items = response.json()["callbacks"] if response.status_code == 200 else []
                if response.status_code != 200:
                    _say(f"claim answered {response.status_code}: {response.text[:300]}")
            except (httpx.TransportError, ValueError) as exc:
                _say(f"claim failed ({exc!r})")
                items = []
            for item in items:
                activity.value += 1
                state, error = run_isolated(item, folder=folder, logs=logs)
                _say(
                    f"{item['dag_id']} run {item['run_id']}: "
                    f"{'on_failure' if item['is_failure_callback'] else 'on_success'}"
                    f"_callback ({item['msg']}) {state}"
                )
                _report(client, item, state, error)
                activity.value += 1
            if not items:
                time.sleep(POLL_SECONDS)


class Runner:
    """The callback runner beside the worker's pool: a forked process running `serve`,
    started again when it dies (its claimed request is due again when its lease ends)."""

    def __init__(self, *, url: str, api_key: str, hostname: str, folder: Path, logs: Path):
        self._context = multiprocessing.get_context("fork")
        self._args = {
            "url": url,
            "api_key": api_key,
            "hostname": hostname,
            "folder": folder.resolve(),
            "logs": logs,
        }
        self._activity = self._context.Value("q", 0, lock=False)
        self._seen = 0
        self._process = self._start()

    def _start(self) -> Any:
        process = self._context.Process(
            target=serve,
            kwargs={**self._args, "activity": self._activity},
            name="airflow-worker-dag-callbacks",
            # Not a daemon: it forks a process per request; `close` stops it.
            daemon=False,
        )
        process.start()
        return process

    def active(self) -> bool:
        """Whether a request was claimed or ended since the last look (or one is running);
        restarts a runner that died."""
        if not self._process.is_alive():
            _say(f"the callback runner exited ({self._process.exitcode}); starting another")
            self._process = self._start()
        value = self._activity.value
        moved, self._seen = value != self._seen, value
        return moved or value % 2 == 1

    def close(self) -> None:
        self._process.terminate()
        self._process.join(10)
