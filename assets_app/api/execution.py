"""Worker API (DESIGN 6.1), mounted at /execution/: thin views over `task_state`.

Wire-compatible with Airflow 3's Task Execution API (version 2026-06-30) for the endpoints below;
the `Airflow-API-Version` request header is accepted and ignored. A path id that is not a UUID is
a 422 (`validation_error`), like any other invalid parameter.
"""

from uuid import UUID

from django.http import HttpRequest, HttpResponse
from ninja import Body, Query, Router

from assets_app.catalog import asset_events
from assets_app.definitions import sources
from assets_app.definitions import sync as definitions
from assets_app.models import TIState
from assets_app.runtime import logs as task_logs
from assets_app.task_state import (
    claims,
    dag_callbacks,
    deferral,
    finishing,
    hitl,
    liveness,
    retries,
    starting,
    success,
)

from . import auth, schemas

router = Router(tags=["execution"])

TI_PATH = "/task-instances/{task_instance_id}"


@router.patch(f"{TI_PATH}/run", auth=auth.task_token, response=schemas.TIRunContext)
def ti_run(
    request: HttpRequest,
    task_instance_id: UUID,
    payload: schemas.TIEnterRunningPayload,
    response: HttpResponse,
):
    context = starting.start(
        ti_id=task_instance_id,
        try_number=auth.try_of(auth.claims_of(request)),
        hostname=payload.hostname,
        unixname=payload.unixname,
        pid=payload.pid,
        start_date=payload.start_date,
    )
    response["Refreshed-API-Token"] = auth.issue_token(
        task_instance_id, try_number=context.ti.try_number
    )
    # Encoded once without the model: `response=` documents it, but validating thousands of
    # consumed events through it on the way out cost more than the rest of the request.
    response.content = schemas.TIRunContext.render(context)
    return response


@router.patch(f"{TI_PATH}/state", auth=auth.task_token)
def ti_update_state(
    request: HttpRequest,
    task_instance_id: UUID,
    payload: Body[schemas.TIStateUpdate],
):
    try_number = auth.try_of(auth.claims_of(request))
    if isinstance(payload, schemas.TISuccessStatePayload):
        change = success.succeed(
            ti_id=task_instance_id,
            try_number=try_number,
            end_date=payload.end_date,
            task_outlets=payload.task_outlets or [],
            outlet_events=list(payload.outlet_events or ()),
        )
    elif isinstance(payload, schemas.TIReschedulePayload):
        change = retries.reschedule(
            ti_id=task_instance_id,
            try_number=try_number,
            reschedule_date=payload.reschedule_date,
            end_date=payload.end_date,
        )
    elif isinstance(payload, schemas.TIDeferredStatePayload):
        change = deferral.defer(
            ti_id=task_instance_id,
            try_number=try_number,
            classpath=payload.classpath,
            trigger_kwargs=payload.trigger_kwargs,
            trigger_timeout=payload.trigger_timeout,
            queue=payload.queue,
            next_method=payload.next_method,
            next_kwargs=payload.next_kwargs,
        )
    elif isinstance(payload, schemas.TIAwaitingInputStatePayload):
        change = hitl.await_input(
            ti_id=task_instance_id,
            try_number=try_number,
            next_method=payload.next_method,
            next_kwargs=payload.next_kwargs or {},
            timeout=payload.timeout,
        )
    elif isinstance(payload, schemas.TIRetryStatePayload):
        change = retries.retry(
            ti_id=task_instance_id,
            try_number=try_number,
            end_date=payload.end_date,
            retry_delay_seconds=payload.retry_delay_seconds,
        )
    else:
        change = finishing.finish(
            ti_id=task_instance_id,
            try_number=try_number,
            state=TIState(payload.state),
            end_date=payload.end_date,
        )
    return HttpResponse(status=200 if change.replayed else 204)


@router.put(f"{TI_PATH}/heartbeat", auth=auth.task_token)
def ti_heartbeat(request: HttpRequest, task_instance_id: UUID, payload: schemas.TIHeartbeatInfo):
    try_number = auth.try_of(auth.claims_of(request))
    liveness.heartbeat(
        ti_id=task_instance_id, try_number=try_number, hostname=payload.hostname, pid=payload.pid
    )
    response = HttpResponse(status=204)
    response["Refreshed-API-Token"] = auth.issue_token(task_instance_id, try_number=try_number)
    return response


@router.patch(f"{TI_PATH}/skip-downstream", auth=auth.task_token)
def ti_skip_downstream(
    request: HttpRequest,
    task_instance_id: UUID,
    payload: schemas.TISkippedDownstreamTasksStatePayload,
):
    tasks = [(t, -1) if isinstance(t, str) else (t[0], t[1]) for t in payload.tasks]
    finishing.skip_downstream(
        ti_id=task_instance_id, try_number=auth.try_of(auth.claims_of(request)), tasks=tasks
    )
    return HttpResponse(status=204)


@router.post(
    "/workloads/claim",
    auth=auth.worker_api_key,
    response=schemas.ClaimResponse,
    exclude_none=True,
)
def claim_workloads(request: HttpRequest, payload: schemas.ClaimRequest):
    workloads = claims.claim_workloads(
        hostname=payload.hostname,
        limit=payload.limit,
        queues=payload.queues,
        bundles=payload.bundles,
    )
    return schemas.ClaimResponse.from_domain(
        workloads, token_for=lambda ti: auth.issue_token(ti.id, try_number=ti.try_number)
    )


@router.post("/triggers/claim", auth=auth.worker_api_key, response=schemas.TriggerClaimResponse)
def claim_triggers(request: HttpRequest, payload: schemas.TriggerClaimRequest):
    """A triggerer's claim (our own endpoint, issue 42): renew its leases, lease it more."""
    claim = deferral.claim_triggers(
        triggerer=payload.triggerer,
        limit=payload.limit,
        held=payload.held,
        queues=payload.queues,
    )
    return schemas.TriggerClaimResponse.from_domain(
        claim, token_for=lambda ti: auth.issue_token(ti.id, try_number=ti.try_number)
    )


@router.post(
    "/triggers/{trigger_id}/event",
    auth=auth.worker_api_key,
    response=schemas.TriggerReportResponse,
)
def trigger_event(request: HttpRequest, trigger_id: int, payload: schemas.TriggerEventPayload):
    resumed = deferral.resume_with_event(trigger_id=trigger_id, payload=payload.payload)
    return schemas.TriggerReportResponse(resumed=resumed)


@router.post(
    "/triggers/{trigger_id}/failure",
    auth=auth.worker_api_key,
    response=schemas.TriggerReportResponse,
)
def trigger_failure(request: HttpRequest, trigger_id: int, payload: schemas.TriggerFailurePayload):
    resumed = deferral.resume_with_failure(trigger_id=trigger_id, traceback=payload.traceback)
    return schemas.TriggerReportResponse(resumed=resumed)


@router.post(
    "/triggers/{trigger_id}/end", auth=auth.worker_api_key, response=schemas.TriggerEndResponse
)
def trigger_end(request: HttpRequest, trigger_id: int, payload: schemas.TriggerEndPayload):
    state = deferral.end_from_trigger(
        trigger_id=trigger_id, state=payload.state, xcoms=payload.xcoms
    )
    return schemas.TriggerEndResponse(state=state)


@router.post("/dag-callbacks/claim", auth=auth.worker_api_key)
def claim_dag_callbacks(request: HttpRequest, payload: schemas.DagCallbackClaimRequest):
    """Dag callback requests leased to a worker (our own endpoint, issue 39)."""
    claimed = dag_callbacks.claim(claimed_by=payload.hostname, limit=payload.limit)
    return HttpResponse(schemas.render_dag_callbacks(claimed), content_type="application/json")


@router.post(
    "/dag-callbacks/{request_id}/report",
    auth=auth.worker_api_key,
    response=schemas.DagCallbackReportResponse,
)
def report_dag_callback(request: HttpRequest, request_id: int, payload: schemas.DagCallbackReport):
    """How a claimed request's callbacks went; a replay answers `replayed` (issue 39)."""
    reported = dag_callbacks.report(
        request_id=request_id, attempt=payload.attempt, state=payload.state, error=payload.error
    )
    return {"state": reported.state, "replayed": reported.replayed}


@router.post("/dags/sync", auth=auth.dag_sync, response=schemas.DagSyncResponse)
def sync_dag_files(request: HttpRequest, payload: schemas.DagSyncRequest):
    """Definitions converted from Airflow DAG files (`bin/airflow-worker`), synced with
    `sync_dags`' validation and idempotency; the deploy key or a token with add/change_dag."""
    result = definitions.sync_documents(
        documents=[(f.file, f.definitions) for f in payload.files],
        apply_pause=payload.apply_pause,
        bundle_name=payload.bundle_name,
        actor=request.auth,  # type: ignore[attr-defined]
        import_errors=None
        if payload.import_errors is None
        else [
            definitions.ImportErrorReport(filename=e.file, stack_trace=e.error)
            for e in payload.import_errors
        ],
        file_sources=[
            sources.cut(f.file, f.source, size=f.source_size)
            for f in payload.files
            if f.source is not None
        ],
    )
    return {
        **{k: getattr(result, k) for k in schemas.DagSyncResponse.model_fields if k != "summary"},
        "import_errors": None if result.import_errors is None else list(result.import_errors),
        "summary": result.summary(),
    }


@router.put(
    f"{TI_PATH}/logs/{{try_number}}",
    auth=auth.worker_api_key,
    response=schemas.TaskLogChunkResponse,
)
def put_task_log_chunk(
    request: HttpRequest, task_instance_id: UUID, try_number: int, payload: schemas.TaskLogChunk
):
    """A chunk of one try's log file (bin/airflow-worker ships it while the task runs and when
    it ends); idempotent by (TI, try, offset)."""
    appended = task_logs.append_chunk(
        ti_id=task_instance_id,
        try_number=try_number,
        offset=payload.offset,
        content=payload.content,
    )
    return {"stored_bytes": appended.stored_bytes, "duplicate": appended.duplicate}


@router.get("/assets/by-name", auth=auth.task_token, response=schemas.AssetResponse)
def asset_by_name(request: HttpRequest, name: str):
    return schemas.AssetResponse.from_asset(asset_events.get_asset(name=name))


@router.get("/assets/by-uri", auth=auth.task_token, response=schemas.AssetResponse)
def asset_by_uri(request: HttpRequest, uri: str):
    return schemas.AssetResponse.from_asset(asset_events.get_asset(uri=uri))


@router.get("/assets/by-alias", auth=auth.task_token, response=list[schemas.AssetResponse])
def assets_by_alias(request: HttpRequest, alias_name: str):
    return [
        schemas.AssetResponse.from_asset(a)
        for a in asset_events.assets_of_alias(alias_name=alias_name)
    ]


@router.get("/asset-events/by-asset", auth=auth.task_token, response=schemas.AssetEventsResponse)
def asset_events_by_asset(
    request: HttpRequest,
    window: Query[schemas.AssetEventWindow],
    name: str | None = None,
    uri: str | None = None,
):
    events = asset_events.events_of_asset(name=name, uri=uri, **window.model_dump())
    return schemas.AssetEventsResponse.from_events(events)


@router.get(
    "/asset-events/by-asset-alias", auth=auth.task_token, response=schemas.AssetEventsResponse
)
def asset_events_by_alias(request: HttpRequest, name: str, window: Query[schemas.AssetEventWindow]):
    events = asset_events.events_of_alias(alias_name=name, **window.model_dump())
    return schemas.AssetEventsResponse.from_events(events)
