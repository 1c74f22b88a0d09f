"""The model permission each public API route needs, declared in one place per route.

Every view of `/api/v2/` carries `@needs(action, Model)` (under its router decorator), with the
admin's own permission vocabulary: `view`, `add`, `change` or `delete` of one model. Today it
records the declaration (`permission_of`, and `tests/api/test_public_permissions.py` checks that
every authenticated route has one); authentication (`public_auth`) is unchanged. The hardening
work (issue 13) enforces these same declarations for sessions and API tokens alike, in this
decorator, so no route needs editing then.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from django.db import models

Action = Literal["view", "add", "change", "delete"]


@dataclass(frozen=True)
class Permission:
    action: Action
    model: type[models.Model]

    @property
    def codename(self) -> str:
        """Django's permission name, e.g. `assets_app.change_dag`."""
        return f"{self.model._meta.app_label}.{self.action}_{self.model._meta.model_name}"


def needs(action: Action, model: type[models.Model]) -> Callable[[Callable], Callable]:
    """Declare the permission a public API view needs."""

    def declare(view: Callable) -> Callable:
        view.public_api_permission = Permission(action=action, model=model)  # type: ignore[attr-defined]
        return view

    return declare


def permission_of(view: Callable[..., Any]) -> Permission | None:
    return getattr(view, "public_api_permission", None)
