"""Authentication for the public API (`/api/v2/`): an API token or a staff session, never anonymous.

- `Authorization: Bearer <key>`: the key of an `ApiToken` (only its sha256 is stored), or a login
  token (a JWT from `POST /auth/token`, `operations.logins`: signed with JWT_SECRET, expiring; an
  expired one is 401 `token_expired`). When the header is present it decides alone: a bad key is
  401 even if a session cookie is also sent.
- Otherwise a Django session of an active staff user. Unsafe methods (POST, PUT, PATCH, DELETE)
  must pass Django's CSRF check, exactly as a form post would: ninja marks its views csrf_exempt and
  leaves the check to the auth class, so it is done here, after the session is known to be staff
  (an anonymous request gets 401, not a CSRF 403).

Once the user is known, the route's model permission (`public_permissions.needs`) is checked for
sessions and tokens alike: `user.has_perm(...)`, so a token carries exactly its user's permissions
and a superuser holds all. A missing one is 403 `permission_denied`.

Failures raise `AuthenticationError` (401) or `exceptions.PermissionDenied` (403); `api/errors.py`
turns both into the usual `{"detail": {"reason", "message"}}` body. `request.auth` is the user;
`request.api_token` the token it came with (None for a session): the caller that scopes
Idempotency-Keys (`caller_scope`).
"""

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AbstractUser
from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone
from ninja.errors import AuthenticationError
from ninja.security import APIKeyCookie, HttpBearer
from ninja.utils import check_csrf

from assets_app.guards import exceptions
from assets_app.models import ApiToken
from assets_app.operations import audit, logins

# last_used_at is a hint for operators, not an audit log: write it at most once a minute per token
# so a busy client does not turn every read into a row update.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def user_of(request: HttpRequest) -> AbstractUser:
    """The authenticated user of a public API request (ninja sets `request.auth` to what the
    authenticator returned: the user, for a token and a session alike)."""
    return request.auth  # type: ignore[attr-defined]


def authorize(user: AbstractUser, permission: str | None) -> None:
    """Refuse a user without `permission` (a Django permission name such as
    `assets_app.add_assetevent`); None means the route needs none beyond authentication."""
    if permission is not None and not user.has_perm(permission):
        raise exceptions.PermissionDenied(
            f"{user.get_username()!r} does not have the permission {permission!r} this request "
            "needs",
            reason="permission_denied",
            permission=permission,
        )


def caller_scope(request: HttpRequest) -> str:
    """Who is calling, for scoping Idempotency-Keys: `token:<id>` for an API token, else
    `user:<id>` for a session."""
    api_token = getattr(request, "api_token", None)
    if api_token is not None:
        return f"token:{api_token.pk}"
    return f"user:{user_of(request).pk}"


def find_token(key: str) -> ApiToken | None:
    """The ApiToken of `key` when its user is active (one indexed lookup; last_used_at at most
    once a minute), else None."""
    key = key.strip()
    api_token = (
        ApiToken.objects.select_related("user").filter(key_hash=ApiToken.hash_key(key)).first()
        if key
        else None
    )
    if api_token is None or not api_token.user.is_active:
        return None
    now = timezone.now()
    if api_token.last_used_at is None or now - api_token.last_used_at >= LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=api_token.pk).update(last_used_at=now)
    return api_token


class ApiTokenAuth(HttpBearer):
    """`Authorization: Bearer <ApiToken key or login JWT>`: one indexed lookup (a key: at most
    one update a minute); then the route's permission for the token's user."""

    def __init__(self, permission: str | None = None) -> None:
        self.permission = permission
        super().__init__()

    def authenticate(self, request: HttpRequest, token: str) -> AbstractBaseUser:
        if logins.looks_like_jwt(token):
            try:
                user = logins.user_of_token(token)
            except logins.InvalidLoginToken as exc:
                raise exceptions.NotAuthenticated(str(exc), reason=exc.reason) from exc
            authorize(user, self.permission)  # type: ignore[arg-type]
            request.api_token = None  # type: ignore[attr-defined]
            return user
        api_token = find_token(token)
        if api_token is None:
            raise AuthenticationError()
        authorize(api_token.user, self.permission)
        request.api_token = api_token  # type: ignore[attr-defined]
        return api_token.user

    def __call__(self, request: HttpRequest) -> Any:
        header = request.headers.get(self.header)
        if header is None:
            return None
        scheme, _, token = header.partition(" ")
        if scheme.lower() != self.openapi_scheme:
            # An Authorization header we do not understand must not fall through to the session.
            raise AuthenticationError()
        return self.authenticate(request, token)


class StaffSessionAuth(APIKeyCookie):
    """A logged-in, active staff user's Django session; CSRF enforced for unsafe methods; then
    the route's permission."""

    def __init__(self, permission: str | None = None) -> None:
        self.permission = permission
        self.param_name = settings.SESSION_COOKIE_NAME  # only names the scheme in the OpenAPI doc
        super().__init__(csrf=True)

    def _get_key(self, request: HttpRequest) -> str | None:
        # The base class checks CSRF before it knows whether there is a session at all; we check
        # it in authenticate() so anonymous requests get 401.
        return request.COOKIES.get(settings.SESSION_COOKIE_NAME)

    def authenticate(self, request: HttpRequest, key: str | None) -> AbstractBaseUser | None:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None
        if not (user.is_active and user.is_staff):
            raise exceptions.PermissionDenied(
                "the public API needs a staff user or an API token", reason="staff_required"
            )
        if (
            self.csrf
            and not getattr(request, "_ninja_csrf_exempt", False)
            and check_csrf(request) is not None
        ):
            raise exceptions.PermissionDenied(
                "CSRF check failed: send the csrftoken cookie's value in the X-CSRFToken header",
                reason="csrf_failed",
            )
        authorize(user, self.permission)
        request.api_token = None  # type: ignore[attr-defined]
        return user


def public_api_auth(permission: str | None = None) -> list[Any]:
    """The auth list of a public endpoint: a token first, then a staff session, each checking
    `permission` once the user is known."""
    return [ApiTokenAuth(permission), StaffSessionAuth(permission)]


def create_api_token(
    *, username: str, name: str, actor: audit.Actor | None = None
) -> tuple[ApiToken, str]:
    """Create a token acting as `username`; returns it and its key (the only time the key exists
    in clear: only its hash is stored). Raises the user model's DoesNotExist. One insert and
    its audit entry (`api_token.create`, never the key), in one transaction."""
    user = get_user_model().objects.get_by_natural_key(username)
    key = ApiToken.generate_key()
    with transaction.atomic():
        token = ApiToken.objects.create(user=user, name=name, key_hash=ApiToken.hash_key(key))
        audit.record(
            actor=actor,
            action="api_token.create",
            summary=f"created API token {token.pk} ({name}) acting as {username}",
            targets=[audit.Target(kind="api_token", object_id=token.pk)],
        )
    return token, key
