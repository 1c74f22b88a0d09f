"""Public API v2: a task's XCom entries, with Airflow 3.3.2's paths, parameters and shapes
(`routes/public/xcom.py`): `GET|POST .../taskInstances/{task_id}/xcomEntries` and
`GET|PATCH|DELETE .../xcomEntries/{xcom_key}`. Writes are an operator's (`add` / `change` /
`delete` of XCom), audited; a running task writes its own through the worker API.

Mounted before `public_dags`, whose `.../taskInstances/{task_id}/{map_index}` would otherwise
read `xcomEntries` as a map index: a literal segment wins over a parameter, as in Airflow.
"""

from datetime import datetime
from typing import Annotated, Any

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema, Status

from assets_app.models import XCom
from assets_app.runtime import xcoms

from .public import Page, actor_of
from .public_auth import public_api_auth
from .public_permissions import needs
from .public_schemas import StrictSchema, responses
from .schemas import INT32_MAX, UtcDatetime

router = Router(tags=["public"], auth=public_api_auth())

ENTRIES = "/dags/{dag_id}/dagRuns/{dag_run_id}/taskInstances/{task_id}/xcomEntries"


class XComResponse(Schema):
    """Airflow's XComResponse: the display names are the ids here."""

    key: str
    timestamp: datetime
    logical_date: datetime | None
    map_index: int
    task_id: str
    dag_id: str
    run_id: str
    dag_display_name: str
    task_display_name: str
    run_after: datetime

    @staticmethod
    def fields_of(xcom: XCom) -> dict[str, Any]:
        """From an XCom read by `xcoms.list_entries` / `get_entry` (with its run's fields)."""
        return {
            "key": xcom.key,
            "timestamp": xcom.timestamp,
            "logical_date": xcom.logical_date,  # type: ignore[attr-defined]  # (annotated)
            "map_index": xcom.map_index,
            "task_id": xcom.task_id,
            "dag_id": xcom.dag_id,
            "run_id": xcom.run_id,
            "dag_display_name": xcom.dag_id,
            "task_display_name": xcom.task_id,
            "run_after": xcom.run_after,  # type: ignore[attr-defined]  # (annotated)
        }


class XComResponseNative(XComResponse):
    value: Any


class XComResponseString(XComResponse):
    value: str | None


class XComCollectionResponse(Schema):
    xcom_entries: list[XComResponse]
    total_entries: int


class XComFilters(Page):
    xcom_key: str | None = None
    map_index: int | None = Field(default=None, ge=-1, le=INT32_MAX)
    xcom_key_pattern: str | None = None
    xcom_key_prefix_pattern: str | None = None
    dag_display_name_pattern: str | None = None
    dag_display_name_prefix_pattern: str | None = None
    run_id_pattern: str | None = None
    run_id_prefix_pattern: str | None = None
    task_id_pattern: str | None = None
    task_id_prefix_pattern: str | None = None
    map_index_filter: int | None = Field(default=None, ge=-INT32_MAX, le=INT32_MAX)
    logical_date_gte: UtcDatetime | None = None
    logical_date_gt: UtcDatetime | None = None
    logical_date_lte: UtcDatetime | None = None
    logical_date_lt: UtcDatetime | None = None
    run_after_gte: UtcDatetime | None = None
    run_after_gt: UtcDatetime | None = None
    run_after_lte: UtcDatetime | None = None
    run_after_lt: UtcDatetime | None = None


class XComEntryQuery(Schema):
    map_index: int = Field(default=-1, ge=-1, le=INT32_MAX)
    deserialize: bool = False
    stringify: bool = False


@router.get(ENTRIES, response=responses(XComCollectionResponse, 400, 404))
@needs("view", XCom)
def get_xcom_entries(
    request: HttpRequest,
    dag_id: str,
    dag_run_id: str,
    task_id: str,
    filters: Query[XComFilters],
) -> XComCollectionResponse:
    """XCom entries of a task (`~` for any Dag, run or task), filtered and paged; no values,
    as in Airflow."""
    page = xcoms.list_entries(dag_id=dag_id, run_id=dag_run_id, task_id=task_id, **filters.dict())
    return XComCollectionResponse(
        xcom_entries=[XComResponse(**XComResponse.fields_of(x)) for x in page.rows],
        total_entries=page.total_entries,
    )


@router.get(
    f"{ENTRIES}/{{path:xcom_key}}",
    response=responses(XComResponseNative | XComResponseString, 400, 404),
)
@needs("view", XCom)
def get_xcom_entry(
    request: HttpRequest,
    dag_id: str,
    dag_run_id: str,
    task_id: str,
    xcom_key: str,
    query: Query[XComEntryQuery],
) -> XComResponseNative | XComResponseString:
    """One XCom entry with its value: as stored (the Task SDK's serialized JSON), or with
    `deserialize` as Airflow renders it for people; `stringify` gives it as a string."""
    xcom = xcoms.get_entry(
        dag_id=dag_id, run_id=dag_run_id, task_id=task_id, key=xcom_key, map_index=query.map_index
    )
    value = xcoms.readable(xcom.value) if query.deserialize else xcom.value
    if query.stringify:
        return XComResponseString(
            **XComResponse.fields_of(xcom), value=None if value is None else str(value)
        )
    return XComResponseNative(**XComResponse.fields_of(xcom), value=value)


MapIndex = Annotated[int, Field(ge=-1, le=INT32_MAX)]


class XComCreateBody(StrictSchema):
    key: str
    value: Any
    map_index: MapIndex = -1


class XComUpdateBody(StrictSchema):
    value: Any
    map_index: MapIndex = -1


class MapIndexQuery(Schema):
    map_index: MapIndex = -1


@router.post(ENTRIES, response=responses(XComResponseNative, 400, 404, 409, status=201))
@needs("add", XCom)
def create_xcom_entry(
    request: HttpRequest, dag_id: str, dag_run_id: str, task_id: str, body: XComCreateBody
):
    """A new XCom (value stored as sent, as Airflow's `serialize=False`): 404 for an unknown
    Dag, task or run, 409 when the address has one."""
    xcom = xcoms.create_entry(
        dag_id=dag_id,
        run_id=dag_run_id,
        task_id=task_id,
        key=body.key,
        value=body.value,
        map_index=body.map_index,
        actor=actor_of(request),
    )
    return Status(201, XComResponseNative(**XComResponse.fields_of(xcom), value=xcom.value))


@router.patch(f"{ENTRIES}/{{path:xcom_key}}", response=responses(XComResponseNative, 400, 404))
@needs("change", XCom)
def update_xcom_entry(
    request: HttpRequest,
    dag_id: str,
    dag_run_id: str,
    task_id: str,
    xcom_key: str,
    body: XComUpdateBody,
) -> XComResponseNative:
    """Replace an existing XCom's value: 404 when there is none."""
    xcom = xcoms.update_entry(
        dag_id=dag_id,
        run_id=dag_run_id,
        task_id=task_id,
        key=xcom_key,
        value=body.value,
        map_index=body.map_index,
        actor=actor_of(request),
    )
    return XComResponseNative(**XComResponse.fields_of(xcom), value=xcom.value)


@router.delete(f"{ENTRIES}/{{path:xcom_key}}", response=responses(None, 400, 404, status=204))
@needs("delete", XCom)
def delete_xcom_entry(
    request: HttpRequest,
    dag_id: str,
    dag_run_id: str,
    task_id: str,
    xcom_key: str,
    query: Query[MapIndexQuery],
):
    """Delete one XCom: 204, or 404 when there is none."""
    xcoms.delete_entry(
        dag_id=dag_id,
        run_id=dag_run_id,
        task_id=task_id,
        key=xcom_key,
        map_index=query.map_index,
        actor=actor_of(request),
    )
    return Status(204, None)
