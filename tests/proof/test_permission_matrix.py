"""Permission matrix: every authenticated operation of `/api/v2/`, read from its OpenAPI document
(a new route is covered without editing this file), answers by the model permission its view
declares (`@needs`), for a staff session and for an API token alike:

- no permission at all: 403 `permission_denied` naming the permission, nothing written;
- every `view_*` permission of the app ("view-only"): allowed on `view` routes, 403 elsewhere;
- exactly the declared permission: past the permission check (whatever the route answers next);
- a superuser: past the check.

Session users are staff (a session needs staff status); token users are not (a token carries its
user's permissions, no more: staff status alone grants nothing and is not needed).
"""

import json
import re

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from assets_app.api import public_api, public_auth
from assets_app.api.public_permissions import permission_of
from assets_app.models import Asset

from .conftest import app_table_counts, figure, make_running_tis, make_scheduled_dag
from .test_auth_matrix import OPEN_PUBLIC_OPERATIONS, _operations, _past_the_checks, _url

pytestmark = [pytest.mark.slow, pytest.mark.django_db]

PREFIX = "/api/v2"


def _declared() -> dict[tuple[str, str], str]:
    """(method, OpenAPI path) -> the permission its view declares, from the routers."""
    declared = {}
    for _, router in public_api._routers:
        for path, view in router.path_operations.items():
            for operation in view.operations:
                permission = permission_of(operation.view_func)
                for method in operation.methods:
                    if permission is not None:
                        # `{path:variable_key}` in the router is `{variable_key}` in OpenAPI.
                        openapi_path = re.sub(r"\{\w+:(\w+)\}", r"{\1}", PREFIX + path)
                        declared[(method.lower(), openapi_path)] = permission.codename
    return declared


def _perms(*codenames: str) -> list[Permission]:
    return [
        Permission.objects.get(
            content_type__app_label=name.split(".")[0], codename=name.split(".")[1]
        )
        for name in codenames
    ]


@pytest.fixture
def world():
    dag = make_scheduled_dag("perm_dag", {"any": ["perm-a"]})
    (ti,) = make_running_tis("perm_producer", 1)
    return {
        "ti": str(ti.id),
        "dag_id": dag.dag_id,
        "asset_id": Asset.objects.get(name="perm-a").pk,
    }


class Callers:
    """A session client and a token header per permission set, made on demand."""

    def __init__(self) -> None:
        self.made: dict[tuple[str, tuple[str, ...]], tuple[Client, dict[str, str]]] = {}

    def get(self, how: str, codenames: tuple[str, ...], *, superuser: bool = False):
        key = (how + (":root" if superuser else ""), codenames)
        if key not in self.made:
            User = get_user_model()
            name = f"u{len(self.made)}"
            user = User.objects.create_user(
                name, password="pw", is_staff=how == "session", is_superuser=superuser
            )
            user.user_permissions.set(_perms(*codenames))
            client = Client(raise_request_exception=False)
            headers: dict[str, str] = {}
            if how == "session":
                client.force_login(user)
            else:
                _, key_text = public_auth.create_api_token(username=name, name="matrix")
                headers = {"Authorization": f"Bearer {key_text}"}
            self.made[key] = (client, headers)
        return self.made[key]


def _call(client: Client, headers: dict[str, str], method: str, url: str):
    kwargs = {"content_type": "application/json", "data": "{}"} if method != "get" else {}
    if url.endswith("/wait"):
        url += "?interval=1"
    return getattr(client, method)(url, headers=headers, **kwargs)


def test_every_public_route_enforces_its_model_permission_for_sessions_and_tokens(world):
    schema_client = Client()
    operations = [
        (method, path)
        for method, path, spec in _operations(schema_client, f"{PREFIX}/openapi.json")
        if (method, path) not in OPEN_PUBLIC_OPERATIONS
    ]
    declared = _declared()
    assert len(operations) >= 29
    undeclared = [op for op in operations if op not in declared]
    assert not undeclared, f"routes without @needs: {undeclared}"
    view_all = tuple(
        sorted(
            f"assets_app.{p.codename}"
            for p in Permission.objects.filter(
                content_type__app_label="assets_app", codename__startswith="view_"
            )
        )
    )
    callers = Callers()
    refused = allowed = 0
    for method, path in operations:
        needed = declared[(method, path)]
        url = _url(path, world)
        for how in ("session", "token"):
            cases = [("no permissions", (), False), ("view-only", view_all, False)]
            for label, codenames, _ in cases:
                client, headers = callers.get(how, codenames)
                before = app_table_counts()
                response = _call(client, headers, method, url)
                what = f"{how} {label}: {method.upper()} {path}"
                if label == "view-only" and needed.split(".")[1].startswith("view_"):
                    _past_the_checks(response, what)
                    allowed += 1
                    continue
                assert response.status_code == 403, f"{what}: {response.status_code}"
                detail = json.loads(response.content)["detail"]
                assert detail["reason"] == "permission_denied", what
                assert detail["permission"] == needed and needed in detail["message"], what
                assert app_table_counts() == before, what
                refused += 1
            for label, codenames, superuser in (
                ("exact permission", (needed,), False),
                ("superuser", (), True),
            ):
                client, headers = callers.get(how, codenames, superuser=superuser)
                response = _call(client, headers, method, url)
                what = f"{how} {label}: {method.upper()} {path}"
                _past_the_checks(response, what)
                allowed += 1
    figure(
        f"permissions: public API {len(operations)} routes x session/token: "
        f"{refused} refusals, {allowed} allowed calls"
    )


def test_a_non_staff_session_is_refused_even_with_the_permission(world):
    User = get_user_model()
    user = User.objects.create_user("plain-perm", password="pw")
    user.user_permissions.set(_perms("assets_app.view_dag"))
    client = Client()
    client.force_login(user)
    response = client.get(f"{PREFIX}/dags")
    assert response.status_code == 403
    assert response.json()["detail"]["reason"] == "staff_required"
