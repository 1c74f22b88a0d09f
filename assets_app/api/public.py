"""Public API (DESIGN 6.2), mounted at /api/v2/.

Every endpoint authenticates with `public_auth` (API token or staff session, never anonymous):
the router carries the auth, so an endpoint added here inherits it. Views are thin: parse the body
(schemas in `public_schemas.py`), call one domain function, shape the response.
"""

from django.http import HttpRequest
from ninja import Router

from assets_app import runs

from .public_auth import public_api_auth
from .public_schemas import DagRunResponse, TriggerDagRunBody

router = Router(tags=["public"], auth=public_api_auth())


@router.post("/dags/{dag_id}/dagRuns", response=DagRunResponse, url_name="trigger_dag_run")
def trigger_dag_run(request: HttpRequest, dag_id: str, body: TriggerDagRunBody) -> DagRunResponse:
    """Trigger a manual run (Airflow: `POST /api/v2/dags/{dag_id}/dagRuns`)."""
    run = runs.trigger_dag(
        dag_id=dag_id,
        conf=body.conf,
        triggering_user_name=request.auth.get_username(),
        run_id=body.dag_run_id,
        run_after=body.run_after,
        logical_date=body.logical_date,
        data_interval_start=body.data_interval_start,
        data_interval_end=body.data_interval_end,
        note=body.note,
    )
    return DagRunResponse.from_run(run)
