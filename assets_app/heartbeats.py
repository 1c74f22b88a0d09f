"""ComponentHeartbeat rows: when a background component ("drain", "scheduler") last ran."""

from typing import Any

from django.utils import timezone

from .models import ComponentHeartbeat


def record(*, component: str, ok: bool, detail: dict[str, Any]) -> None:
    """Upsert the component's heartbeat in one statement (autocommit; no lock held after it).

    `last_ok_at` moves only when the run succeeded, so a failing component shows a stale one.
    """
    now = timezone.now()
    update_fields = ["last_run_at", "detail", *(["last_ok_at"] if ok else [])]
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
