"""Request middleware: times worker API requests for the latency histogram on /metrics,
activates the operator's time zone for the admin, and answers 503 when the database is full or
away."""

import logging
import time
import zoneinfo

from django.utils import timezone

from ..operations import observability
from ..sql.errors import database_unavailable_reason
from . import errors

logger = logging.getLogger(__name__)

WORKER_API_PREFIX = "/execution/"


class WorkerApiLatencyMiddleware:
    """Times each `/execution/` request and records it after the response is built, in the
    process-memory histogram (`observability.record_api_latency`: no statement)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if not request.path.startswith(WORKER_API_PREFIX):
            return self.get_response(request)
        started = time.perf_counter()
        response = self.get_response(request)
        elapsed = time.perf_counter() - started
        match = request.resolver_match
        route = match.route if match is not None else "unmatched"
        observability.record_api_latency(method=request.method, route=route, seconds=elapsed)
        return response


# The session key holding an operator's chosen time zone (set on the admin's time-zone page).
TIMEZONE_SESSION_KEY = "aes_timezone"


class OperatorTimezoneMiddleware:
    """Shows times in the zone the operator chose (session), else in TIME_ZONE. After the
    session middleware; the worker and public APIs answer in ISO 8601 with offsets anyway."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        name = getattr(request, "session", {}).get(TIMEZONE_SESSION_KEY)
        if name:
            try:
                timezone.activate(zoneinfo.ZoneInfo(name))
            except (zoneinfo.ZoneInfoNotFoundError, ValueError):
                timezone.deactivate()
        else:
            timezone.deactivate()
        return self.get_response(request)


class DatabaseUnavailableMiddleware:
    """A view (admin, /healthz, /metrics) that fails because the database is full or away answers
    503 with Retry-After (`errors.unavailable_response`), not a 500 page. The APIs map it
    themselves (`errors.install`); an exception in a middleware reaches the 500 handler
    (`views.server_error`), which does the same."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        reason = database_unavailable_reason(exception)
        if reason is None:
            return None
        logger.warning("%s %s: %s (%s)", request.method, request.path, reason, exception)
        return errors.unavailable_response(request, reason)
