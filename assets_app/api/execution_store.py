"""Worker API (DESIGN 6.1): the task and asset state store (Airflow 3.3's AIP-103), thin views
over `runtime.state_store`. Paths, parameters, status codes and bodies as Airflow 3.3.2's
execution API (`/store/ti`, `/store/asset`; task-sdk 1.3.2's `TaskStateStoreOperations` and
`AssetStateStoreOperations` call them): a read answers `{"value": ...}` or 404 `not_found`
(which the SDK reads as "no value"), a write or delete 204.

A task route's TI must be the token's (Airflow's `ti:self`; `auth.TaskTokenAuth` checks the
path), of its current try; writes only while it runs or in its overtime (`task_scopes`).
"""

from typing import Annotated
from uuid import UUID

from django.http import HttpRequest, HttpResponse
from ninja import Field, Router, Status

from assets_app.models import AssetStateWriter
from assets_app.runtime import scopes as task_scopes
from assets_app.runtime import state_store

from . import auth
from . import runtime_schemas as rs

router = Router(tags=["execution"], auth=auth.task_token)

TI_STORE = "/store/ti/{task_instance_id}"
NonEmpty = Annotated[str, Field(min_length=1)]


def _value(text: str) -> HttpResponse:
    # The stored JSON text as it is: Airflow returns what was written, key order included.
    return HttpResponse(f'{{"value": {text}}}', content_type="application/json")


def _task_scope(request: HttpRequest, ti_id: UUID, *, write: bool) -> state_store.TaskScope:
    ti = task_scopes.load(ti_id=ti_id)
    if ti is not None:  # unknown: task_scope answers Airflow's 404
        token_try = auth.try_of(auth.claims_of(request))
        task_scopes.check_state_store_access(ti, token_try=token_try, write=write)
    return state_store.task_scope(ti_id=ti_id)


@router.get(f"{TI_STORE}/{{path:key}}")
def task_state_get(request: HttpRequest, task_instance_id: UUID, key: str):
    scope = _task_scope(request, task_instance_id, write=False)
    return _value(state_store.get_task_value(scope=scope, key=key))


@router.put(f"{TI_STORE}/{{path:key}}", response={204: None})
def task_state_put(
    request: HttpRequest, task_instance_id: UUID, key: str, body: rs.TaskStateStorePutBody
):
    scope = _task_scope(request, task_instance_id, write=True)
    state_store.set_task_value(scope=scope, key=key, value=body.value, expires_at=body.expires_at)
    return Status(204, None)


@router.delete(f"{TI_STORE}/{{path:key}}", response={204: None})
def task_state_delete(request: HttpRequest, task_instance_id: UUID, key: str):
    scope = _task_scope(request, task_instance_id, write=True)
    state_store.delete_task_value(scope=scope, key=key)
    return Status(204, None)


@router.delete(TI_STORE, response={204: None})
def task_state_clear(request: HttpRequest, task_instance_id: UUID):
    scope = _task_scope(request, task_instance_id, write=True)
    state_store.clear_task_values(scope=scope)
    return Status(204, None)


# --- asset state: /by-name?name= and /by-uri?uri= ---------------------------------------------


def _asset(request: HttpRequest, *, name: str | None, uri: str | None, write: bool):
    ti = auth.token_ti(request)
    task_scopes.check_state_store_access(ti, token_try=ti.try_number, write=write)
    return state_store.asset_of(name=name, uri=uri)


def _task_writer(request: HttpRequest) -> state_store.Writer:
    ti = auth.token_ti(request)
    return state_store.Writer(
        kind=AssetStateWriter.TASK,
        dag_id=ti.dag_id,
        run_id=ti.run_id,
        task_id=ti.task_id,
        map_index=ti.map_index,
    )


def _asset_get(request: HttpRequest, key: str, *, name: str | None = None, uri: str | None = None):
    asset = _asset(request, name=name, uri=uri, write=False)
    return _value(state_store.get_asset_value(asset=asset, key=key))


def _asset_put(
    request: HttpRequest,
    key: str,
    body: rs.AssetStateStorePutBody,
    *,
    name: str | None = None,
    uri: str | None = None,
):
    asset = _asset(request, name=name, uri=uri, write=True)
    state_store.set_asset_value(
        asset=asset,
        key=key,
        value=body.value,
        writer=_task_writer(request),
        actor=auth.task_actor(request),
    )
    return Status(204, None)


def _asset_delete(
    request: HttpRequest, key: str, *, name: str | None = None, uri: str | None = None
):
    asset = _asset(request, name=name, uri=uri, write=True)
    state_store.delete_asset_value(asset=asset, key=key, actor=auth.task_actor(request))
    return Status(204, None)


def _asset_clear(request: HttpRequest, *, name: str | None = None, uri: str | None = None):
    asset = _asset(request, name=name, uri=uri, write=True)
    state_store.clear_asset_values(asset=asset, actor=auth.task_actor(request))
    return Status(204, None)


@router.get("/store/asset/by-name/value")
def asset_state_get_by_name(request: HttpRequest, name: NonEmpty, key: NonEmpty):
    return _asset_get(request, key, name=name)


@router.put("/store/asset/by-name/value", response={204: None})
def asset_state_put_by_name(
    request: HttpRequest, name: NonEmpty, key: NonEmpty, body: rs.AssetStateStorePutBody
):
    return _asset_put(request, key, body, name=name)


@router.delete("/store/asset/by-name/value", response={204: None})
def asset_state_delete_by_name(request: HttpRequest, name: NonEmpty, key: NonEmpty):
    return _asset_delete(request, key, name=name)


@router.delete("/store/asset/by-name/clear", response={204: None})
def asset_state_clear_by_name(request: HttpRequest, name: NonEmpty):
    return _asset_clear(request, name=name)


@router.get("/store/asset/by-uri/value")
def asset_state_get_by_uri(request: HttpRequest, uri: NonEmpty, key: NonEmpty):
    return _asset_get(request, key, uri=uri)


@router.put("/store/asset/by-uri/value", response={204: None})
def asset_state_put_by_uri(
    request: HttpRequest, uri: NonEmpty, key: NonEmpty, body: rs.AssetStateStorePutBody
):
    return _asset_put(request, key, body, uri=uri)


@router.delete("/store/asset/by-uri/value", response={204: None})
def asset_state_delete_by_uri(request: HttpRequest, uri: NonEmpty, key: NonEmpty):
    return _asset_delete(request, key, uri=uri)


@router.delete("/store/asset/by-uri/clear", response={204: None})
def asset_state_clear_by_uri(request: HttpRequest, uri: NonEmpty):
    return _asset_clear(request, uri=uri)
