"""Request guards for the JSON APIs (`/execution/`, `/api/`, `/auth/`), before any view runs.

- A body over DATA_UPLOAD_MAX_MEMORY_SIZE (`MAX_REQUEST_BODY_BYTES`, default 10 MB) is answered
  413 with the usual `{"detail": {"reason": "request_too_large", ...}}` body. Django refuses to
  read such a body (`RequestDataTooBig`, from the Content-Length alone); left alone that would
  become a bare 400 page.
- On `/execution/`, a request with a body whose Content-Type is not JSON is answered 415
  (`unsupported_media_type`); the Airflow Task SDK always sends `application/json`.
- A NUL character in the path, the query string, a header or the body is answered 422
  (`invalid_characters`): PostgreSQL stores NUL neither in text nor (as \\u0000) in jsonb, so
  such a value could only end as a DataError (500) or an outbox row that can never register.
All answers leave the database untouched: no view runs. On the way out, an HTML 404 or plain 405
under `/api/v2/` becomes a JSON error (`errors.json_fallback`).

The body check reads the raw bytes, never parses JSON: in valid UTF-8 JSON a NUL can only be the
escape `\\u0000` (a raw NUL byte is invalid JSON anyway), and `\\u0000` is an escape only when the
backslash before `u0000` is not itself escaped (an odd run of backslashes). Two substring scans
of the body, plus a walk over the rare candidates. Trade-off: a UTF-16/32 encoded JSON body
(which json.loads would accept) is refused as well, since its ASCII characters carry NUL bytes;
RFC 8259 requires UTF-8 between systems, and the Task SDK sends UTF-8.
"""

from django.conf import settings
from django.core.exceptions import RequestDataTooBig

from .errors import error_response, error_response_for, json_fallback

API_PREFIXES = ("/execution/", "/api/", "/auth/")
JSON_ONLY_PREFIX = "/execution/"


def _is_json(content_type: str) -> bool:
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type == "application/json" or media_type.endswith("+json")


def _body_has_nul(body: bytes) -> bool:
    if b"\x00" in body:
        return True
    at = body.find(b"\\u0000")
    while at != -1:
        start = at
        while start > 0 and body[start - 1] == 0x5C:  # backslash
            start -= 1
        if (at - start) % 2 == 0:  # the backslash at `at` is not escaped: a real \u0000
            return True
        at = body.find(b"\\u0000", at + 1)
    return False


def _has_nul(request, body: bytes) -> bool:
    query = request.META.get("QUERY_STRING", "")
    return (
        "\x00" in request.path
        or "\x00" in query
        or "%00" in query
        or any("\x00" in str(v) for k, v in request.META.items() if k.startswith("HTTP_"))
        or _body_has_nul(body)
    )


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
        if _has_nul(request, body):
            return error_response_for(
                request.path,
                422,
                "invalid_characters",
                "the path, query string, headers and body must not contain NUL characters "
                "(\\u0000)",
            )
        return json_fallback(request, self.get_response(request))
