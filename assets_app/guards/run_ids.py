"""Run ids as Airflow 3.3.2 allows them (issue 26): one path segment, never a way out of a folder.

Airflow (`airflow/models/dagrun.py`, `DagRun.validate_run_id`) refuses a run id with `..`
(unless `[core] allow_double_dot_in_ids`), then accepts one matching `RUN_ID_REGEX` (the ids it
generates, `manual__2026-01-01T00:00:00+00:00`) or `[scheduler] allowed_run_id_pattern`, whose
default is `^[A-Za-z0-9_.~:+-]+$`. The ids it generates match that default too, so one pattern
is enough here. Airflow matches with `re.match`, which lets `$` accept a trailing newline; here
the whole id must match. Its column is 250 characters, like Airflow's (`StringID`).

Every door that creates runs goes through `runs.trigger_dag`, which calls `check_run_id`: the
public API, the admin, the `trigger_dag` command and a task's `TriggerDagRunOperator`
(`/execution/dag-runs/{dag_id}/{run_id}`). Log paths (`api/schemas.log_path_of`) are built from
`path_segment`, so a run id stored before this check cannot name another folder either.
"""

import re
from typing import Any

from ..models.dags import DAG_ID_MAX_LENGTH
from . import exceptions

ALLOWED_RUN_ID_PATTERN = r"^[A-Za-z0-9_.~:+-]+$"
_ALLOWED = re.compile(r"[A-Za-z0-9_.~:+-]+")
MAX_LENGTH = DAG_ID_MAX_LENGTH


def run_id_problem(run_id: Any) -> str | None:
    """Why `run_id` is not an allowed run id, or None."""
    if not isinstance(run_id, str) or not run_id:
        return "must be a non-empty string"
    if len(run_id) > MAX_LENGTH:
        return f"has {len(run_id)} characters; at most {MAX_LENGTH} are allowed"
    if ".." in run_id:
        return "must not contain '..' (path traversal)"
    if not _ALLOWED.fullmatch(run_id):
        return f"must match Airflow's allowed_run_id_pattern {ALLOWED_RUN_ID_PATTERN!r}"
    return None


def check_run_id(run_id: Any, *, field: str = "dag_run_id") -> None:
    """Raise InvalidInput (`invalid_run_id`, HTTP 422, naming `field`) for a disallowed id."""
    problem = run_id_problem(run_id)
    if problem is not None:
        shown = run_id[:80] if isinstance(run_id, str) else run_id
        raise exceptions.InvalidInput(
            f"{field} {shown!r} {problem}", reason="invalid_run_id", loc=["body", field]
        )


def path_segment(value: Any) -> str:
    """`value` as one safe path segment: itself when it is an allowed id, else every character
    outside [A-Za-z0-9_-] written %XX (so no `/`, `\\`, `..` or NUL survives)."""
    text = str(value)
    if run_id_problem(text) is None:
        return text
    return "".join(
        c
        if c.isascii() and (c.isalnum() or c in "_-")
        else "".join(f"%{b:02X}" for b in c.encode())
        for c in text
    )
