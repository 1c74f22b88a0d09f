"""Public API (`/api/v2/backfills`): Airflow 3.3.2's backfill routes, paths, parameters and
shapes. Same rules as `public.py`: token or staff session, one `@needs` permission per view,
thin views over `backfills`.
"""

from django.http import HttpRequest
from ninja import Field, Query, Router

from assets_app.models import Backfill
from assets_app.scheduling import backfills

from .public import Page, actor_of
from .public_auth import public_api_auth
from .public_permissions import needs
from .public_schemas import (
    BackfillCollectionResponse,
    BackfillPostBody,
    BackfillResponse,
    DryRunBackfillCollectionResponse,
    DryRunBackfillResponse,
    responses,
)

router = Router(tags=["public"], auth=public_api_auth())


class BackfillFilters(Page):
    dag_id: str = Field(max_length=250)


def _plan(body: BackfillPostBody) -> dict:
    return body.dict(exclude={"run_on_latest_version"})


@router.get("/backfills", response=responses(BackfillCollectionResponse))
@needs("view", Backfill)
def list_backfills(
    request: HttpRequest, filters: Query[BackfillFilters]
) -> BackfillCollectionResponse:
    """A Dag's backfills (Airflow: `GET /api/v2/backfills?dag_id=`)."""
    page = backfills.list_backfills(**filters.dict())
    return BackfillCollectionResponse(
        backfills=[BackfillResponse.from_backfill(b) for b in page.rows],
        total_entries=page.total_entries,
    )


@router.post("/backfills", response=responses(BackfillResponse, 400, 404, 409, 503))
@needs("add", Backfill)
def create_backfill(request: HttpRequest, body: BackfillPostBody) -> BackfillResponse:
    """Plan a backfill and start its first runs (Airflow: `POST /api/v2/backfills`)."""
    backfill = backfills.create_backfill(**_plan(body), actor=actor_of(request))
    return BackfillResponse.from_backfill(backfill)


@router.post(
    "/backfills/dry_run",
    response=responses(DryRunBackfillCollectionResponse, 400, 404, 409, 503),
)
@needs("add", Backfill)
def create_backfill_dry_run(
    request: HttpRequest, body: BackfillPostBody
) -> DryRunBackfillCollectionResponse:
    """The dates a backfill would run, writing nothing (Airflow: `POST .../dry_run`)."""
    planned = backfills.plan_backfill(**_plan(body))
    dates = [
        DryRunBackfillResponse(
            logical_date=date.logical_date, partition_key=None, partition_date=None
        )
        for date in planned
        if date.exception_reason is None
    ]
    return DryRunBackfillCollectionResponse(backfills=dates, total_entries=len(dates))


@router.get("/backfills/{backfill_id}", response=responses(BackfillResponse, 404))
@needs("view", Backfill)
def get_backfill(request: HttpRequest, backfill_id: int) -> BackfillResponse:
    return BackfillResponse.from_backfill(backfills.get_backfill(backfill_id=backfill_id))


@router.put("/backfills/{backfill_id}/pause", response=responses(BackfillResponse, 404, 409))
@needs("change", Backfill)
def pause_backfill(request: HttpRequest, backfill_id: int) -> BackfillResponse:
    backfill = backfills.set_paused(
        backfill_id=backfill_id, is_paused=True, actor=actor_of(request)
    )
    return BackfillResponse.from_backfill(backfill)


@router.put("/backfills/{backfill_id}/unpause", response=responses(BackfillResponse, 404, 409))
@needs("change", Backfill)
def unpause_backfill(request: HttpRequest, backfill_id: int) -> BackfillResponse:
    backfill = backfills.set_paused(
        backfill_id=backfill_id, is_paused=False, actor=actor_of(request)
    )
    return BackfillResponse.from_backfill(backfill)


@router.put("/backfills/{backfill_id}/cancel", response=responses(BackfillResponse, 404, 409))
@needs("change", Backfill)
def cancel_backfill(request: HttpRequest, backfill_id: int) -> BackfillResponse:
    """Fail its queued runs and complete it (Airflow: `PUT .../cancel`)."""
    backfill = backfills.cancel(backfill_id=backfill_id, actor=actor_of(request))
    return BackfillResponse.from_backfill(backfill)
