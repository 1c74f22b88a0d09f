"""ComponentHeartbeat rows: when a background component ("drain", "scheduler") last ran."""

import logging
from typing import Any

from django.db import DatabaseError
from django.utils import timezone

from ..models import ComponentHeartbeat

logger = logging.getLogger(__name__)


def record(*, component: str, ok: bool, detail: dict[str, Any]) -> None:
    """Upsert the component's heartbeat in one statement (autocommit; no lock held after it).

    `last_ok_at` moves only when the run succeeded, so a failing component shows a stale one.
    A heartbeat that cannot be written is logged, never raised: it must neither fail a run
    that worked nor hide the error of one that did not.
    """
    now = timezone.now()
    update_fields = ["last_run_at", "detail", *(["last_ok_at"] if ok else [])]
    try:
        _upsert(component, now=now, ok=ok, detail=detail, update_fields=update_fields)
    except DatabaseError:
        logger.exception("could not record the %s heartbeat", component)


def _upsert(
    component: str, *, now: Any, ok: bool, detail: dict[str, Any], update_fields: list[str]
) -> None:
    ComponentHeartbeat.objects.bulk_create(
        [
            ComponentHeartbeat(
                component=component, last_run_at=now, last_ok_at=now if ok else None, detail=detail
            )
        ],
        update_conflicts=True,
        unique_fields=["component"],
        update_fields=update_fields,
    )
