"""Every API error leaves here as `{"detail": {"reason": ..., "message": ..., ...}}`."""

import json
import logging
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from assets_app import exceptions

logger = logging.getLogger(__name__)

STATUS_BY_EXCEPTION: list[tuple[type[exceptions.DomainError], int]] = [
    (exceptions.NotAuthenticated, 401),
    (exceptions.PermissionDenied, 403),
    (exceptions.NotFound, 404),
    (exceptions.InvalidState, 409),
    (exceptions.Conflict, 409),
    (exceptions.InvalidInput, 422),
]


def error_response(status: int, reason: str, message: str, **extra: Any) -> JsonResponse:
    return JsonResponse({"detail": {"reason": reason, "message": message, **extra}}, status=status)


def _domain_error(request: HttpRequest, exc: exceptions.DomainError) -> HttpResponse:
    status = next((code for cls, code in STATUS_BY_EXCEPTION if isinstance(exc, cls)), 400)
    return error_response(status, exc.reason, exc.message, **exc.extra)


def _validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    errors = [
        {k: v for k, v in error.items() if k in ("type", "loc", "msg")} for error in exc.errors
    ]
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


def _bad_json(request: HttpRequest, exc: Exception) -> HttpResponse:
    return error_response(400, "invalid_json", f"request body is not valid JSON: {exc}")


def install(api: NinjaAPI) -> None:
    """Register the handlers on a NinjaAPI instance."""
    api.add_exception_handler(exceptions.DomainError, _domain_error)
    api.add_exception_handler(ValidationError, _validation_error)
    api.add_exception_handler(HttpError, _http_error)
    api.add_exception_handler(Http404, _not_found)
    api.add_exception_handler(json.JSONDecodeError, _bad_json)
