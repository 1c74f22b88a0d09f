"""Public API v2: Human-in-the-loop details (issue 42), with Airflow 3.3.2's paths and bodies
(`core_api/routes/public/hitl.py`): `GET /dags/{dag_id}/dagRuns/{dag_run_id}/hitlDetails`
(`~` for any Dag or run), `GET|PATCH .../taskInstances/{task_id}/{map_index}/hitlDetails`.
Reading needs `view_hitldetail`, answering `change_hitldetail` (Airflow's `HITL_DETAIL` GET and
PUT); a detail with assigned users takes an answer from one of them only (403). The answer is
audited with the caller as actor; a second one is 409. Thin views over `task_state.hitl` and
`catalog.hitl_reads`.
"""

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema

from assets_app.catalog import hitl_reads, listing
from assets_app.models import HITLDetail
from assets_app.task_state import hitl

from . import public_auth
from .public import actor_of
from .public_auth import public_api_auth
from .public_permissions import needs
from .public_schemas import Offset, StrictSchema, TaskInstanceResponse, responses

router = Router(tags=["public"], auth=public_api_auth())

RUN = "/dags/{dag_id}/dagRuns/{dag_run_id}"
TI_HITL = RUN + "/taskInstances/{task_id}/{map_index}/hitlDetails"


class HITLUser(Schema):
    id: str
    name: str


class UpdateHITLDetailPayload(StrictSchema):
    """Airflow's public `UpdateHITLDetailPayload`."""

    chosen_options: list[str] = Field(min_length=1)
    params_input: dict[str, Any] = Field(default_factory=dict)


class HITLDetailResponse(Schema):
    """Airflow's public `HITLDetailResponse` (the answer to a PATCH)."""

    responded_by: HITLUser
    responded_at: datetime
    chosen_options: list[str]
    params_input: dict[str, Any]


def _params(params: Mapping[str, Any]) -> dict[str, Any]:
    # Airflow's `BaseHITLDetail.get_params`: a bare value shown as a param.
    return {
        key: value
        if isinstance(value, dict) and all(k in value for k in ("description", "schema", "value"))
        else {"value": value, "description": None, "schema": {}}
        for key, value in params.items()
    }


class HITLDetailSchema(Schema):
    """Airflow's public `HITLDetail`: the request, the response and the TI."""

    options: list[str]
    subject: str
    body: str | None
    defaults: list[str] | None
    multiple: bool
    params: dict[str, Any]
    assigned_users: list[HITLUser]
    created_at: datetime
    responded_by_user: HITLUser | None
    responded_at: datetime | None
    chosen_options: list[str] | None
    params_input: dict[str, Any]
    response_received: bool
    task_instance: TaskInstanceResponse

    @classmethod
    def of(cls, detail: HITLDetail) -> "HITLDetailSchema":
        by = detail.responded_by
        return cls(
            options=detail.options,
            subject=detail.subject,
            body=detail.body,
            defaults=detail.defaults,
            multiple=bool(detail.multiple),
            params=_params(detail.params or {}),
            assigned_users=[HITLUser(**u) for u in detail.assigned_users],
            created_at=detail.created_at,
            responded_by_user=HITLUser(id=by["id"], name=by["name"]) if by else None,
            responded_at=detail.responded_at,
            chosen_options=detail.chosen_options,
            params_input=detail.params_input or {},
            response_received=detail.response_received,
            task_instance=TaskInstanceResponse.from_ti(detail.ti),
        )


class HITLDetailCollection(Schema):
    hitl_details: list[HITLDetailSchema]
    total_entries: int


class HITLListQuery(Schema):
    limit: int = Field(default=listing.DEFAULT_PAGE_LIMIT, ge=0, le=2**31 - 1)
    offset: Offset = 0
    order_by: list[str] = Field(default_factory=list)
    dag_id_pattern: str | None = None
    dag_id_prefix_pattern: str | None = None
    task_id: str | None = None
    task_id_pattern: str | None = None
    task_id_prefix_pattern: str | None = None
    map_index: int | None = Field(default=None, ge=-1, le=2**31 - 1)
    state: list[str] = Field(default_factory=list)
    response_received: bool | None = None
    responded_by_user_id: list[str] = Field(default_factory=list)
    responded_by_user_name: list[str] = Field(default_factory=list)
    subject_search: str | None = None
    body_search: str | None = None
    created_at_gte: datetime | None = None
    created_at_gt: datetime | None = None
    created_at_lte: datetime | None = None
    created_at_lt: datetime | None = None


@router.get(f"{RUN}/hitlDetails", response=responses(HITLDetailCollection, 400))
@needs("view", HITLDetail)
def list_hitl_details(
    request: HttpRequest, dag_id: str, dag_run_id: str, query: Query[HITLListQuery]
):
    filters = hitl_reads.HITLFilters(**query.model_dump(exclude={"limit", "offset", "order_by"}))
    page = hitl_reads.list_details(
        dag_id=dag_id,
        run_id=dag_run_id,
        filters=filters,
        order_by=query.order_by,
        limit=query.limit,
        offset=query.offset,
    )
    return HITLDetailCollection(
        hitl_details=[HITLDetailSchema.of(d) for d in page.rows], total_entries=page.total_entries
    )


@router.get(TI_HITL, response=responses(HITLDetailSchema, 404))
@needs("view", HITLDetail)
def get_hitl_detail(
    request: HttpRequest, dag_id: str, dag_run_id: str, task_id: str, map_index: int
):
    detail = hitl_reads.get_detail(
        dag_id=dag_id, run_id=dag_run_id, task_id=task_id, map_index=map_index
    )
    return HITLDetailSchema.of(detail)


@router.patch(TI_HITL, response=responses(HITLDetailResponse, 400, 404, 409))
@needs("change", HITLDetail)
def update_hitl_detail(
    request: HttpRequest,
    dag_id: str,
    dag_run_id: str,
    task_id: str,
    map_index: int,
    payload: UpdateHITLDetailPayload,
):
    user = public_auth.user_of(request)
    detail = hitl.respond(
        dag_id=dag_id,
        run_id=dag_run_id,
        task_id=task_id,
        map_index=map_index,
        responder=hitl.Responder(id=str(user.pk), name=user.get_username()),
        chosen_options=payload.chosen_options,
        params_input=payload.params_input,
        actor=actor_of(request),
    )
    assert detail.responded_by is not None and detail.responded_at is not None
    return HITLDetailResponse(
        responded_by=HITLUser(**detail.responded_by),
        responded_at=detail.responded_at,
        chosen_options=detail.chosen_options or [],
        params_input=detail.params_input or {},
    )
