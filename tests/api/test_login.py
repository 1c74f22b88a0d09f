"""Issue 49, login: `POST /auth/token` and `/auth/token/cli` as Airflow 3.3.2's auth manager
answers them, the JWT they give accepted by the public API as its user, expiry, and failed
attempts audited and throttled (`operations.logins`, `api/login.py`)."""

import json
import time
from datetime import timedelta
from urllib.parse import urlencode

import jwt
import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from assets_app.api.auth import issue_token as issue_task_token
from assets_app.models import AuditEntry, RevokedToken
from assets_app.operations import logins

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery staple"


@pytest.fixture
def ops():
    return get_user_model().objects.create_user("ops", password=PASSWORD, is_superuser=True)


def post(path: str, body, *, client: str = "10.0.0.1", **kwargs):
    return Client().post(
        path, json.dumps(body), content_type="application/json", REMOTE_ADDR=client, **kwargs
    )


def bearer(token: str) -> Client:
    return Client(headers={"Authorization": f"Bearer {token}"})


def claims(token: str) -> dict:
    return jwt.decode(
        token, settings.JWT_SECRET, algorithms=["HS512"], audience=settings.JWT_AUDIENCE
    )


def test_a_good_login_gives_a_token_the_public_api_accepts_as_its_user(ops):
    response = post("/auth/token/cli", {"username": "ops", "password": PASSWORD})
    assert response.status_code == 201
    assert list(response.json()) == ["access_token"]
    token = response.json()["access_token"]
    got = claims(token)
    assert got["sub"] == str(ops.pk)
    assert got["aud"] == "apache-airflow"
    assert got["exp"] - got["iat"] == settings.JWT_CLI_EXPIRATION_TIME == 3600
    assert {"jti", "nbf"} <= set(got)
    assert bearer(token).get("/api/v2/dags").status_code == 200

    # /auth/token: Airflow's longer lifetime, JSON or a form body.
    long = post("/auth/token", {"username": "ops", "password": PASSWORD}).json()["access_token"]
    assert claims(long)["exp"] - claims(long)["iat"] == settings.JWT_EXPIRATION_TIME == 86400
    form = Client().post(
        "/auth/token",
        urlencode({"username": "ops", "password": PASSWORD}),
        content_type="application/x-www-form-urlencoded",
    )
    assert form.status_code == 201 and claims(form.json()["access_token"])["sub"] == str(ops.pk)

    entry = AuditEntry.objects.filter(action=logins.SUCCEEDED).order_by("id").first()
    assert entry is not None and entry.actor_id == ops.pk and entry.detail["client"] == "10.0.0.1"


def test_a_wrong_password_is_airflows_401_and_is_audited_without_the_password(ops):
    for username, password in (("ops", "wrong"), ("nobody", PASSWORD)):
        response = post("/auth/token/cli", {"username": username, "password": password})
        assert (response.status_code, response.json()) == (401, {"detail": "Invalid credentials"})
    ops.is_active = False
    ops.save()
    response = post("/auth/token", {"username": "ops", "password": PASSWORD})
    assert (response.status_code, response.json()) == (401, {"detail": "Invalid credentials"})
    failed = list(AuditEntry.objects.filter(action=logins.FAILED).order_by("id"))
    assert [e.detail["username"] for e in failed] == ["ops", "nobody", "ops"]
    assert all(PASSWORD not in e.summary + json.dumps(e.detail) for e in failed)


def test_bodies_airflow_refuses_are_refused_as_airflow_does(ops):
    empty = post("/auth/token/cli", {"username": "ops", "password": ""})
    assert (empty.status_code, empty.json()) == (
        400,
        {"detail": "Username and password must be provided"},
    )
    missing = post("/auth/token/cli", {"username": "ops"})
    assert missing.status_code == 422
    assert [(e["type"], e["loc"]) for e in missing.json()["detail"]] == [
        ("missing", ["body", "password"])
    ]
    extra = post("/auth/token", {"username": "ops", "password": PASSWORD, "role": "ADMIN"})
    assert extra.status_code == 422
    text = Client().post("/auth/token", "x", content_type="text/plain")
    assert text.status_code == 415
    assert Client().get("/auth/token").status_code == 403  # Airflow's all-admins door, closed
    assert Client().get("/auth/token/cli").status_code == 405
    assert not AuditEntry.objects.exists()  # no attempt was made


def test_an_expired_or_forged_token_is_401(ops):
    expired = logins.issue_token(user=ops, lifetime_seconds=-(settings.JWT_LEEWAY_SECONDS + 5))
    response = bearer(expired).get("/api/v2/dags")
    assert response.status_code == 401
    assert response.json()["detail"]["reason"] == "token_expired"

    now = int(time.time())
    good_claims = {"jti": "j", "sub": str(ops.pk), "aud": "apache-airflow", "nbf": now}
    good_claims |= {"iat": now, "exp": now + 60}
    forged = {
        "other key": jwt.encode(good_claims, "x" * 64, algorithm="HS512"),
        "other audience": jwt.encode(
            {**good_claims, "aud": "elsewhere"}, settings.JWT_SECRET, algorithm="HS512"
        ),
        "worker task token": issue_task_token("00000000-0000-0000-0000-000000000001", try_number=1),
        "signed with SECRET_KEY": jwt.encode(good_claims, settings.SECRET_KEY, algorithm="HS512"),
        "unsigned": jwt.encode(good_claims, None, algorithm="none"),
    }
    for name, token in forged.items():
        response = bearer(token).get("/api/v2/dags")
        assert response.status_code == 401, name
        assert response.json()["detail"]["reason"] == "invalid_token", name
    assert (
        bearer(jwt.encode(good_claims, settings.JWT_SECRET, algorithm="HS512"))
        .get("/api/v2/dags")
        .status_code
        == 200
    )  # the same claims, rightly signed: the refusals are the signature's

    ops.is_active = False
    ops.save()
    good = logins.issue_token(user=ops, lifetime_seconds=60)
    assert bearer(good).get("/api/v2/dags").status_code == 401


def test_a_token_carries_exactly_its_users_permissions():
    viewer = get_user_model().objects.create_user("viewer", password=PASSWORD)
    viewer.user_permissions.set([Permission.objects.get(codename="view_dag")])
    token = post("/auth/token", {"username": "viewer", "password": PASSWORD}).json()
    client = bearer(token["access_token"])
    assert client.get("/api/v2/dags").status_code == 200
    refused = client.get("/api/v2/variables")
    assert refused.status_code == 403
    assert refused.json()["detail"]["reason"] == "permission_denied"
    assert refused.json()["detail"]["permission"] == "assets_app.view_variable"


def test_failed_attempts_are_throttled_per_username_and_per_client(ops, settings):
    settings.LOGIN_FAILURE_LIMIT = 3
    for _ in range(3):
        assert post("/auth/token", {"username": "ops", "password": "x"}).status_code == 401
    # The right password, even from another address, is refused while the failures are recent.
    throttled = post("/auth/token", {"username": "ops", "password": PASSWORD}, client="10.9.9.9")
    assert throttled.status_code == 429
    retry_after = int(throttled["Retry-After"])
    assert 1 <= retry_after <= settings.LOGIN_FAILURE_WINDOW_SECONDS + 1
    assert "Too many failed login attempts" in throttled.json()["detail"]
    assert AuditEntry.objects.filter(action=logins.THROTTLED).count() == 1
    assert AuditEntry.objects.filter(action=logins.FAILED).count() == 3  # not checked: no 4th

    # One client guessing across usernames is throttled too.
    get_user_model().objects.create_user("other", password=PASSWORD)
    for name in ("a", "b", "c"):
        post("/auth/token", {"username": name, "password": "x"}, client="10.0.0.2")
    by_client = post("/auth/token", {"username": "other", "password": PASSWORD}, client="10.0.0.2")
    assert by_client.status_code == 429
    # 10.0.0.1 made the three failures for "ops": as a client it is throttled for any user.
    assert post("/auth/token", {"username": "other", "password": PASSWORD}).status_code == 429
    fresh = post("/auth/token", {"username": "other", "password": PASSWORD}, client="10.0.0.3")
    assert fresh.status_code == 201

    # Once the failures leave the window, the right password works again.
    AuditEntry.objects.filter(action=logins.FAILED).update(
        at=AuditEntry.objects.first().at - timedelta(seconds=settings.LOGIN_FAILURE_WINDOW_SECONDS)
    )
    assert post("/auth/token", {"username": "ops", "password": PASSWORD}).status_code == 201


def test_logout_revokes_the_login_token_and_redirects_to_the_login_page(ops):
    """`GET /api/v2/auth/logout` as Airflow 3.3.2's: the bearer token (and a `_token` cookie)
    revoked until its expiry, refused from then on; 307 to the login page; idempotent, audited
    once; a request without a valid login token is only redirected."""
    token = post("/auth/token/cli", {"username": "ops", "password": PASSWORD}).json()
    token = token["access_token"]
    other = post("/auth/token", {"username": "ops", "password": PASSWORD}).json()["access_token"]
    out = bearer(token).get("/api/v2/auth/logout")
    assert out.status_code == 307, out.content
    assert out["Location"] == "/admin/login/"
    refused = bearer(token).get("/api/v2/dags")
    assert refused.status_code == 401
    assert refused.json()["detail"]["reason"] == "token_revoked"
    assert bearer(other).get("/api/v2/dags").status_code == 200  # only that token ended
    assert bearer(token).get("/api/v2/auth/logout").status_code == 307
    assert AuditEntry.objects.filter(action="auth.logout").count() == 1

    cookie_client = Client()
    cookie_client.cookies["_token"] = other
    assert cookie_client.get("/api/v2/auth/logout").status_code == 307
    assert bearer(other).get("/api/v2/dags").status_code == 401

    before = AuditEntry.objects.count()
    for client in (
        Client(),
        bearer("not-a-jwt"),
        bearer(logins.issue_token(user=ops, lifetime_seconds=-60)),
    ):
        assert client.get("/api/v2/auth/logout").status_code == 307
    assert AuditEntry.objects.count() == before


def test_a_revocation_is_removed_once_its_token_has_expired(ops):
    logins.log_out(tokens=[logins.issue_token(user=ops, lifetime_seconds=600)], client="c")
    RevokedToken.objects.update(exp=RevokedToken.objects.get().exp - timedelta(hours=1))
    logins.log_out(tokens=[logins.issue_token(user=ops, lifetime_seconds=600)], client="c")
    assert RevokedToken.objects.count() == 1


def test_the_login_route_redirects_to_the_login_page_with_a_safe_next_only():
    ok = Client().get("/api/v2/auth/login", {"next": "/api/v2/dags"})
    assert ok.status_code == 307
    assert ok["Location"] == "/admin/login/?" + urlencode({"next": "/api/v2/dags"})
    unsafe = Client().get("/api/v2/auth/login", {"next": "https://elsewhere.example/"})
    assert unsafe.status_code == 400
    assert unsafe.json() == {"detail": "Invalid or unsafe next URL"}
