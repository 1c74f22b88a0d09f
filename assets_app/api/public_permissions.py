"""The model permission each public API route needs, declared in one place per route.

Every view of `/api/v2/` carries `@needs(action, Model)` (under its router decorator), with the
admin's own permission vocabulary: `view`, `add`, `change` or `delete` of one model
(`tests/api/test_public_v2.py` checks that every authenticated route has one). The decorator also
enforces it: the route's authentication becomes `public_auth.public_api_auth(permission)`, so the
user a token acts for, or the session's staff user, must hold that permission (Django's
`has_perm`: a superuser holds all, staff status alone none) or the request is a 403
(`permission_denied`, naming the permission) before its query or body is even validated, as
Airflow checks access in a dependency before the body.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from django.db import models

from . import public_auth

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

    permission = Permission(action=action, model=model)

    def enforce(operation: Any) -> None:
        # Called by ninja when the route's Operation is built: an explicit auth list replaces the
        # router's (`auth_param` set, so the router does not override it when it is mounted).
        operation.auth_param = public_auth.public_api_auth(permission.codename)
        operation.auth_callbacks = operation.auth_param

    def declare(view: Callable) -> Callable:
        view.public_api_permission = permission  # type: ignore[attr-defined]
        contributors = getattr(view, "_ninja_contribute_to_operation", [])
        view._ninja_contribute_to_operation = [*contributors, enforce]  # type: ignore[attr-defined]
        return view

    return declare


def permission_of(view: Callable[..., Any]) -> Permission | None:
    return getattr(view, "public_api_permission", None)
