"""Worker API (DESIGN 6.1): Human-in-the-loop details (issue 42), thin views over
`task_state.hitl`. Paths, bodies and status codes as Airflow 3.3.2's execution API
(`routes/hitl.py`; task-sdk 1.3.2's `HITLOperations` calls them): `POST /hitlDetails/{ti_id}`
201 the request, `PATCH` the task's own response (409 once answered), `GET` the response part
(404 without a request). The TI must be the token's (Airflow's `ti:self`).
"""

from datetime import datetime
from typing import Any
from uuid import UUID

from django.http import HttpRequest
from ninja import Field, Router, Schema, Status
from pydantic import ConfigDict

from assets_app.models import HITLDetail
from assets_app.task_state import hitl

from . import auth

router = Router(tags=["execution"], auth=auth.task_token)

PATH = "/hitlDetails/{task_instance_id}"


class _Lenient(Schema):
    # Airflow's execution API models ignore unknown fields (the SDK sends its comms `type`).
    model_config = ConfigDict(extra="ignore")


class HITLUser(_Lenient):
    id: str
    name: str


class HITLDetailRequest(_Lenient):
    """Airflow's execution-API `HITLDetailRequest` (the request a task writes, and the answer)."""

    ti_id: UUID
    options: list[str] = Field(min_length=1)
    subject: str
    body: str | None = None
    defaults: list[str] | None = None
    multiple: bool = False
    params: dict[str, Any] = Field(default_factory=dict)
    assigned_users: list[HITLUser] = Field(default_factory=list)

    @classmethod
    def of(cls, detail: HITLDetail) -> "HITLDetailRequest":
        return cls(
            ti_id=detail.ti_id,
            options=detail.options,
            subject=detail.subject,
            body=detail.body,
            defaults=detail.defaults,
            multiple=bool(detail.multiple),
            params=detail.params or {},
            assigned_users=[HITLUser(**u) for u in detail.assigned_users],
        )


class UpdateHITLDetailPayload(_Lenient):
    ti_id: UUID
    chosen_options: list[str] = Field(min_length=1)
    params_input: dict[str, Any] = Field(default_factory=dict)


class HITLDetailResponse(Schema):
    """Airflow's execution-API `HITLDetailResponse` (`from_hitl_detail_orm`)."""

    response_received: bool
    responded_by_user: HITLUser | None = None
    responded_at: datetime | None
    chosen_options: list[str] | None
    params_input: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def of(cls, detail: HITLDetail) -> "HITLDetailResponse":
        by = detail.responded_by
        return cls(
            response_received=detail.response_received,
            responded_by_user=HITLUser(id=by["id"], name=by["name"]) if by else None,
            responded_at=detail.responded_at,
            chosen_options=list(detail.chosen_options or ()),
            params_input=detail.params_input or {},
        )


@router.post(PATH, response={201: HITLDetailRequest})
def upsert_hitl_detail(request: HttpRequest, task_instance_id: UUID, payload: HITLDetailRequest):
    detail = hitl.upsert_request(
        ti_id=task_instance_id,
        try_number=auth.try_of(auth.claims_of(request)),
        options=payload.options,
        subject=payload.subject,
        body=payload.body,
        defaults=payload.defaults,
        multiple=payload.multiple,
        params=payload.params,
        assigned_users=[u.model_dump() for u in payload.assigned_users],
    )
    return Status(201, HITLDetailRequest.of(detail))


@router.patch(PATH, response=HITLDetailResponse)
def update_hitl_detail(
    request: HttpRequest, task_instance_id: UUID, payload: UpdateHITLDetailPayload
):
    detail = hitl.worker_respond(
        ti_id=task_instance_id,
        try_number=auth.try_of(auth.claims_of(request)),
        chosen_options=payload.chosen_options,
        params_input=payload.params_input,
    )
    return HITLDetailResponse.of(detail)


@router.get(PATH, response=HITLDetailResponse)
def get_hitl_detail(request: HttpRequest, task_instance_id: UUID):
    return HITLDetailResponse.of(hitl.get_detail(ti_id=task_instance_id))
