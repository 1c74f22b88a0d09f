"""The audit trail: who did what to which rows, and when (`AuditEntry`, `AuditTarget`).

Domain functions that act for an operator (outbox requeue / park / delete, clearing queued
events, triggering and clearing runs, registering an event through the public API, changing an
asset) take an `actor` and call `record` inside their own transaction, so the admin, the
management commands and the public API are audited from one place and an entry exists exactly
when the action committed. Entry points only say who is acting: `Actor.from_user(request.user,
via="admin")`, `Actor.os_user()` for commands (the OS login: commands have no Django user),
`Actor.of_task(ti_id, try_number)` for the worker API (a running task's token: the entry names
that TI as its origin, `detail["ti_id"]`, rather than "system").
"""

import getpass
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from ..models import AuditEntry, AuditTarget, AuditVia


@dataclass(frozen=True)
class Actor:
    """Who is acting: a display name, the door (`AuditVia`), the Django user id when known."""

    name: str
    via: str
    user_id: int | None = None
    ti_id: str | None = None  # the acting TI (via "task")
    try_number: int | None = None

    @classmethod
    def from_user(cls, user: Any, *, via: str) -> "Actor":
        if user is None or not getattr(user, "is_authenticated", False):
            return cls(name="anonymous", via=via)
        return cls(name=user.get_username(), via=via, user_id=user.pk)

    @classmethod
    def os_user(cls) -> "Actor":
        """The login running a management command (`$SUDO_USER` first: who typed `sudo`)."""
        try:
            login = getpass.getuser()
        except (KeyError, OSError):
            login = f"uid {os.getuid()}"
        sudo = os.environ.get("SUDO_USER")
        return cls(name=f"os:{sudo} (as {login})" if sudo else f"os:{login}", via=AuditVia.COMMAND)

    @classmethod
    def of_task(cls, ti_id: UUID | str, *, try_number: int | None = None) -> "Actor":
        """A running task acting through the worker API with its token (one TI try)."""
        return cls(
            name=f"task instance {ti_id}",
            via=AuditVia.TASK,
            ti_id=str(ti_id),
            try_number=try_number,
        )


# An action nobody attributed (a call from code or a test without an actor).
SYSTEM = Actor(name="system", via=AuditVia.SYSTEM)


@dataclass(frozen=True)
class Target:
    kind: str
    object_id: Any
    ti_id: UUID | str | None = None


def record(
    *,
    actor: Actor | None,
    action: str,
    summary: str,
    targets: Iterable[Target] = (),
    dag_id: str = "",
    detail: dict[str, Any] | None = None,
) -> AuditEntry:
    """Write one entry and its targets. Runs inside the caller's transaction (the one that does
    the action): two INSERTs whatever the number of targets."""
    actor = actor or SYSTEM
    targets = list(targets)
    detail = dict(detail or {})
    if actor.ti_id is not None:
        detail.update(ti_id=actor.ti_id, try_number=actor.try_number)
    entry = AuditEntry.objects.create(
        actor_id=actor.user_id,
        actor_name=actor.name[:200],
        via=actor.via,
        action=action,
        summary=summary,
        dag_id=dag_id[:250],
        row_count=len(targets),
        detail=detail,
    )
    if targets:
        AuditTarget.objects.bulk_create(
            [
                AuditTarget(
                    entry=entry,
                    kind=t.kind,
                    object_id=str(t.object_id)[:300],
                    ti_id=t.ti_id or None,
                )
                for t in targets
            ]
        )
    return entry


def ids_text(ids: Iterable[Any], *, limit: int = 20) -> str:
    """`1, 2, 3` or `1, 2, ... (25 in all)` for a summary line."""
    ids = list(ids)
    shown = ", ".join(str(i) for i in ids[:limit])
    return shown if len(ids) <= limit else f"{shown}, ... ({len(ids)} in all)"
