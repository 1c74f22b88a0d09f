"""Public API v2: the task and asset state store (AIP-103), with Airflow 3.3.2's paths,
parameters and bodies: `/dags/{dag_id}/dagRuns/{dag_run_id}/taskInstances/{task_id}/state-store`
(list, `GET|PUT|PATCH|DELETE /{key}`, `DELETE` all with `all_map_indices`) and
`/assets/{asset_id}/state-store` (list, `GET|PUT|DELETE /{key}`, `DELETE` all). Thin views over
`runtime.state_store`; each route needs its model permission (`needs`), and every write is
audited with the caller as actor. Values are held to STATE_STORE_MAX_VALUE_BYTES here (422), as
Airflow's public API holds them to `max_value_storage_bytes`."""

import json
from datetime import datetime, timedelta
from typing import Any, Literal

from django.conf import settings
from django.http import HttpRequest
from django.utils import timezone
from ninja import Field, Query, Router, Schema, Status
from pydantic import AwareDatetime

from assets_app.catalog import listing
from assets_app.guards import exceptions
from assets_app.models import AssetStateStore, AssetStateWriter, TaskStateStore
from assets_app.runtime import state_store

from .public import actor_of
from .public_auth import public_api_auth
from .public_permissions import needs
from .public_schemas import Offset, StrictSchema, responses

router = Router(tags=["public"], auth=public_api_auth())

TI_STORE = "/dags/{dag_id}/dagRuns/{dag_run_id}/taskInstances/{task_id}/state-store"
ASSET_STORE = "/assets/{asset_id}/state-store"


class StorePage(Schema):
    limit: int = Field(default=listing.DEFAULT_PAGE_LIMIT, ge=0, le=2**31 - 1)
    offset: Offset = 0


class TaskAddress(Schema):
    map_index: int = Field(default=-1, ge=-1, le=2**31 - 1)


class TaskStateStoreResponse(StrictSchema):
    key: str
    value: Any
    updated_at: datetime
    expires_at: datetime | None

    @classmethod
    def from_row(cls, row: TaskStateStore) -> "TaskStateStoreResponse":
        return cls(
            key=row.key,
            value=json.loads(row.value),
            updated_at=row.updated_at,
            expires_at=row.expires_at,
        )


class TaskStateStoreCollectionResponse(StrictSchema):
    task_state_store: list[TaskStateStoreResponse]
    total_entries: int


class TaskStateStoreBody(StrictSchema):
    # "default": STATE_STORE_DEFAULT_RETENTION_DAYS from now; null: never expires.
    value: Any
    expires_at: AwareDatetime | Literal["default"] | None = "default"


class StateStoreValueBody(StrictSchema):
    value: Any


class AssetStateStoreLastUpdatedBy(StrictSchema):
    kind: AssetStateWriter
    dag_id: str | None = None
    run_id: str | None = None
    task_id: str | None = None
    map_index: int | None = None


class AssetStateStoreResponse(StrictSchema):
    key: str
    value: Any
    updated_at: datetime
    last_updated_by: AssetStateStoreLastUpdatedBy | None = None

    @classmethod
    def from_row(cls, row: AssetStateStore) -> "AssetStateStoreResponse":
        writer = None
        if row.last_updated_by_kind is not None:
            writer = AssetStateStoreLastUpdatedBy(
                kind=AssetStateWriter(row.last_updated_by_kind),
                dag_id=row.last_updated_by_dag_id,
                run_id=row.last_updated_by_run_id,
                task_id=row.last_updated_by_task_id,
                map_index=row.last_updated_by_map_index,
            )
        return cls(
            key=row.key,
            value=json.loads(row.value),
            updated_at=row.updated_at,
            last_updated_by=writer,
        )


class AssetStateStoreCollectionResponse(StrictSchema):
    asset_state_store: list[AssetStateStoreResponse]
    total_entries: int


def _expires_at(requested: datetime | str | None) -> datetime | None:
    if requested is None or isinstance(requested, datetime):
        return requested
    days = settings.STATE_STORE_DEFAULT_RETENTION_DAYS
    if days < 0:
        raise exceptions.BadRequest(
            f"STATE_STORE_DEFAULT_RETENTION_DAYS must be >= 0, got {days}. Set to 0 to disable "
            "expiry."
        )
    return None if days == 0 else timezone.now() + timedelta(days=days)


def _scope(dag_id: str, dag_run_id: str, task_id: str, map_index: int | None):
    return state_store.require_task_scope(
        dag_id=dag_id, run_id=dag_run_id, task_id=task_id, map_index=map_index
    )


# --- task state -------------------------------------------------------------------------------


@router.get(TI_STORE, response=responses(TaskStateStoreCollectionResponse))
@needs("view", TaskStateStore)
def list_task_state(
    request: HttpRequest,
    dag_id: str,
    dag_run_id: str,
    task_id: str,
    page: Query[StorePage],
    address: Query[TaskAddress],
):
    scope = state_store.task_scope_at(
        dag_id=dag_id, run_id=dag_run_id, task_id=task_id, map_index=address.map_index
    )
    if scope is None:
        return TaskStateStoreCollectionResponse(task_state_store=[], total_entries=0)
    rows = state_store.task_values(scope=scope)
    return TaskStateStoreCollectionResponse(
        task_state_store=[
            TaskStateStoreResponse.from_row(r) for r in rows[page.offset : page.offset + page.limit]
        ],
        total_entries=rows.count(),
    )


@router.get(f"{TI_STORE}/{{path:key}}", response=responses(TaskStateStoreResponse, 404))
@needs("view", TaskStateStore)
def get_task_state(
    request: HttpRequest,
    dag_id: str,
    dag_run_id: str,
    task_id: str,
    key: str,
    address: Query[TaskAddress],
):
    scope = state_store.task_scope_at(
        dag_id=dag_id, run_id=dag_run_id, task_id=task_id, map_index=address.map_index
    )
    return TaskStateStoreResponse.from_row(state_store.get_task_row(scope=scope, key=key))


@router.put(f"{TI_STORE}/{{path:key}}", response=responses(None, 404, status=204))
@needs("change", TaskStateStore)
def put_task_state(
    request: HttpRequest,
    dag_id: str,
    dag_run_id: str,
    task_id: str,
    key: str,
    body: TaskStateStoreBody,
    address: Query[TaskAddress],
):
    scope = _scope(dag_id, dag_run_id, task_id, address.map_index)
    state_store.set_task_value(
        scope=scope,
        key=key,
        value=body.value,
        expires_at=_expires_at(body.expires_at),
        public=True,
        actor=actor_of(request),
    )
    return Status(204, None)


# Airflow answers 200 with a JSON null (its handler returns nothing, its schema is any).
@router.patch(f"{TI_STORE}/{{path:key}}", response=responses(Any, 404))
@needs("change", TaskStateStore)
def patch_task_state(
    request: HttpRequest,
    dag_id: str,
    dag_run_id: str,
    task_id: str,
    key: str,
    body: StateStoreValueBody,
    address: Query[TaskAddress],
):
    scope = _scope(dag_id, dag_run_id, task_id, address.map_index)
    state_store.patch_task_value(scope=scope, key=key, value=body.value, actor=actor_of(request))
    return Status(200, None)


@router.delete(f"{TI_STORE}/{{path:key}}", response=responses(None, 404, status=204))
@needs("delete", TaskStateStore)
def delete_task_state(
    request: HttpRequest,
    dag_id: str,
    dag_run_id: str,
    task_id: str,
    key: str,
    address: Query[TaskAddress],
):
    scope = _scope(dag_id, dag_run_id, task_id, address.map_index)
    state_store.delete_task_value(scope=scope, key=key, actor=actor_of(request))
    return Status(204, None)


@router.delete(TI_STORE, response=responses(None, 404, status=204))
@needs("delete", TaskStateStore)
def clear_task_state(
    request: HttpRequest,
    dag_id: str,
    dag_run_id: str,
    task_id: str,
    address: Query[TaskAddress],
    all_map_indices: bool = False,
):
    scope = _scope(dag_id, dag_run_id, task_id, None if all_map_indices else address.map_index)
    state_store.clear_task_values(
        scope=scope, all_map_indices=all_map_indices, actor=actor_of(request)
    )
    return Status(204, None)


# --- asset state ------------------------------------------------------------------------------


@router.get(ASSET_STORE, response=responses(AssetStateStoreCollectionResponse, 404))
@needs("view", AssetStateStore)
def list_asset_state(request: HttpRequest, asset_id: int, page: Query[StorePage]):
    rows = state_store.asset_values(asset=state_store.asset_by_id(asset_id=asset_id))
    return AssetStateStoreCollectionResponse(
        asset_state_store=[
            AssetStateStoreResponse.from_row(r)
            for r in rows[page.offset : page.offset + page.limit]
        ],
        total_entries=rows.count(),
    )


@router.get(f"{ASSET_STORE}/{{path:key}}", response=responses(AssetStateStoreResponse, 404))
@needs("view", AssetStateStore)
def get_asset_state(request: HttpRequest, asset_id: int, key: str):
    asset = state_store.asset_by_id(asset_id=asset_id)
    return AssetStateStoreResponse.from_row(state_store.get_asset_row(asset=asset, key=key))


@router.put(f"{ASSET_STORE}/{{path:key}}", response=responses(None, 404, status=204))
@needs("change", AssetStateStore)
def put_asset_state(request: HttpRequest, asset_id: int, key: str, body: StateStoreValueBody):
    state_store.set_asset_value(
        asset=state_store.asset_by_id(asset_id=asset_id),
        key=key,
        value=body.value,
        writer=state_store.API_WRITER,
        actor=actor_of(request),
        public=True,
    )
    return Status(204, None)


@router.delete(f"{ASSET_STORE}/{{path:key}}", response=responses(None, 404, status=204))
@needs("delete", AssetStateStore)
def delete_asset_state(request: HttpRequest, asset_id: int, key: str):
    asset = state_store.asset_by_id(asset_id=asset_id)
    state_store.delete_asset_value(asset=asset, key=key, actor=actor_of(request))
    return Status(204, None)


@router.delete(ASSET_STORE, response=responses(None, 404, status=204))
@needs("delete", AssetStateStore)
def clear_asset_state(request: HttpRequest, asset_id: int):
    asset = state_store.asset_by_id(asset_id=asset_id)
    state_store.clear_asset_values(asset=asset, actor=actor_of(request))
    return Status(204, None)
