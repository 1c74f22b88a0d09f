"""Measure how long a transaction holds a TaskInstance row lock, and what it does meanwhile.

Benchmark-only instrumentation; nothing in the product imports it.

A `LockMeter` is a Django `execute_wrapper` plus a wrapper around the connection's commit and
rollback. Per transaction it records:

- `lock_start`: the monotonic time just before the first statement that locks a TI row (a
  `SELECT ... FOR UPDATE` / `FOR NO KEY UPDATE` naming the TI table, or an `UPDATE` of it),
- `lock_acquired`: just after that statement returned,
- `commit_started`: just before COMMIT was sent (so `commit_ms` is the WAL flush),
- `end`: just after COMMIT (or ROLLBACK) returned, which is when PostgreSQL released the lock,
- `statements_under_lock`: statements executed after the locking one and before COMMIT,
- `statements`: all statements of the measured scope (a request, or an explicit block).

`hold_ms` = end - lock_acquired (the lock wait is reported apart as `wait_ms`).

In a server the middleware `LockMeterMiddleware` (enabled by `bench/settings_bench.py` when
`BENCH_LOCKMETER_FILE` is set) wraps every request and appends one JSON line per request to that
file: method, path, status, duration, statements, and the lock records of the request.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import connections

TI_TABLE = '"assets_app_taskinstance"'


@dataclass
class LockRecord:
    lock_start: float
    lock_acquired: float
    end: float = 0.0
    commit_started: float = 0.0
    statements_under_lock: int = 0
    outcome: str = ""
    sql: str = ""

    @property
    def hold_ms(self) -> float:
        return (self.end - self.lock_acquired) * 1000.0

    @property
    def commit_ms(self) -> float:
        """Time inside COMMIT itself (the WAL flush): the floor of any hold."""
        return (self.end - self.commit_started) * 1000.0 if self.commit_started else 0.0

    @property
    def wait_ms(self) -> float:
        return (self.lock_acquired - self.lock_start) * 1000.0


@dataclass
class MeterScope:
    statements: int = 0
    locks: list[LockRecord] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "statements": self.statements,
            "locks": [
                {
                    "hold_ms": lock.hold_ms,
                    "wait_ms": lock.wait_ms,
                    "commit_ms": lock.commit_ms,
                    "statements_under_lock": lock.statements_under_lock,
                    "outcome": lock.outcome,
                    "sql": lock.sql[:200],
                }
                for lock in self.locks
            ],
        }


def _locks_ti_row(sql: str) -> bool:
    if TI_TABLE not in sql:
        return False
    text = sql.lstrip()
    if text[:7].upper() == "UPDATE " and text[7:].lstrip().startswith(TI_TABLE):
        return True
    return text[:6].upper() == "SELECT" and (" FOR UPDATE" in sql or " FOR NO KEY UPDATE" in sql)


class LockMeter:
    """Install on the current thread's connection with `with LockMeter() as scope:`."""

    def __init__(self) -> None:
        self.scope = MeterScope()
        self._open: LockRecord | None = None
        self._saved: dict[str, Callable[[], Any]] = {}

    def __call__(self, execute, sql, params, many, context):  # execute_wrapper protocol
        self.scope.statements += 1
        if self._open is not None:
            self._open.statements_under_lock += 1
            return execute(sql, params, many, context)
        if not _locks_ti_row(sql):
            return execute(sql, params, many, context)
        start = time.monotonic()
        result = execute(sql, params, many, context)
        if _real_connection().in_atomic_block:
            self._open = LockRecord(lock_start=start, lock_acquired=time.monotonic(), sql=sql)
        else:
            # Autocommit: the statement's own implicit transaction held the lock.
            now = time.monotonic()
            self.scope.locks.append(
                LockRecord(start, start, end=now, outcome="autocommit", sql=sql)
            )
        return result

    def _finish(self, outcome: str) -> None:
        if self._open is not None:
            self._open.end = time.monotonic()
            self._open.outcome = outcome
            self.scope.locks.append(self._open)
            self._open = None

    def __enter__(self) -> MeterScope:
        real = _real_connection()
        self._saved = {"_commit": real._commit, "_rollback": real._rollback}

        def _commit():
            if self._open is not None:
                self._open.commit_started = time.monotonic()
            try:
                return self._saved["_commit"]()
            finally:
                self._finish("commit")

        def _rollback():
            try:
                return self._saved["_rollback"]()
            finally:
                self._finish("rollback")

        real._commit = _commit
        real._rollback = _rollback
        real.execute_wrappers.append(self)
        return self.scope

    def __exit__(self, *exc: object) -> None:
        real = _real_connection()
        real.execute_wrappers.remove(self)
        del real._commit
        del real._rollback
        self._finish("open-at-exit")


def _real_connection():
    """The calling thread's DatabaseWrapper (not the module-level proxy)."""
    return connections["default"]


_file_lock = threading.Lock()


class LockMeterMiddleware:
    """Per request: meter the TI lock and append a JSON line to $BENCH_LOCKMETER_FILE."""

    def __init__(self, get_response: Callable) -> None:
        self.get_response = get_response
        self.path = os.environ["BENCH_LOCKMETER_FILE"]

    def __call__(self, request):
        started = time.monotonic()
        with LockMeter() as scope:
            response = self.get_response(request)
        record = {
            "pid": os.getpid(),
            "method": request.method,
            "path": request.path,
            "status": response.status_code,
            "server_ms": (time.monotonic() - started) * 1000.0,
            **scope.summary(),
        }
        line = json.dumps(record) + "\n"
        with _file_lock, open(self.path, "a") as handle:
            handle.write(line)
        return response
