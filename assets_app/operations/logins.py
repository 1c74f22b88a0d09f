"""Login with a password, as Airflow 3.3.2's auth manager does it (issue 49): a user's username and
password give a signed, expiring JWT that the public API accepts as that user.

The token is Airflow's `JWTGenerator` token: claims `jti`, `aud` (JWT_AUDIENCE, Airflow's
`[api_auth] jwt_audience`, default "apache-airflow"), `nbf`, `iat`, `exp` (now +
JWT_EXPIRATION_TIME, or JWT_CLI_EXPIRATION_TIME for `/auth/token/cli`) and `sub`, the user's
primary key (the FAB manager's `sub`; a renamed user keeps their tokens, a deleted and re-created
one does not), signed HS512 (Airflow's algorithm for a shared secret) with JWT_SECRET, a key of
its own: a worker token (SECRET_KEY) is never a login token nor the reverse. Checking one
requires every claim above and the audience, and allows JWT_LEEWAY_SECONDS of clock skew
(`[api_auth] jwt_leeway`).

Failed attempts are audited (`auth.login_failed`, with the username tried and the client address,
never the password) and throttled from those same entries: once LOGIN_FAILURE_LIMIT failures for
one username, or from one client address, are younger than LOGIN_FAILURE_WINDOW_SECONDS, every
attempt is refused (`LoginThrottled`, audited as `auth.login_throttled`) without checking the
password, correct or not, until the oldest leaves the window. The count reads the audit trail
through its (action, at) index, so it grows with the recent failures, never with history; and it
lives in PostgreSQL, so every gunicorn worker and host counts the same failures.

Logout (`log_out`, `GET /api/v2/auth/logout`) revokes a token as Airflow's `revoke_token` does:
its `jti` is kept (`RevokedToken`) until its `exp`, and `user_of_token` refuses it in the same
read as its user (`token_revoked`).
"""

import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import jwt
from django.conf import settings
from django.contrib.auth import authenticate, get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Count, Exists, Q
from django.http import HttpRequest
from django.utils import timezone

from ..models import AuditEntry, AuditVia, RevokedToken
from . import audit

ALGORITHM = "HS512"
REQUIRED_CLAIMS = ("jti", "sub", "aud", "exp", "iat", "nbf")
FAILED = "auth.login_failed"
THROTTLED = "auth.login_throttled"
SUCCEEDED = "auth.login"
LOGGED_OUT = "auth.logout"


class InvalidCredentials(Exception):
    """The username and password match no active user (Airflow: 401 "Invalid credentials")."""


@dataclass(frozen=True)
class LoginThrottled(Exception):
    """Too many recent failures for this username or client address."""

    retry_after_seconds: int


class InvalidLoginToken(Exception):
    """A bearer JWT that is malformed, badly signed, of another audience, expired, or of a user
    who no longer exists or is inactive. `reason`: `token_expired` or `invalid_token`."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def issue_token(*, user: AbstractBaseUser, lifetime_seconds: int) -> str:
    """A signed login token for `user`, valid for `lifetime_seconds` from now. Writes nothing."""
    now = int(time.time())
    claims = {
        "jti": uuid.uuid4().hex,
        "aud": settings.JWT_AUDIENCE,
        "nbf": now,
        "exp": now + lifetime_seconds,
        "iat": now,
        "sub": str(user.pk),
    }
    return jwt.encode(claims, settings.JWT_SECRET, algorithm=ALGORITHM)


def looks_like_jwt(token: str) -> bool:
    """Three dot-separated parts: an API token key (url-safe base64, no dots) never is one."""
    return token.count(".") == 2


def user_of_token(token: str) -> AbstractBaseUser:
    """The active user a login token was issued to (one indexed read), or InvalidLoginToken."""
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            settings.JWT_SECRET,
            algorithms=[ALGORITHM],
            audience=settings.JWT_AUDIENCE,
            leeway=settings.JWT_LEEWAY_SECONDS,
            options={"require": list(REQUIRED_CLAIMS)},
        )
    except jwt.ExpiredSignatureError as exc:
        raise InvalidLoginToken("the login token has expired", reason="token_expired") from exc
    except jwt.InvalidTokenError as exc:
        raise InvalidLoginToken(f"invalid login token: {exc}", reason="invalid_token") from exc
    pk = _int_or_none(claims["sub"])
    user = None
    if pk is not None:
        # One read: the user, and whether the token was revoked (`log_out`).
        revoked = Exists(RevokedToken.objects.filter(jti=str(claims["jti"])))
        users = get_user_model().objects.filter(pk=pk, is_active=True)
        user = users.annotate(revoked=revoked).first()
    if user is None:
        raise InvalidLoginToken(
            "the user of this login token does not exist or is inactive", reason="invalid_token"
        )
    if getattr(user, "revoked", False):
        raise InvalidLoginToken("the login token has been revoked", reason="token_revoked")
    return user


def log_out(*, tokens: list[str], client: str) -> int:
    """Revoke the login tokens among `tokens` (Airflow 3.3.2's `revoke_token`: each valid JWT's
    `jti` is kept until its `exp`, and the public API refuses it from then on). What is not a
    valid login token of an active user (an API token key, an expired or forged JWT) is left
    alone, as Airflow leaves it. Idempotent: a token revoked twice stays revoked, audited once
    per call that revoked something (`auth.logout`). Revocations past their expiry are removed
    on the way (Airflow's `_maybe_cleanup_expired`). Returns how many tokens were revoked."""
    revoked = 0
    for token in tokens:
        if not looks_like_jwt(token):
            continue
        try:
            user = user_of_token(token)
        except InvalidLoginToken:
            continue
        claims = jwt.decode(token, options={"verify_signature": False})
        exp = datetime.fromtimestamp(int(claims["exp"]), tz=UTC)
        with transaction.atomic(durable=True):
            RevokedToken.objects.filter(exp__lt=timezone.now()).delete()
            _, made = RevokedToken.objects.get_or_create(
                jti=str(claims["jti"]), defaults={"exp": exp}
            )
            if made:
                audit.record(
                    actor=audit.Actor.from_user(user, via=AuditVia.API),
                    action=LOGGED_OUT,
                    summary=f"{user.get_username()} logged out from {client}",
                    detail={"client": client, "jti": str(claims["jti"])},
                )
                revoked += 1
    return revoked


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def log_in(
    *, request: HttpRequest, username: str, password: str, client: str, lifetime_seconds: int
) -> str:
    """A login token for the active user `username` whose password is `password`.

    Refused with LoginThrottled while too many recent failures name this username or client
    (the password is not checked then), InvalidCredentials otherwise when they do not match. Each
    refusal and each success is one audit entry, committed on its own (durable): a failure is
    counted even though the request fails."""
    retry_after = _throttled_for(username=username, client=client)
    detail = {"username": username[:150], "client": client}
    if retry_after is not None:
        with transaction.atomic(durable=True):
            audit.record(
                actor=_anonymous(username),
                action=THROTTLED,
                summary=f"login as {username!r} from {client} refused: too many failed attempts",
                detail=detail,
            )
        raise LoginThrottled(retry_after_seconds=retry_after)
    user = authenticate(request, username=username, password=password)
    if user is None:
        with transaction.atomic(durable=True):
            audit.record(
                actor=_anonymous(username),
                action=FAILED,
                summary=f"failed login as {username!r} from {client}",
                detail=detail,
            )
        raise InvalidCredentials()
    with transaction.atomic(durable=True):
        audit.record(
            actor=audit.Actor.from_user(user, via=AuditVia.API),
            action=SUCCEEDED,
            summary=f"{username} logged in from {client} (token valid {lifetime_seconds} s)",
            detail=detail,
        )
    return issue_token(user=user, lifetime_seconds=lifetime_seconds)


def _anonymous(username: str) -> audit.Actor:
    return audit.Actor(name=f"login attempt as {username}", via=AuditVia.API)


def _throttled_for(*, username: str, client: str) -> int | None:
    """Seconds until an attempt may be made again, or None when it may be made now: one
    aggregate over the failures still in the window (audit index on (action, at))."""
    window = timedelta(seconds=settings.LOGIN_FAILURE_WINDOW_SECONDS)
    since = timezone.now() - window
    recent = AuditEntry.objects.filter(action=FAILED, at__gte=since)
    counts = recent.aggregate(
        by_username=Count("id", filter=Q(detail__username=username[:150])),
        by_client=Count("id", filter=Q(detail__client=client)),
    )
    limit = settings.LOGIN_FAILURE_LIMIT
    matching = Q()
    if counts["by_username"] >= limit:
        matching |= Q(detail__username=username[:150])
    if counts["by_client"] >= limit:
        matching |= Q(detail__client=client)
    if not matching:
        return None
    # The attempt may be made once enough of the matching failures have left the window: the
    # limit-th newest of them is the one that must age out.
    newest = recent.filter(matching).order_by("-at").values_list("at", flat=True)[limit - 1 : limit]
    oldest_counted = next(iter(newest), since)
    return max(1, int((oldest_counted + window - timezone.now()).total_seconds()) + 1)
