"""Airflow's event log (`GET /api/v2/eventLogs[/{id}]`, Airflow 3.3.2's `event_logs.py` route)
read from the service's audit trail (`AuditEntry`): the service writes no other log of actions.

An entry maps to Airflow's `Log` row as honestly as it can: `event` is the audited action
(`trigger_run`, `clear_run`, `api_login`, ...), `owner` the acting user's name (`os:<login>` for
a management command, `task instance <id>` for a task through the worker API), `when` the entry's
time, `dag_id` its Dag ("" reads as null), `run_id` / `task_id` / `map_index` / `try_number` the
entry's detail when the action names them (null otherwise), `logical_date` null (the trail does not
keep it) and `extra` the entry as JSON text (its summary, door and detail), as Airflow keeps a
request's extra there.

Cost (invariant 20): the default order is the primary key, `when` reads the `audit_by_time`
index; a plain load (no filter) of a trail the planner estimates above `COUNT_ESTIMATE_ABOVE` rows
takes that estimate as `total_entries` instead of counting it (as the admin's lists do); a
filtered page counts its own rows. Nothing here writes or locks.
"""

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db.models import DateTimeField, Q, QuerySet, Value
from django.db.models.fields.json import KT

from ..guards import exceptions
from ..models import AuditEntry
from ..sql import estimates
from . import listing

COUNT_ESTIMATE_ABOVE = 100_000

ORDERING = listing.Ordering(
    keys={
        "id": "id",
        "event_log_id": "id",
        "dttm": "at",
        "when": "at",
        "dag_id": "dag_id",
        "task_id": "log_task_id",
        "run_id": "log_run_id",
        "event": "action",
        "logical_date": Value(None, output_field=DateTimeField()),
        "owner": "actor_name",
        "extra": "summary",
    },
    default=("id",),
)


def _entries() -> QuerySet:
    return AuditEntry.objects.annotate(
        log_task_id=KT("detail__task_id"),
        log_run_id=KT("detail__run_id"),
        log_map_index=KT("detail__map_index"),
        log_try_number=KT("detail__try_number"),
    )


def list_event_logs(
    *,
    dag_id: str | None = None,
    task_id: str | None = None,
    run_id: str | None = None,
    map_index: int | None = None,
    try_number: int | None = None,
    owner: str | None = None,
    event: str | None = None,
    excluded_events: Sequence[str] = (),
    included_events: Sequence[str] = (),
    before: datetime | None = None,
    after: datetime | None = None,
    dag_id_pattern: str | None = None,
    task_id_pattern: str | None = None,
    run_id_pattern: str | None = None,
    owner_pattern: str | None = None,
    event_pattern: str | None = None,
    dag_id_prefix_pattern: str | None = None,
    task_id_prefix_pattern: str | None = None,
    run_id_prefix_pattern: str | None = None,
    owner_prefix_pattern: str | None = None,
    event_prefix_pattern: str | None = None,
    order_by: Sequence[str] | None = None,
    limit: int = listing.DEFAULT_PAGE_LIMIT,
    offset: int = 0,
) -> listing.Page:
    """A page of audit entries with Airflow's filters (exact, `*_pattern`, `*_prefix_pattern`,
    `before`/`after` strict, included/excluded events). 2 queries (count or estimate, page)."""
    q = Q()
    for field, value in (
        ("dag_id", dag_id),
        ("log_task_id", task_id),
        ("log_run_id", run_id),
        ("log_map_index", None if map_index is None else str(map_index)),
        ("log_try_number", None if try_number is None else str(try_number)),
        ("actor_name", owner),
        ("action", event),
    ):
        if value is not None:
            q &= Q(**{field: value})
    if included_events:
        q &= Q(action__in=list(included_events))
    if excluded_events:
        q &= ~Q(action__in=list(excluded_events))
    if before is not None:
        q &= Q(at__lt=listing.as_utc(before, field="before"))
    if after is not None:
        q &= Q(at__gt=listing.as_utc(after, field="after"))
    for field, pattern, prefix in (
        ("dag_id", dag_id_pattern, dag_id_prefix_pattern),
        ("log_task_id", task_id_pattern, task_id_prefix_pattern),
        ("log_run_id", run_id_pattern, run_id_prefix_pattern),
        ("actor_name", owner_pattern, owner_prefix_pattern),
        ("action", event_pattern, event_prefix_pattern),
    ):
        q &= listing.pattern_q(field, pattern) & listing.prefix_q(field, prefix)
    entries = _entries()
    if q:
        entries = entries.filter(q)
        return listing.offset_page(entries, ORDERING, order_by=order_by, limit=limit, offset=offset)
    estimate = estimates.estimated_rows(AuditEntry)
    if estimate is None or estimate <= COUNT_ESTIMATE_ABOVE:
        return listing.offset_page(entries, ORDERING, order_by=order_by, limit=limit, offset=offset)
    limit = listing.page_limit(limit)
    rows = listing.ordered(entries, ORDERING, order_by)[offset : offset + limit] if limit else []
    return listing.Page(rows=list(rows), total_entries=estimate)


def get_event_log(event_log_id: int) -> AuditEntry:
    entry = _entries().filter(pk=event_log_id).first()
    if entry is None:
        raise exceptions.NotFound(
            f"The Event Log with id: `{event_log_id}` not found", reason="event_log_not_found"
        )
    return entry


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def as_airflow_log(entry: AuditEntry) -> dict[str, Any]:
    """The fields of Airflow's EventLogResponse for one entry (see the module docstring)."""
    detail = entry.detail if isinstance(entry.detail, dict) else {}
    task_id = _text(detail.get("task_id"))
    return {
        "event_log_id": entry.pk,
        "when": entry.at,
        "dag_id": entry.dag_id or None,
        "task_id": task_id,
        "run_id": _text(detail.get("run_id")),
        "map_index": _int(detail.get("map_index")),
        "try_number": _int(detail.get("try_number")),
        "event": entry.action,
        "logical_date": None,
        "owner": entry.actor_name,
        "extra": json.dumps(
            {"summary": entry.summary, "via": entry.via, "detail": entry.detail},
            sort_keys=True,
            default=str,
        ),
        "dag_display_name": entry.dag_id or None,
        "task_display_name": task_id,
    }
