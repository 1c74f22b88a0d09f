"""Every API error leaves here, in one of two shapes.

- `{"detail": {"reason": ..., "message": ..., ...}}`: every error of the worker API, and every
  error of the public API except 422. For the public API this is Airflow's `HTTPExceptionResponse`
  (whose `detail` may be an object), so Airflow's REST client parses it, and scripts keep reading
  `detail.reason`.
- `{"detail": [{"type": ..., "loc": [...], "msg": ...}, ...]}`: a 422 of the public API, Airflow's
  `HTTPValidationError` (what FastAPI answers), which the client parses into `ValidationError`s.
  For a domain error (`InvalidInput`) `type` and `ctx.reason` are its reason and `loc` is the
  `loc` it names; a schema error has pydantic's `type` and no `ctx.reason`.

Unknown paths and methods under an API prefix answer JSON 404 / 405 (`json_fallback`, called by
the request guard middleware), never Django's HTML pages.

A database that is full or away (no pooled connection within DATABASE_POOL_TIMEOUT_SECONDS, "too
many clients", refused, shutting down, the connection lost) is a 503 with `Retry-After`
(DATABASE_RETRY_AFTER_SECONDS) and `detail.reason` `database_busy` / `database_unavailable`, never
a 500: `database_unavailable_reason` tells them from other database errors (a lock timeout, a
constraint, a bug stay what they were). The APIs map it here; every other view (admin, /healthz)
through `DatabaseUnavailableMiddleware` and the 500 handler (`assets_app/views.py`).
"""

import json
import logging
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import Error as DjangoDatabaseError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from assets_app.guards import exceptions
from assets_app.sql.errors import database_unavailable_reason

logger = logging.getLogger(__name__)

STATUS_BY_EXCEPTION: list[tuple[type[exceptions.DomainError], int]] = [
    (exceptions.NotAuthenticated, 401),
    (exceptions.PermissionDenied, 403),
    (exceptions.NotFound, 404),
    (exceptions.InvalidState, 409),
    (exceptions.Conflict, 409),
    (exceptions.InvalidInput, 422),
    (exceptions.BadRequest, 400),
    (exceptions.TooLarge, 413),
    (exceptions.Unavailable, 503),
]

PUBLIC_PREFIX = "/api/v2/"
# Paths whose unknown routes and methods answer JSON instead of Django's HTML pages.
JSON_FALLBACK_PREFIXES = (PUBLIC_PREFIX, "/execution/", "/auth/")


def error_response(status: int, reason: str, message: str, **extra: Any) -> JsonResponse:
    return JsonResponse({"detail": {"reason": reason, "message": message, **extra}}, status=status)


def validation_response(items: list[dict[str, Any]]) -> JsonResponse:
    """Airflow's HTTPValidationError: 422 with a list of {type, loc, msg}."""
    return JsonResponse({"detail": items}, status=422)


def error_response_for(path: str, status: int, reason: str, message: str, **extra: Any):
    """`error_response`, or for a 422 of the public API the HTTPValidationError shape."""
    if status == 422 and path.startswith(PUBLIC_PREFIX):
        loc = list(extra.pop("loc", ()))
        item = {"type": reason, "loc": loc, "msg": message, "ctx": {"reason": reason, **extra}}
        return validation_response([item])
    return error_response(status, reason, message, **extra)


def status_of(exc: exceptions.DomainError) -> int:
    return next((code for cls, code in STATUS_BY_EXCEPTION if isinstance(exc, cls)), 400)


def _domain_error(request: HttpRequest, exc: exceptions.DomainError) -> HttpResponse:
    response = error_response_for(
        request.path, status_of(exc), exc.reason, exc.message, **exc.extra
    )
    if "retry_after_seconds" in exc.extra:  # e.g. `too_many_waits`: when to come back
        response["Retry-After"] = str(exc.extra["retry_after_seconds"])
    return response


def _items(exc: ValidationError) -> list[dict[str, Any]]:
    return [{k: v for k, v in error.items() if k in ("type", "loc", "msg")} for error in exc.errors]


def _validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    errors = _items(exc)
    if request.path.startswith(PUBLIC_PREFIX):
        return validation_response(errors)
    first = errors[0] if errors else {}
    where = ".".join(str(part) for part in first.get("loc", ()))
    message = f"{where}: {first.get('msg', 'invalid')}" if where else "invalid request"
    return error_response(422, "validation_error", message, errors=errors)


def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    if isinstance(exc, AuthenticationError):
        return error_response(401, "not_authenticated", "missing or invalid credentials")
    if exc.status_code == 400 and isinstance(exc.__cause__, exceptions.DomainError):
        # ninja wraps any body parser failure in HttpError(400) from the original; the parser
        # (`parser.py`) raises DomainErrors for JSON that PostgreSQL cannot store.
        return _domain_error(request, exc.__cause__)
    if exc.status_code == 400 and exc.__cause__ is not None:
        # ninja wraps any body parser failure (json.loads) in HttpError(400) from the original.
        return _bad_json(request, exc.__cause__)
    return error_response(exc.status_code, "http_error", str(exc))


def _not_found(request: HttpRequest, exc: Exception) -> HttpResponse:
    return error_response(404, "not_found", str(exc) or "not found")


def _bad_json(request: HttpRequest, exc: BaseException) -> HttpResponse:
    return error_response(400, "invalid_json", f"request body is not valid JSON: {exc}")


def unavailable_response(request: HttpRequest, reason: str) -> HttpResponse:
    """503 + Retry-After: JSON under the API prefixes, a plain page elsewhere (the admin)."""
    retry_after = settings.DATABASE_RETRY_AFTER_SECONDS
    message = f"the database cannot take the request now ({reason}); retry in {retry_after} s"
    if request.path.startswith(("/execution/", "/api/", "/healthz", "/metrics")):
        response: HttpResponse = error_response(
            503, reason, message, retry_after_seconds=retry_after
        )
    else:
        response = HttpResponse(
            f"<!doctype html><title>Service unavailable</title><h1>Service unavailable</h1>"
            f"<p>{message}.</p>",
            status=503,
            content_type="text/html; charset=utf-8",
        )
    response["Retry-After"] = str(retry_after)
    return response


def _database_error(request: HttpRequest, exc: Exception) -> HttpResponse:
    reason = database_unavailable_reason(exc)
    if reason is None:
        raise exc
    logger.warning("%s %s: %s (%s)", request.method, request.path, reason, exc)
    return unavailable_response(request, reason)


def install(api: NinjaAPI) -> None:
    """Register the handlers on a NinjaAPI instance."""
    handlers: list[tuple[type[Exception], Callable[..., HttpResponse]]] = [
        (DjangoDatabaseError, _database_error),
        (exceptions.DomainError, _domain_error),
        (ValidationError, _validation_error),
        (HttpError, _http_error),
        (Http404, _not_found),
        (json.JSONDecodeError, _bad_json),
    ]
    for exc_class, handler in handlers:
        api.add_exception_handler(exc_class, handler)


def json_fallback(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    """Under JSON_FALLBACK_PREFIXES, turn Django's HTML 404 (no route) and ninja's plain-text
    405 (no such method on a route) into the JSON error shape; any other response unchanged."""
    if response.status_code not in (404, 405) or not request.path.startswith(
        JSON_FALLBACK_PREFIXES
    ):
        return response
    if response.get("Content-Type", "").startswith("application/json"):
        return response
    if response.status_code == 404:
        return error_response(
            404, "not_found", f"no route {request.method} {request.path} in this API"
        )
    allowed = sorted(m.strip() for m in response.get("Allow", "").split(",") if m.strip())
    answer = error_response(
        405,
        "method_not_allowed",
        f"{request.method} is not allowed on {request.path}; allowed: {', '.join(allowed)}",
        allowed=allowed,
    )
    answer["Allow"] = ", ".join(allowed)
    return answer
