"""Worker API authentication (DESIGN 6.1).

Task tokens: JWT, HS256, signed with SECRET_KEY, `sub` = the TI id, `try` = the try number it
was issued for, `scope` = "execution", expiring after WORKER_TOKEN_LIFETIME_SECONDS (invariant 12:
a token is one try). Answers:
- no `Authorization: Bearer ...` header: 401 (`not_authenticated`);
- an expired token: 401 (`token_expired`; the worker should get a new one by claiming again);
- a token with a bad signature, malformed, or of another scope: 403 (`invalid_token`);
- a valid token for another TI than the one in the path: 403 (`forbidden`);
- a valid token of an earlier try (the TI was retried since): 409 (`stale_try`), and nothing is
  changed. On `/task-instances/{id}/...` the try is checked by `task_state` on the row it reads or
  in its conditional UPDATE (no statement added under the TI lock); on the other routes here,
  with one indexed read of the TI, kept for the scope rules of `task_scopes` (`token_ti`).
A fresh token is returned in the `Refreshed-API-Token` response header of `run` and `heartbeat`
(the Airflow Task SDK client switches to it), so a task that heartbeats never outlives its token.

Work claiming uses the shared WORKER_API_KEY as a bearer token (401 without, 403 if wrong).
Syncing Dag definitions (`POST /execution/dags/sync`) does not: it takes the deploy key
(DAG_SYNC_KEY) or an API token whose user holds `add_dag` and `change_dag` (`DagSyncAuth`; any
other key, the worker key included, is 403 `invalid_sync_credential`).
"""

import hmac
import time
from typing import Any
from uuid import UUID

import jwt
from django.conf import settings
from django.http import HttpRequest
from ninja.security import HttpBearer

from assets_app.guards import exceptions
from assets_app.models import AuditVia
from assets_app.operations import audit
from assets_app.runtime import scopes as task_scopes

from . import public_auth

ALGORITHM = "HS256"
SCOPE = "execution"
PATH_TI_PARAM = "task_instance_id"


TRY_CLAIM = "try"
# Where TaskTokenAuth keeps the token's TI on the claims it returns (not a JWT claim).
TOKEN_TI = "_ti"


def issue_token(ti_id: UUID, *, try_number: int) -> str:
    """A signed token for one try of one TI, valid for WORKER_TOKEN_LIFETIME_SECONDS from now."""
    now = int(time.time())
    claims = {
        "sub": str(ti_id),
        TRY_CLAIM: try_number,
        "scope": SCOPE,
        "iat": now,
        "exp": now + settings.WORKER_TOKEN_LIFETIME_SECONDS,
    }
    return jwt.encode(claims, settings.SECRET_KEY, algorithm=ALGORITHM)


def decode_token(token: str) -> dict[str, Any]:
    try:
        claims = jwt.decode(
            token,
            settings.SECRET_KEY,
            algorithms=[ALGORITHM],
            options={"require": ["sub", "exp", TRY_CLAIM]},
        )
    except jwt.ExpiredSignatureError as exc:
        raise exceptions.NotAuthenticated(
            "the task token has expired", reason="token_expired"
        ) from exc
    except jwt.InvalidTokenError as exc:
        raise exceptions.PermissionDenied(
            f"invalid task token: {exc}", reason="invalid_token"
        ) from exc
    if claims.get("scope") != SCOPE:
        raise exceptions.PermissionDenied("the token is not a task token", reason="invalid_token")
    try_number = claims[TRY_CLAIM]
    if not isinstance(try_number, int) or isinstance(try_number, bool) or try_number < 1:
        raise exceptions.PermissionDenied(
            "the task token names no valid try number", reason="invalid_token"
        )
    return claims


def claims_of(request: HttpRequest) -> dict[str, Any]:
    """The verified token claims of a worker request (ninja sets `request.auth` to what
    `task_token` returned)."""
    return request.auth  # type: ignore[attr-defined]


def task_actor(request: HttpRequest) -> audit.Actor:
    """The running TI of a worker request (its verified token) as the audit trail's actor."""
    claims = claims_of(request)
    return audit.Actor.of_task(claims["sub"], try_number=try_of(claims))


def try_of(claims: dict[str, Any]) -> int:
    """The try number a decoded task token was issued for."""
    return claims[TRY_CLAIM]


class TaskTokenAuth(HttpBearer):
    """A valid task token; on `/task-instances/{task_instance_id}/...` it must be that TI's.

    A path id that is not a UUID is left to validation (422), so every well-formed request for
    another TI is refused before its body is even parsed. On a route without a TI in its path
    the token's try is checked here against the TI's current one (see the module docstring).
    """

    def authenticate(self, request: HttpRequest, token: str) -> dict[str, Any]:
        claims = decode_token(token)
        match = request.resolver_match
        path_id = match.kwargs.get(PATH_TI_PARAM) if match is not None else None
        if path_id is None:
            claims[TOKEN_TI] = _current_ti(claims)
        else:
            try:
                wanted = UUID(str(path_id))
            except ValueError:
                return claims
            if str(wanted) != claims["sub"]:
                raise exceptions.PermissionDenied("this token is for another task instance")
        return claims


def _current_ti(claims: dict[str, Any]) -> task_scopes.TokenTI:
    ti = task_scopes.load(ti_id=claims["sub"])
    if ti is None:
        raise exceptions.PermissionDenied(
            "the task instance of this token does not exist", reason="invalid_token"
        )
    if ti.try_number != try_of(claims):
        raise exceptions.StaleTry.of(
            ti_id=claims["sub"], token_try=try_of(claims), current_try=ti.try_number
        )
    return ti


def token_ti(request: HttpRequest) -> task_scopes.TokenTI:
    """The token's TI as the authentication read it, on a route without a TI in its path (the
    rules of `task_scopes` take it)."""
    return claims_of(request)[TOKEN_TI]


class WorkerApiKeyAuth(HttpBearer):
    """`Authorization: Bearer <WORKER_API_KEY>` for work claiming."""

    def authenticate(self, request: HttpRequest, token: str) -> str:
        if not hmac.compare_digest(token.encode(), settings.WORKER_API_KEY.encode()):
            raise exceptions.PermissionDenied("invalid worker API key", reason="invalid_api_key")
        return token


# What an API token's user needs to sync Dags: the sync creates Dags and rewrites them (and, with
# apply_pause, sets their pause, which PATCH /api/v2/dags/{id} allows with change_dag).
SYNC_PERMISSIONS = ("assets_app.add_dag", "assets_app.change_dag")
DEPLOY_KEY_ACTOR = "deploy key"


class DagSyncAuth(HttpBearer):
    """`Authorization: Bearer <DAG_SYNC_KEY or an ApiToken key>` for `dags/sync`; returns the
    audit actor of the sync."""

    def authenticate(self, request: HttpRequest, token: str) -> audit.Actor:
        deploy_key = settings.DAG_SYNC_KEY
        if deploy_key and hmac.compare_digest(token.encode(), deploy_key.encode()):
            return audit.Actor(name=DEPLOY_KEY_ACTOR, via=AuditVia.API)
        api_token = public_auth.find_token(token)
        if api_token is None:
            raise exceptions.PermissionDenied(
                "syncing Dags needs the deploy key (DAG_SYNC_KEY) or an API token whose user "
                "holds add_dag and change_dag; the worker API key only claims work",
                reason="invalid_sync_credential",
            )
        for permission in SYNC_PERMISSIONS:
            public_auth.authorize(api_token.user, permission)
        return audit.Actor.from_user(api_token.user, via=AuditVia.API)


task_token = TaskTokenAuth()
worker_api_key = WorkerApiKeyAuth()
dag_sync = DagSyncAuth()
