"""A reference worker over HTTP: the client the demo, the end-to-end tests and the load tests use.

It speaks only the worker API (`/execution/`), like a real worker on another machine:

1. `POST /execution/workloads/claim` (WORKER_API_KEY) for up to as many TIs as it has free slots;
   with no work it backs off exponentially (0.2 s doubling up to `idle_backoff_max`).
2. per TI, in its own thread: `PATCH .../run`, then "runs" for `task_seconds` while sending
   `PUT .../heartbeat` every `heartbeat_seconds`;
3. reports `success` with each declared outlet emitted once (`extra` says who wrote it:
   `{"written_by": "<hostname>/<pid>", "ti_id", "try_number"}`), or, with probability
   `fail_probability`, `up_for_retry` when the run context says `should_retry`, else `failed`.
   A heartbeat answered 404/409 (the TI is no longer ours) abandons the TI without reporting.
   An alias outlet is emitted through the alias into the asset `<alias>-output`
   (uri `reference-worker://<alias>-output`).

A 503 (the server's database is full or away; nothing was written) is retried after the
answer's `Retry-After` (plus up to 20 % jitter, at most `MAX_RETRY_AFTER_SECONDS` each), for at
most `unavailable_max_seconds` in a row per call; a 500 is not retried (that is a bug to report).
It honours `Refreshed-API-Token` response headers, and stops after `max_tis` finished TIs, after
`max_seconds` (in-flight TIs are finished first), or after one claim round with `once`.
Progress lines go to `out` (stdout for the command).
"""

import os
import random
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import requests

API_VERSION = "2026-06-30"
# A server asking for a longer wait than this is waited for this long, then asked again.
MAX_RETRY_AFTER_SECONDS = 60.0


def retry_after_seconds(response: requests.Response) -> float:
    """The answer's `Retry-After` in seconds (1 when missing or an HTTP date), within
    [0.1, MAX_RETRY_AFTER_SECONDS]."""
    try:
        seconds = float(response.headers.get("Retry-After", "1"))
    except ValueError:
        seconds = 1.0
    return min(max(seconds, 0.1), MAX_RETRY_AFTER_SECONDS)


class TaskAbandoned(Exception):
    """The server says this TI is no longer ours to run."""


class Output(Protocol):
    """Where the worker's log lines go: a text stream or a management command's stdout."""

    def write(self, text: str, /) -> Any: ...

    def flush(self) -> Any: ...


@dataclass(frozen=True)
class WorkerConfig:
    url: str  # server root, e.g. http://127.0.0.1:8000
    api_key: str
    hostname: str
    concurrency: int = 4
    task_seconds: float = 1.0
    heartbeat_seconds: float = 5.0
    fail_probability: float = 0.0
    retry_delay_seconds: float | None = None
    once: bool = False
    max_tis: int | None = None
    max_seconds: float | None = None
    idle_backoff_max: float = 5.0
    request_timeout: float = 30.0
    unavailable_max_seconds: float = 300.0


@dataclass
class WorkerStats:
    claimed: int = 0
    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    errors: int = 0
    unavailable: int = 0  # 503 answers waited out and retried
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def finished(self) -> int:
        return self.succeeded + self.failed + self.retried + self.errors

    def add(self, name: str) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + 1)


def _now() -> str:
    return datetime.now(UTC).isoformat()


class ReferenceWorker:
    def __init__(self, config: WorkerConfig, *, out: Output) -> None:
        self.config = config
        self.out = out
        self.stats = WorkerStats()
        self.pid = os.getpid()
        self.unixname = os.environ.get("USER", "worker")
        self._print_lock = threading.Lock()
        self._local = threading.local()
        self.base = config.url.rstrip("/") + "/execution"

    # --- plumbing ---------------------------------------------------------------------------

    def log(self, line: str) -> None:
        with self._print_lock:
            self.out.write(f"[{datetime.now(UTC):%H:%M:%S}] {line}\n")
            self.out.flush()

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
            session.headers["Airflow-API-Version"] = API_VERSION
        return session

    def _send(self, method: str, url: str, *, bearer: str, body: Any) -> requests.Response:
        """One request; a 503 is asked again after its Retry-After (see the module docstring)."""
        waited = 0.0
        while True:
            response = self._session().request(
                method,
                url,
                json=body,
                headers={"Authorization": f"Bearer {bearer}"},
                timeout=self.config.request_timeout,
            )
            if response.status_code != 503 or waited >= self.config.unavailable_max_seconds:
                return response
            delay = retry_after_seconds(response) * (1 + random.random() * 0.2)
            self.stats.add("unavailable")
            self.log(f"{method} {url}: 503, retrying in {delay:.1f} s")
            time.sleep(delay)
            waited += delay

    def _call(self, method: str, path: str, *, token: str, body: Any) -> requests.Response:
        return self._send(method, f"{self.base}{path}", bearer=token, body=body)

    # --- the loop ---------------------------------------------------------------------------

    def run(self) -> WorkerStats:
        config = self.config
        deadline = None if config.max_seconds is None else time.monotonic() + config.max_seconds
        backoff = 0.2
        in_flight: set[Future] = set()
        self.log(
            f"worker {config.hostname} pid {self.pid}: {config.concurrency} slots, "
            f"task {config.task_seconds}s, fail probability {config.fail_probability}"
        )
        with ThreadPoolExecutor(max_workers=config.concurrency) as pool:
            while True:
                in_flight = {f for f in in_flight if not f.done()}
                if deadline is not None and time.monotonic() >= deadline:
                    break
                wanted = config.concurrency - len(in_flight)
                if config.max_tis is not None:
                    wanted = min(wanted, config.max_tis - self.stats.claimed)
                    if wanted <= 0 and not in_flight:
                        break
                workloads = self._claim(wanted) if wanted > 0 else []
                for workload in workloads:
                    in_flight.add(pool.submit(self._run_one, workload))
                if config.once:
                    break
                if workloads:
                    backoff = 0.2
                    continue
                time.sleep(backoff if not in_flight else 0.05)
                if not in_flight:
                    backoff = min(backoff * 2, config.idle_backoff_max)
        self.log(
            f"done: claimed {self.stats.claimed}, succeeded {self.stats.succeeded}, "
            f"failed {self.stats.failed}, retried {self.stats.retried}, "
            f"errors {self.stats.errors}, 503s waited out {self.stats.unavailable}"
        )
        return self.stats

    def _claim(self, limit: int) -> list[dict[str, Any]]:
        try:
            response = self._send(
                "POST",
                f"{self.base}/workloads/claim",
                bearer=self.config.api_key,
                body={"hostname": self.config.hostname, "limit": limit},
            )
            response.raise_for_status()
        except requests.RequestException as exc:
            self.log(f"claim failed: {exc}")
            return []
        workloads = response.json()["workloads"]
        if workloads:
            with self.stats.lock:
                self.stats.claimed += len(workloads)
            self.log(f"claimed {len(workloads)}")
        return workloads

    # --- one task instance ------------------------------------------------------------------

    def _run_one(self, workload: dict[str, Any]) -> None:
        ti = workload["ti"]
        name = f"{ti['dag_id']}.{ti['task_id']} [{ti['run_id']}] try {ti['try_number']}"
        token = workload["token"]
        try:
            started = self._call(
                "PATCH",
                f"/task-instances/{ti['id']}/run",
                token=token,
                body={
                    "state": "running",
                    "hostname": self.config.hostname,
                    "unixname": self.unixname,
                    "pid": self.pid,
                    "start_date": _now(),
                },
            )
            if started.status_code != 200:
                self.log(f"start of {name} refused: {started.status_code} {started.text}")
                self.stats.add("errors")
                return
            token = started.headers.get("Refreshed-API-Token", token)
            context = started.json()
            self.log(f"started {name}")
            token = self._work(ti, token)
            if random.random() < self.config.fail_probability:
                self._fail(ti, name, token, should_retry=bool(context.get("should_retry")))
            else:
                self._succeed(ti, name, token, workload["task_outlets"])
        except (requests.RequestException, TaskAbandoned) as exc:
            self.log(f"{name}: {exc}")
            self.stats.add("errors")

    def _work(self, ti: dict[str, Any], token: str) -> str:
        """Sleep `task_seconds`, heartbeating every `heartbeat_seconds`; returns the last token."""
        end = time.monotonic() + self.config.task_seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, self.config.heartbeat_seconds))
            if end - time.monotonic() <= 0:
                break
            beat = self._call(
                "PUT",
                f"/task-instances/{ti['id']}/heartbeat",
                token=token,
                body={"hostname": self.config.hostname, "pid": self.pid},
            )
            if beat.status_code in (404, 409):
                # Not ours any more (finished, retried or running elsewhere): stop, like Airflow.
                raise TaskAbandoned(f"heartbeat answered {beat.status_code}: {beat.text}")
            if beat.status_code != 204:
                self.log(f"heartbeat of {ti['id']} answered {beat.status_code}: {beat.text}")
            token = beat.headers.get("Refreshed-API-Token", token)
        return token

    def _outlet_events(self, ti: dict[str, Any], outlets: list[dict]) -> list[dict[str, Any]]:
        extra = {
            "written_by": f"{self.config.hostname}/{self.pid}",
            "ti_id": ti["id"],
            "try_number": ti["try_number"],
        }
        events: list[dict[str, Any]] = []
        for outlet in outlets:
            if outlet.get("type") == "AssetAlias":
                target = f"{outlet['name']}-output"
                events.append(
                    {
                        "source_alias_name": outlet["name"],
                        "dest_asset_key": {
                            "name": target,
                            "uri": f"reference-worker://{target}",
                        },
                        "dest_asset_extra": {},
                        "extra": extra,
                    }
                )
            else:
                events.append(
                    {
                        "dest_asset_key": {"name": outlet["name"], "uri": outlet["uri"]},
                        "extra": extra,
                    }
                )
        return events

    def _succeed(self, ti: dict[str, Any], name: str, token: str, outlets: list[dict]) -> None:
        response = self._call(
            "PATCH",
            f"/task-instances/{ti['id']}/state",
            token=token,
            body={
                "state": "success",
                "end_date": _now(),
                "task_outlets": outlets,
                "outlet_events": self._outlet_events(ti, outlets),
                "rendered_map_index": None,
            },
        )
        if response.status_code in (200, 204):
            self.stats.add("succeeded")
            self.log(f"success {name} ({len(outlets)} outlets)")
        else:
            self.stats.add("errors")
            self.log(f"success of {name} refused: {response.status_code} {response.text}")

    def _fail(self, ti: dict[str, Any], name: str, token: str, *, should_retry: bool) -> None:
        body: dict[str, Any] = {"end_date": _now()}
        if should_retry:
            body["state"] = "up_for_retry"
            if self.config.retry_delay_seconds is not None:
                body["retry_delay_seconds"] = self.config.retry_delay_seconds
        else:
            body["state"] = "failed"
        response = self._call("PATCH", f"/task-instances/{ti['id']}/state", token=token, body=body)
        if response.status_code in (200, 204):
            self.stats.add("retried" if should_retry else "failed")
            self.log(f"{body['state']} {name} (simulated failure)")
        else:
            self.stats.add("errors")
            self.log(f"{body['state']} of {name} refused: {response.status_code} {response.text}")
