"""Request guards for the JSON APIs (`/execution/`, `/api/`), before any view runs.

- A body over DATA_UPLOAD_MAX_MEMORY_SIZE (`MAX_REQUEST_BODY_BYTES`, default 10 MB) is answered
  413 with the usual `{"detail": {"reason": "request_too_large", ...}}` body. Django refuses to
  read such a body (`RequestDataTooBig`, from the Content-Length alone); left alone that would
  become a bare 400 page.
- On `/execution/`, a request with a body whose Content-Type is not JSON is answered 415
  (`unsupported_media_type`); the Airflow Task SDK always sends `application/json`.
Both answers leave the database untouched: no view runs.
"""

from django.conf import settings
from django.core.exceptions import RequestDataTooBig

from .errors import error_response

API_PREFIXES = ("/execution/", "/api/")
JSON_ONLY_PREFIX = "/execution/"


def _is_json(content_type: str) -> bool:
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type == "application/json" or media_type.endswith("+json")


class ApiRequestGuardMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if not request.path.startswith(API_PREFIXES):
            return self.get_response(request)
        try:
            body = request.body
        except RequestDataTooBig:
            limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
            return error_response(
                413,
                "request_too_large",
                f"request body is larger than the limit of {limit} bytes",
                limit_bytes=limit,
            )
        if (
            body
            and request.path.startswith(JSON_ONLY_PREFIX)
            and not _is_json(request.headers.get("Content-Type", ""))
        ):
            return error_response(
                415,
                "unsupported_media_type",
                "request body must be JSON (Content-Type: application/json)",
            )
        return self.get_response(request)
