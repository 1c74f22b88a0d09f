"""Worker API (DESIGN 6.1), the rest of what a running task calls: rendered fields, inlet and
outlet validation, XComs, Variables, Connections, reschedule start dates, its previous
successful run, dag-run reads / trigger / clear, TI counts and states. Thin views over
`task_runtime`, `xcoms` and `variables`; paths, parameters, status codes and bodies as Airflow's
execution API of version 2026-06-30 (task-sdk 1.3.2's client calls them). Every route takes a
valid task token (any TI's, except `/task-instances/{id}/...`, which must be that TI's), and
each is held to what `task_scopes` lets that token do (issue 26: XComs of its own TI and run,
writes and Connections while it runs).
"""

from typing import Annotated, Any
from uuid import UUID

from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import Body, Query, Router, Status
from pydantic import Field

from assets_app.runtime import requests as task_runtime
from assets_app.runtime import scopes as task_scopes
from assets_app.runtime import variables, xcoms

from . import auth
from . import runtime_schemas as rs
from .schemas import BUNDLE_NAME, UtcDatetime

# Integer parameters as PostgreSQL's integer holds them (a larger one is a 422, not a 500).
Int32 = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]

router = Router(tags=["execution"], auth=auth.task_token)

TI_PATH = "/task-instances/{task_instance_id}"
XCOM_PATH = "/xcoms/{dag_id}/{run_id}/{task_id}/{path:key}"


def _json(value: Any, status: int = 200) -> JsonResponse:
    return JsonResponse(value, status=status, safe=False)


def _require_running(request: HttpRequest, what: str) -> None:
    ti = auth.token_ti(request)
    task_scopes.require_running(ti_id=ti.id, state=ti.state, what=what)


# --- task instances --------------------------------------------------------------------------


@router.put(f"{TI_PATH}/rtif", response={201: rs.OKMessage})
def ti_put_rtif(request: HttpRequest, task_instance_id: UUID, fields: Body[dict[str, Any]]):
    # A TI route: the authentication checked the token names this TI but read no row (one read).
    ti = task_scopes.load(ti_id=task_instance_id)
    if ti is not None:  # unknown: set_rendered_fields answers its 404
        task_scopes.check_rendered_fields_write(ti, token_try=auth.try_of(auth.claims_of(request)))
    task_runtime.set_rendered_fields(ti_id=task_instance_id, fields=fields)
    return Status(201, {"message": "Rendered task instance fields successfully set"})


@router.get(f"{TI_PATH}/validate-inlets-and-outlets", response=rs.InactiveAssetsResponse)
def ti_validate_inlets_and_outlets(request: HttpRequest, task_instance_id: UUID):
    return {"inactive_assets": task_runtime.inactive_assets(ti_id=task_instance_id)}


@router.get(f"{TI_PATH}/previous-successful-dagrun", response=rs.PrevSuccessfulDagRunResponse)
def ti_previous_successful_dagrun(request: HttpRequest, task_instance_id: UUID):
    run = task_runtime.previous_successful_run(ti_id=task_instance_id)
    return rs.PrevSuccessfulDagRunResponse.from_run(run)


@router.get("/task-reschedules/{task_instance_id}/start_date")
def reschedule_start_date(request: HttpRequest, task_instance_id: UUID, try_number: Int32 = 1):
    start = task_runtime.first_reschedule_date(ti_id=task_instance_id, try_number=try_number)
    return _json(start)


@router.get("/task-instances/count")
def ti_count(request: HttpRequest, filters: Query[rs.TICountFilters]):
    return _json(task_runtime.count_task_instances(**filters.model_dump()))


@router.get("/task-instances/states", response=rs.TaskStatesResponse)
def ti_states(request: HttpRequest, filters: Query[rs.TIFilters]):
    return {"task_states": task_runtime.task_instance_states(**filters.model_dump())}


# --- XComs -----------------------------------------------------------------------------------


@router.get(f"{XCOM_PATH}/item/{{offset}}")
def xcom_item(
    request: HttpRequest, dag_id: str, run_id: str, task_id: str, key: str, offset: Int32
):
    task_scopes.check_xcom_read(auth.token_ti(request), dag_id=dag_id, run_id=run_id)
    return _json(xcoms.item(dag_id=dag_id, run_id=run_id, task_id=task_id, key=key, offset=offset))


@router.get(f"{XCOM_PATH}/slice")
def xcom_slice(
    request: HttpRequest,
    dag_id: str,
    run_id: str,
    task_id: str,
    key: str,
    start: Int32 | None = None,
    stop: Int32 | None = None,
    step: Int32 | None = None,
    include_prior_dates: bool = False,
):
    task_scopes.check_xcom_read(auth.token_ti(request), dag_id=dag_id, run_id=run_id)
    values = xcoms.value_slice(
        dag_id=dag_id, run_id=run_id, task_id=task_id, key=key, start=start, stop=stop, step=step
    )
    return _json(values)


@router.api_operation(["HEAD"], XCOM_PATH)
def xcom_head(request: HttpRequest, dag_id: str, run_id: str, task_id: str, key: str):
    task_scopes.check_xcom_read(auth.token_ti(request), dag_id=dag_id, run_id=run_id)
    response = HttpResponse(status=200)
    count = xcoms.count(dag_id=dag_id, run_id=run_id, task_id=task_id, key=key)
    response["Content-Range"] = f"map_indexes {count}"
    return response


@router.get(XCOM_PATH, response=rs.XComResponse)
def xcom_get(
    request: HttpRequest,
    dag_id: str,
    run_id: str,
    task_id: str,
    key: str,
    map_index: Int32 = -1,
    offset: Int32 | None = None,
    include_prior_dates: bool = False,
):
    task_scopes.check_xcom_read(auth.token_ti(request), dag_id=dag_id, run_id=run_id)
    value = xcoms.pull(
        dag_id=dag_id, run_id=run_id, task_id=task_id, key=key, map_index=map_index, offset=offset
    )
    return {"key": key, "value": value}


@router.post(XCOM_PATH, response={201: rs.OKMessage})
def xcom_set(
    request: HttpRequest,
    dag_id: str,
    run_id: str,
    task_id: str,
    key: str,
    value: Body[Any] = None,
    map_index: Int32 = -1,
    dag_result: bool = False,
    mapped_length: Int32 | None = None,
):
    task_scopes.check_xcom_write(
        auth.token_ti(request), dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=map_index
    )
    xcoms.push(
        dag_id=dag_id,
        run_id=run_id,
        task_id=task_id,
        key=key,
        value=value,
        map_index=map_index,
        mapped_length=mapped_length,
    )
    return Status(201, {"message": "XCom successfully set"})


@router.delete(XCOM_PATH, response=rs.OKMessage)
def xcom_delete(
    request: HttpRequest, dag_id: str, run_id: str, task_id: str, key: str, map_index: Int32 = -1
):
    task_scopes.check_xcom_write(
        auth.token_ti(request), dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=map_index
    )
    xcoms.delete(dag_id=dag_id, run_id=run_id, task_id=task_id, key=key, map_index=map_index)
    return {"message": f"XCom with key: {key} successfully deleted."}


# --- Variables and Connections ---------------------------------------------------------------


@router.get("/variables/keys", response=rs.VariableKeysResponse)
def variable_keys(
    request: HttpRequest, prefix: str | None = None, limit: Int32 = 1000, offset: Int32 = 0
):
    keys, total = variables.variable_keys(
        prefix=prefix, limit=max(1, min(limit, 10_000)), offset=max(0, offset)
    )
    return {"keys": keys, "total_entries": total}


@router.get("/variables/{path:variable_key}", response=rs.VariableResponse)
def variable_get(request: HttpRequest, variable_key: str):
    variable = variables.get_variable(key=variable_key)
    return {"key": variable.key, "value": variables.value_of(variable)}


@router.put("/variables/{path:variable_key}", response={201: rs.OKMessage})
def variable_put(request: HttpRequest, variable_key: str, body: rs.VariablePostBody):
    _require_running(request, "Variable write")
    variables.set_variable(
        key=variable_key,
        value=body.val,
        description=body.description,
        actor=auth.task_actor(request),
    )
    return Status(201, {"message": "Variable successfully set"})


@router.delete("/variables/{path:variable_key}", response={204: None})
def variable_delete(request: HttpRequest, variable_key: str):
    _require_running(request, "Variable delete")
    variables.delete_variable(key=variable_key, actor=auth.task_actor(request))
    return Status(204, None)


@router.get("/connections/{connection_id}", response=rs.ConnectionResponse, by_alias=True)
def connection_get(request: HttpRequest, connection_id: str):
    task_scopes.check_connection_read(auth.token_ti(request))
    return rs.ConnectionResponse.from_domain(variables.get_connection(conn_id=connection_id))


# --- dags and dag runs ---


@router.get("/dags/{dag_id}", response=rs.DagResponse)
def dag_detail(request: HttpRequest, dag_id: str):
    dag = task_runtime.get_dag(dag_id=dag_id)
    return {
        "dag_id": dag.dag_id,
        "is_paused": dag.is_paused,
        "bundle_name": BUNDLE_NAME,
        "bundle_version": None,
        "relative_fileloc": dag.fileloc or None,
        "owners": None,
        "tags": [],
        "next_dagrun": None,
    }


@router.get("/dag-runs/count")
def dag_run_count(request: HttpRequest, filters: Query[rs.DagRunCountFilters]):
    return _json(task_runtime.count_runs(**filters.model_dump()))


@router.get("/dag-runs/previous")
def dag_run_previous(
    request: HttpRequest, dag_id: str, logical_date: UtcDatetime, state: str | None = None
):
    run = task_runtime.previous_run(dag_id=dag_id, logical_date=logical_date, state=state)
    if run is None:
        return _json(None)
    return HttpResponse(
        rs.DagRunResponse.from_run(run).model_dump_json(), content_type="application/json"
    )


@router.get("/dag-runs/{dag_id}/{run_id}/state", response=rs.DagRunStateResponse)
def dag_run_state(request: HttpRequest, dag_id: str, run_id: str):
    return {"state": task_runtime.get_run(dag_id=dag_id, run_id=run_id).state}


@router.get("/dag-runs/{dag_id}/{run_id}", response=rs.DagRunResponse)
def dag_run_detail(request: HttpRequest, dag_id: str, run_id: str):
    return rs.DagRunResponse.from_run(task_runtime.get_run(dag_id=dag_id, run_id=run_id))


@router.post("/dag-runs/{dag_id}/{run_id}/clear", response={204: None})
def dag_run_clear(request: HttpRequest, dag_id: str, run_id: str):
    _require_running(request, "Clearing a Dag run")
    task_runtime.clear_run(dag_id=dag_id, run_id=run_id, actor=auth.task_actor(request))
    return Status(204, None)


@router.post("/dag-runs/{dag_id}/{run_id}", response={204: None})
def dag_run_trigger(
    request: HttpRequest, dag_id: str, run_id: str, payload: rs.TriggerDAGRunPayload
):
    _require_running(request, "Triggering a Dag run")
    task_runtime.trigger_from_task(
        ti_id=UUID(auth.claims_of(request)["sub"]),
        dag_id=dag_id,
        run_id=run_id,
        conf=payload.conf,
        logical_date=payload.logical_date,
        run_after=payload.run_after,
        note=payload.note,
        actor=auth.task_actor(request),
    )
    return Status(204, None)
