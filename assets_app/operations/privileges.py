"""Who may do what, audited (issue 38): a change to a user's flags (superuser, staff, active),
permissions or groups, or to a group's permissions, is an audit entry naming what was granted
and what was taken away. The admin's user and group pages call these after they saved, in the
admin's own transaction (Django's auth admin wraps its saves in atomic())."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import audit

FLAGS = ("is_superuser", "is_staff", "is_active")


@dataclass(frozen=True)
class Grants:
    """What a user (or a group: no flags, no groups) holds at one moment."""

    flags: frozenset[str]
    permissions: frozenset[str]  # "app_label.codename"
    groups: frozenset[str]


def of_user(user: Any) -> Grants:
    if user is None or user.pk is None:
        return Grants(frozenset(), frozenset(), frozenset())
    return Grants(
        flags=frozenset(flag for flag in FLAGS if getattr(user, flag)),
        permissions=_permissions(user.user_permissions.all()),
        groups=frozenset(user.groups.values_list("name", flat=True)),
    )


def of_group(group: Any) -> Grants:
    if group is None or group.pk is None:
        return Grants(frozenset(), frozenset(), frozenset())
    return Grants(frozenset(), _permissions(group.permissions.all()), frozenset())


def _permissions(queryset) -> frozenset[str]:
    return frozenset(
        f"{app}.{codename}"
        for app, codename in queryset.values_list("content_type__app_label", "codename")
    )


def record_change(
    *, actor: audit.Actor | None, kind: str, name: str, before: Grants, after: Grants
) -> bool:
    """One audit entry (`privileges.change`) when `after` differs from `before`; False when
    nothing changed. In the caller's transaction."""
    granted = {
        "flags": sorted(after.flags - before.flags),
        "permissions": sorted(after.permissions - before.permissions),
        "groups": sorted(after.groups - before.groups),
    }
    revoked = {
        "flags": sorted(before.flags - after.flags),
        "permissions": sorted(before.permissions - after.permissions),
        "groups": sorted(before.groups - after.groups),
    }
    granted = {k: v for k, v in granted.items() if v}
    revoked = {k: v for k, v in revoked.items() if v}
    if not granted and not revoked:
        return False
    words = [
        *(f"+{item}" for values in granted.values() for item in values),
        *(f"-{item}" for values in revoked.values() for item in values),
    ]
    audit.record(
        actor=actor,
        action="privileges.change",
        summary=f"changed what {kind} {name} may do: {', '.join(words)}"[:1000],
        targets=[audit.Target(kind=kind, object_id=name)],
        detail={"granted": granted, "revoked": revoked},
    )
    return True
