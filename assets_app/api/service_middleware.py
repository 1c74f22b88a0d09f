"""Request middleware: times worker API requests for the latency histogram on /metrics,
activates the operator's time zone for the admin, answers 503 when the database is full or
away, and sends the console's lists and the public API's GETs to the read replica."""

import logging
import time
import zoneinfo

from django.template.response import SimpleTemplateResponse
from django.utils import timezone

from ..operations import observability
from ..sql import replica
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


# The console pages that read the replica (besides every admin changelist): the lineage and
# the grid. The dashboard, change forms and actions read the primary.
REPLICA_ADMIN_VIEWS = frozenset({"assets_app_dag_lineage", "assets_app_dag_grid"})
PUBLIC_API_PREFIX = "/api/v2/"
READ_METHODS = frozenset({"GET", "HEAD"})


class ReplicaReadsMiddleware:
    """With DATABASE_REPLICA_URL set: runs the console's list pages, the lineage, the grid and
    the public API's GETs (and renders them) with their reads on the replica
    (`replica.run_reads`), unless the client wrote recently; a write to the console or the
    public API sets the pin cookie. Without a replica it does nothing."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (
            request.method not in READ_METHODS
            and replica.configured()
            and request.path.startswith((PUBLIC_API_PREFIX, "/admin/"))
        ):
            value, max_age = replica.pin_cookie_value()
            response.set_cookie(replica.PIN_COOKIE, value, max_age=max_age, samesite="Lax")
        return response

    def process_view(self, request, view_func, view_args, view_kwargs):
        if not replica.configured() or not _reads_replica(request):
            return None
        # Who asks is read on the primary, before the scope (a session just logged in).
        request.user.is_authenticated  # noqa: B018

        def call():
            response = view_func(request, *view_args, **view_kwargs)
            if isinstance(response, SimpleTemplateResponse) and not response.is_rendered:
                response.render()
            return response

        return replica.run_reads(
            call, pinned=replica.pinned_by_cookie(request.COOKIES.get(replica.PIN_COOKIE))
        )


def _reads_replica(request) -> bool:
    if request.method not in READ_METHODS:
        return False
    if request.path.startswith(PUBLIC_API_PREFIX):
        return True
    match = request.resolver_match
    if match is None or match.namespace != "admin" or not match.url_name:
        return False
    return match.url_name.endswith("_changelist") or match.url_name in REPLICA_ADMIN_VIEWS
