"""Waiting for a run to finish (`GET /api/v2/dags/{id}/dagRuns/{run_id}/wait`), bounded.

A wait streams `{"state": ...}` lines (NDJSON, Airflow 3.3.2's `DagRunWaiter.wait`: one line now,
one every `interval` seconds, the last one a finished state). Here each stream holds a sync web
worker for its whole length, so two rules keep waits from starving the worker API:

- **A cap.** A stream ends after RUN_WAIT_MAX_SECONDS (10 s, well under gunicorn's 30 s worker
  timeout) even if the run has not finished: its last line is then the run's current, unfinished
  state. Airflow's client reads lines until the stream ends, so a caller that wants the end
  asks again, as it would after a dropped connection.
- **Slots.** At most RUN_WAIT_MAX_CONCURRENT (1) streams at once per server: each holds an
  exclusive `flock` on one of that many files under RUN_WAIT_SLOT_DIR. A file lock, not process
  memory, because every gunicorn worker process of the host must see the others' waits (a sync
  worker serves one request at a time); the kernel frees it when the stream's file is closed or
  its process dies. Beyond the slots a wait is refused at once, 503 `too_many_waits` with
  `Retry-After` (the cap: a slot frees within it). Keep the slots below the web workers
  (`WEB_WORKERS`), so a worker is always free for the worker API.
"""

import fcntl
import json
import math
import time
from collections.abc import Generator
from pathlib import Path
from typing import IO

from django.conf import settings

from ..guards import exceptions
from . import run_reads


def _take_slot() -> IO[bytes]:
    """An open, exclusively locked slot file (closing it frees the slot), or Unavailable."""
    directory = Path(settings.RUN_WAIT_SLOT_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    slots = settings.RUN_WAIT_MAX_CONCURRENT
    for slot in range(slots):
        handle = open(directory / f"slot-{slot}", "ab")  # noqa: SIM115 - held for the stream
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        return handle
    retry_after = math.ceil(settings.RUN_WAIT_MAX_SECONDS)
    raise exceptions.Unavailable(
        f"this server streams at most {slots} run wait(s) at once (RUN_WAIT_MAX_CONCURRENT), "
        f"so that waits never take every web worker; retry in {retry_after} s",
        reason="too_many_waits",
        retry_after_seconds=retry_after,
    )


class RunWait:
    """The NDJSON lines of one wait; holds its slot until closed (the WSGI server closes the
    response, which closes this; a dropped one closes its file when collected)."""

    def __init__(self, *, dag_id: str, run_id: str, interval: float, slot: IO[bytes]) -> None:
        self._dag_id, self._run_id, self._interval = dag_id, run_id, interval
        self._slot: IO[bytes] | None = slot
        self._lines = self._generate()

    def _state(self) -> str | None:
        return run_reads.run_state(dag_id=self._dag_id, run_id=self._run_id)

    def _generate(self) -> Generator[str, None, None]:
        deadline = time.monotonic() + settings.RUN_WAIT_MAX_SECONDS
        state = self._state()
        yield json.dumps({"state": state}) + "\n"
        while state is not None and state not in run_reads.FINISHED_RUN_STATES:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            time.sleep(min(self._interval, remaining))
            state = self._state()
            yield json.dumps({"state": state}) + "\n"

    def __iter__(self) -> "RunWait":
        return self

    def __next__(self) -> str:
        return next(self._lines)

    def close(self) -> None:
        self._lines.close()
        if self._slot is not None:
            self._slot.close()
            self._slot = None


def open_wait(*, dag_id: str, run_id: str, interval: float) -> RunWait:
    """A bounded wait on the run: NotFound for an unknown run, Unavailable (`too_many_waits`)
    when every slot of this server is taken; no transaction, one query a line."""
    run_reads.get_run(dag_id=dag_id, run_id=run_id)
    return RunWait(dag_id=dag_id, run_id=run_id, interval=interval, slot=_take_slot())
