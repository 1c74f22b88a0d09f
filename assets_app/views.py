"""Plain HTTP views for machines: `/metrics` (Prometheus) and `/healthz`; `/favicon.ico`; the
500 handler."""

import sys

from django.http import HttpResponse, HttpResponsePermanentRedirect, JsonResponse
from django.templatetags.static import static
from django.views import defaults
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4

from .api import errors
from .operations import bundles, observability
from .sql import replica
from .sql.errors import database_unavailable_reason

PROMETHEUS_CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4


@require_GET
def metrics(request):
    return HttpResponse(observability.render_prometheus(), content_type=PROMETHEUS_CONTENT_TYPE)


@require_GET
def healthz(request):
    """200 when the database answers and the drain and scheduler succeeded recently (or, in the
    start-up grace, have not run yet: status "starting"), else 503. Dags the scheduler cannot
    evaluate make it "degraded" (still 200: everything else works), each named with its error.
    With a read replica, its lag: a replica lagging or away changes no status (reads go to the
    primary). `unserved_dags`: unpaused Dags of a Dag bundle no worker claimed for within
    `operations.bundles.SERVED_WITHIN` (10 minutes); they change no status."""
    result = observability.health()
    body = {
        "status": result.status,
        "database": "ok" if result.database else "unreachable",
        "components": {
            c.component: {
                "status": c.status,
                "last_run_at": c.last_run_at.isoformat() if c.last_run_at else None,
                "last_ok_at": c.last_ok_at.isoformat() if c.last_ok_at else None,
            }
            for c in result.components
        },
        "max_age_seconds": observability.health_max_age().total_seconds(),
        "failing_dags": {
            "count": result.failing_dag_count,
            "dags": [
                {
                    "dag_id": d.dag_id,
                    "error": d.error,
                    "since": d.since.isoformat() if d.since else None,
                }
                for d in result.failing_dags
            ],
        },
        # Dags whose bundle no worker claimed for within SERVED_WITHIN (informative: the
        # status stays as it is; a worker may be started on demand).
        "unserved_dags": {
            "count": result.unserved_dag_count,
            "within_seconds": bundles.SERVED_WITHIN.total_seconds(),
            "dags": [
                {
                    "dag_id": d.dag_id,
                    "bundle_name": d.bundle_name,
                    "last_claim_at": d.last_claim_at.isoformat() if d.last_claim_at else None,
                }
                for d in result.unserved_dags
            ],
        },
    }
    if replica.configured():
        body["replica"] = replica_body(replica.status())
    return JsonResponse(body, status=200 if result.ok else 503)


def replica_body(seen: replica.Status) -> dict:
    return {
        "status": seen.state,
        "lag_seconds": None if seen.lag_seconds is None else round(seen.lag_seconds, 3),
        "max_lag_seconds": seen.max_lag_seconds,
        "error": seen.error or None,
    }


@require_GET
def favicon(request):
    """Browsers ask for /favicon.ico whatever the page says: send them to the SVG icon."""
    return HttpResponsePermanentRedirect(static("assets_app/favicon.svg"))


def server_error(request):
    """handler500: an uncaught error that means the database is full or away (raised in a
    middleware, e.g. loading the session) is a 503 with Retry-After; anything else Django's 500."""
    reason = database_unavailable_reason(sys.exc_info()[1])
    if reason is not None:
        return errors.unavailable_response(request, reason)
    return defaults.server_error(request)
