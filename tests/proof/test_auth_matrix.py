"""Auth matrix: every endpoint of both APIs, read from their OpenAPI documents, refuses every kind
of bad credential with a `detail.reason` body and no write; the admin needs a staff login and
keeps CSRF on.

Worker API, task-token endpoints: no header, another scheme, an expired token, a token signed
with another key, an unsigned (`alg: none`) token, garbage, the worker API key, and (on
`/task-instances/{id}/...`) a valid token of another TI. The claim endpoint: no header, a wrong
key, a task token. Public API: no header, another scheme, an unknown key, a worker task token, an
inactive user's key, login tokens (issue 49) expired or of another key, an anonymous session, a
non-staff session, and a staff session without the CSRF token on unsafe methods. Each endpoint
also gets the right credential (on the public API: an API key, then a login token), which must
get past authentication (so the matrix cannot pass by refusing everything).
"""

import json
import time

import jwt
import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client

from assets_app.api import public_auth
from assets_app.api.auth import issue_token
from assets_app.models import Asset
from assets_app.operations import logins

from .conftest import app_table_counts, figure, make_running_tis, make_scheduled_dag

pytestmark = pytest.mark.django_db(transaction=True)


# Open without credentials, as in Airflow: they reveal no data.
OPEN_PUBLIC_OPERATIONS = {("get", "/api/v2/version"), ("get", "/api/v2/monitor/health")}


def _operations(client: Client, schema_path: str) -> list[tuple[str, str, dict]]:
    schema = client.get(schema_path).json()
    return [
        (method, path, spec)
        for path, methods in schema["paths"].items()
        for method, spec in methods.items()
        if (method, path) not in OPEN_PUBLIC_OPERATIONS
    ]


def test_only_version_and_health_are_open():
    """Exactly the two operations Airflow leaves open have no security in our document, and
    they answer without credentials."""
    client = Client(raise_request_exception=False)
    schema = client.get("/api/v2/openapi.json").json()
    open_ops = {
        (method, path)
        for path, methods in schema["paths"].items()
        for method, spec in methods.items()
        if not spec.get("security")
    }
    assert open_ops == OPEN_PUBLIC_OPERATIONS
    for _, path in OPEN_PUBLIC_OPERATIONS:
        assert client.get(path).status_code == 200


def _token(sub: str, *, key: str | None = None, exp_delta: int = 3600, **headers) -> str:
    now = int(time.time())
    claims = {"sub": sub, "try": 1, "scope": "execution", "iat": now, "exp": now + exp_delta}
    return jwt.encode(claims, key or settings.SECRET_KEY, algorithm="HS256", headers=headers)


def _unsigned(sub: str) -> str:
    now = int(time.time())
    return jwt.encode(
        {"sub": sub, "try": 1, "scope": "execution", "iat": now, "exp": now + 3600},
        None,
        algorithm="none",
    )


@pytest.fixture
def world():
    dag = make_scheduled_dag("auth_dag", {"any": ["auth-a"]})
    mine, other = make_running_tis("auth_producer", 2)
    asset = Asset.objects.get(name="auth-a")
    User = get_user_model()
    staff = User.objects.create_user(
        "staff", password="pw-staff-1", is_staff=True, is_superuser=True
    )
    User.objects.create_user("plain", password="pw-plain-1", is_staff=False)
    User.objects.create_superuser("root", password="pw-root-1")
    inactive = User.objects.create_user("gone", password="pw-gone-1", is_staff=True)
    _, key = public_auth.create_api_token(username=staff.username, name="auth")
    _, inactive_key = public_auth.create_api_token(username=inactive.username, name="gone")
    inactive.is_active = False
    inactive.save()
    return {
        "ti": str(mine.id),
        "other_ti": str(other.id),
        "dag_id": dag.dag_id,
        "asset_id": asset.pk,
        "key": key,
        "inactive_key": inactive_key,
        "staff": staff,
    }


def _url(path: str, world) -> str:
    return (
        path.replace("{task_instance_id}", world["ti"])
        .replace("{dag_id}", world["dag_id"])
        .replace("{asset_id}", str(world["asset_id"]))
        .replace("{asset_alias_id}", "1")
        .replace("{dag_run_id}", "no-such-run")
        .replace("{task_id}", "no-such-task")
        .replace("{map_index}", "0")
        .replace("{backfill_id}", "1")
        .replace("{endpoint_id}", "1")  # issue 29's webhook endpoints (404 past the checks)
        .replace("{xcom_key}", "no-such-key")
        .replace("{version_number}", "1")
        .replace("{event_log_id}", "1")
        .replace("{file_token}", "no-such-token")
        .replace("{section}", "core")
        .replace("{option}", "dags_folder")
    )


# The refusals of a valid task token's scope (assets_app/runtime/scopes.py).
TOKEN_SCOPE_REASONS = {
    "xcom_read_outside_scope",
    "xcom_write_not_own",
    "task_not_running",
    "connection_needs_running_task",
}


# The 403s Airflow answers for a feature its default configuration turns off, which the service
# never offers (`public_service`, `public_settings`): a caller past the auth and permission
# checks gets them.
REFUSED_PAST_THE_CHECKS = {
    "config_not_exposed",
    "connection_test_disabled",
    "default_connections_not_offered",
}


def _past_the_checks(response, what: str) -> None:
    """Neither 401 nor a 403 of the checks (a 403 of the route's own, listed above, is)."""
    assert response.status_code != 401, f"{what}: {response.content!r}"
    if response.status_code == 403:
        reason = json.loads(response.content)["detail"]["reason"]
        assert reason in REFUSED_PAST_THE_CHECKS, f"{what}: {response.content!r}"


def _call(client: Client, method: str, url: str, auth: str | None, **extra):
    headers = {"Authorization": auth} if auth is not None else {}
    kwargs = (
        {"content_type": "application/json", "data": "{}"} if method not in ("get", "head") else {}
    )
    if url.endswith("/wait"):
        url += "?interval=1"
    return getattr(client, method)(url, headers=headers, **kwargs, **extra)


def _refused(response, statuses: set[int], before: dict, what: str) -> None:
    assert response.status_code in statuses, f"{what}: {response.status_code} {response.content!r}"
    if not what.startswith("head "):  # an answer to HEAD has no body
        detail = json.loads(response.content)["detail"]
        assert isinstance(detail["reason"], str), what
    assert app_table_counts() == before, what


def test_every_worker_endpoint_refuses_bad_credentials(world):
    client = Client(raise_request_exception=False)
    ti = world["ti"]
    bad_task_credentials = {
        "missing": (None, {401}),
        "basic scheme": ("Basic dXNlcjpwdw==", {401}),
        "expired": (f"Bearer {_token(ti, exp_delta=-10)}", {401}),
        "forged (other key)": (
            f"Bearer {_token(ti, key='not-the-secret-key-but-32-bytes-or-more-0123456789')}",
            {403},
        ),
        "unsigned alg none": (f"Bearer {_unsigned(ti)}", {403}),
        "garbage": ("Bearer not.a.jwt", {403}),
        "worker API key": (f"Bearer {settings.WORKER_API_KEY}", {403}),
    }
    operations = _operations(client, "/execution/openapi.json")
    assert len(operations) >= 9
    refusals = 0
    for method, path, _ in operations:
        url = _url(path, world)
        before = app_table_counts()
        # The worker-key doors: claiming, shipping a try's log (issue 27), the deploy door and
        # the triggerer's (issue 42: claiming triggers, reporting their events and ends) and
        # the Dag callbacks' (issue 39: claiming a run's callbacks, reporting them).
        if path.endswith(("/workloads/claim", "/dags/sync", "/logs/{try_number}")) or (
            "/triggers/" in path or "/dag-callbacks/" in path
        ):
            cases = {
                "missing": (None, {401}),
                "wrong key": ("Bearer wrong-key", {403}),
                "task token": (f"Bearer {issue_token(ti, try_number=1)}", {403}),
            }
            good = f"Bearer {settings.WORKER_API_KEY}"
            if path.endswith("/dags/sync"):
                # The deploy door: the worker key is refused there too (issue 26).
                cases["worker API key"] = (f"Bearer {settings.WORKER_API_KEY}", {403})
                good = f"Bearer {settings.DAG_SYNC_KEY}"
        else:
            cases = dict(bad_task_credentials)
            if "{task_instance_id}" in path:
                cases["other TI's token"] = (
                    f"Bearer {issue_token(world['other_ti'], try_number=1)}",
                    {403},
                )
            good = f"Bearer {issue_token(ti, try_number=1)}"
        for name, (auth, statuses) in cases.items():
            _refused(_call(client, method, url, auth), statuses, before, f"{method} {path} {name}")
            refusals += 1
        response = _call(client, method, url, good)
        if response.status_code == 403:
            # Past the credential: the token's scope (issue 26, task_scopes) may still refuse an
            # address outside its TI's run, never as a credential error (HEAD: no body, read the
            # reason from the same GET).
            if not response.content:
                response = _call(client, "get", url, good)
            reason = json.loads(response.content)["detail"]["reason"]
            assert reason in TOKEN_SCOPE_REASONS, f"{method} {path}: {response.content!r}"
        else:
            assert response.status_code not in (401, 403), f"{method} {path}: {response.content!r}"
    figure(f"auth: worker API {len(operations)} endpoints, {refusals} refusals checked")


def test_every_public_endpoint_refuses_bad_credentials(world):
    client = Client(raise_request_exception=False)
    operations = _operations(client, "/api/v2/openapi.json")
    assert len(operations) >= 29
    header_cases = {
        "missing": (None, {401}),
        "basic scheme": ("Basic dXNlcjpwdw==", {401}),
        "unknown key": ("Bearer not-a-real-key", {401}),
        "worker task token": (f"Bearer {issue_token(world['ti'], try_number=1)}", {401}),
        "inactive user's key": (f"Bearer {world['inactive_key']}", {401}),
        # Issue 49: login tokens (`POST /auth/token`) expired or signed with another key (an
        # inactive user's: tests/api/test_login.py).
        "expired login token": (
            f"Bearer {logins.issue_token(user=world['staff'], lifetime_seconds=-60)}",
            {401},
        ),
        "login token of another key": (
            "Bearer "
            + jwt.encode(
                jwt.decode(
                    logins.issue_token(user=world["staff"], lifetime_seconds=600),
                    options={"verify_signature": False},
                ),
                "not-the-jwt-secret-" + "0123456789abcdef" * 4,
                algorithm="HS512",
            ),
            {401},
        ),
    }
    login_token = logins.issue_token(user=world["staff"], lifetime_seconds=600)
    refusals = 0
    for method, path, _ in operations:
        url = _url(path, world)
        before = app_table_counts()
        for name, (auth, statuses) in header_cases.items():
            _refused(_call(client, method, url, auth), statuses, before, f"{method} {path} {name}")
            refusals += 1
        plain = Client(raise_request_exception=False)
        assert plain.login(username="plain", password="pw-plain-1")
        _refused(_call(plain, method, url, None), {401, 403}, before, f"{method} {path} non-staff")
        refusals += 1
        if method != "get":
            staff = Client(enforce_csrf_checks=True, raise_request_exception=False)
            assert staff.login(username="staff", password="pw-staff-1")
            _refused(
                _call(staff, method, url, None), {403}, before, f"{method} {path} no CSRF token"
            )
            refusals += 1
        response = _call(client, method, url, f"Bearer {world['key']}")
        _past_the_checks(response, f"{method} {path}")
        response = _call(client, method, url, f"Bearer {login_token}")
        _past_the_checks(response, f"{method} {path} login token")
    figure(f"auth: public API {len(operations)} endpoints, {refusals} refusals checked")


def test_admin_requires_staff_login_and_keeps_csrf(world):
    from django.contrib import admin
    from django.urls import reverse

    urls = ["/admin/"] + [
        reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        for model in admin.site._registry
    ]
    anonymous = Client(raise_request_exception=False)
    plain = Client(raise_request_exception=False)
    assert plain.login(username="plain", password="pw-plain-1")
    root = Client(raise_request_exception=False)
    assert root.login(username="root", password="pw-root-1")
    for url in urls:
        for who, client in (("anonymous", anonymous), ("non-staff", plain)):
            response = client.get(url)
            assert response.status_code == 302, f"{who} {url}: {response.status_code}"
            assert response["Location"].startswith("/admin/login/"), f"{who} {url}"
        assert root.get(url).status_code == 200, url

    csrf = Client(enforce_csrf_checks=True, raise_request_exception=False)
    response = csrf.post("/admin/login/", {"username": "root", "password": "pw-root-1"})
    assert response.status_code == 403
    assert "_auth_user_id" not in csrf.session
    assert csrf.login(username="root", password="pw-root-1")
    user_id = get_user_model().objects.get(username="plain").pk
    response = csrf.post(f"/admin/auth/user/{user_id}/delete/", {"post": "yes"})
    assert response.status_code == 403
    assert get_user_model().objects.filter(pk=user_id).exists()
    figure(f"auth: admin {len(urls)} pages need a staff login; CSRF refused 2 of 2 posts")
