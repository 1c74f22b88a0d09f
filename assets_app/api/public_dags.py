"""Public API (`/api/v2/`): Dags, Dag runs and task instances, with the paths, parameters and
shapes of Airflow 3.3.2's public API. Same rules as `public.py`: token or staff session, one
`@needs` permission per view, thin views over `dags`, `run_reads` and `runs`.

Routes with a fixed segment (`dagRuns/list`, `taskInstances/list`, `.../{task_id}/tries`,
`/links`, `/dry_run`, `/listMapped`) are registered before the ones whose variable segment
(`{map_index}`) would also match them. Deletes (a Dag, a run, a TI) go through retention's
deleter (`operations.retention`), state changes through `scheduling.run_states`.
"""

import json
from typing import Any, Literal

from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from ninja import Field, Header, Path, Query, Router, Schema, Status

from assets_app.catalog import asset_events, dags, run_reads, run_waits
from assets_app.guards import exceptions
from assets_app.models import Dag, DagImportError, DagRun, DagRunTriggeredBy, TaskInstance
from assets_app.models.runs import TI_FINISHED_STATES
from assets_app.operations import retention
from assets_app.runtime import logs as task_logs
from assets_app.scheduling import run_states, runs

from . import public_auth
from .public import Page, actor_of
from .public_auth import public_api_auth
from .public_permissions import needs
from .public_schemas import (
    AssetEventCollectionResponse,
    AssetEventResponse,
    ClearTaskInstanceCollectionResponse,
    DAGCollectionResponse,
    DAGDetailsResponse,
    DAGPatchBody,
    DAGResponse,
    DAGRunClearBody,
    DAGRunCollectionResponse,
    DAGRunPatchBody,
    DAGRunResponse,
    DAGRunsBatchBody,
    ExtraLinkCollectionResponse,
    ImportErrorCollectionResponse,
    ImportErrorResponse,
    NewTaskResponse,
    PatchTaskInstanceBody,
    RunRanges,
    TaskCollectionResponse,
    TaskInstanceCollectionResponse,
    TaskInstanceHistoryCollectionResponse,
    TaskInstanceHistoryResponse,
    TaskInstanceResponse,
    TaskInstancesBatchBody,
    TaskInstancesLogResponse,
    TaskResponse,
    TriggerDagRunBody,
    responses,
)
from .schemas import INT32_MAX, UtcDatetime

router = Router(tags=["public"], auth=public_api_auth())

# `wait` polls the run at most this often, whatever `interval` asks.
MIN_WAIT_INTERVAL_SECONDS = 0.1
NDJSON = "application/x-ndjson"


# --- query parameters -----------------------------------------------------------------------


class DagFilters(Page):
    tags: list[str] = Field(default_factory=list)
    tags_match_mode: str | None = Field(default=None, pattern="^(any|all)$")
    owners: list[str] = Field(default_factory=list)
    dag_id_pattern: str | None = None
    dag_id_prefix_pattern: str | None = None
    dag_display_name_pattern: str | None = None
    dag_display_name_prefix_pattern: str | None = None
    exclude_stale: bool = True
    paused: bool | None = None
    has_import_errors: bool | None = None
    last_dag_run_state: str | None = Field(
        default=None, pattern="^(queued|running|success|failed)$"
    )
    bundle_name: str | None = None
    bundle_version: str | None = None
    has_asset_schedule: bool | None = None
    asset_dependency: str | None = None
    dag_run_start_date_gte: UtcDatetime | None = None
    dag_run_start_date_gt: UtcDatetime | None = None
    dag_run_start_date_lte: UtcDatetime | None = None
    dag_run_start_date_lt: UtcDatetime | None = None
    dag_run_end_date_gte: UtcDatetime | None = None
    dag_run_end_date_gt: UtcDatetime | None = None
    dag_run_end_date_lte: UtcDatetime | None = None
    dag_run_end_date_lt: UtcDatetime | None = None
    dag_run_state: list[str] = Field(default_factory=list)
    is_favorite: bool | None = None
    timetable_type: list[str] = Field(default_factory=list)

    def domain(self, *, user_id: int | None) -> dags.DagFilters:
        values = self.dict(exclude={"limit", "offset", "order_by", "exclude_stale"})
        return dags.DagFilters(**values, user_id=user_id)


class PatchDagsFilters(Schema):
    update_mask: list[str] = Field(default_factory=list)
    limit: int = Field(default=50, ge=0, le=2**31 - 1)
    offset: int = Field(default=0, ge=0, le=2**31 - 1)
    tags: list[str] = Field(default_factory=list)
    tags_match_mode: str | None = Field(default=None, pattern="^(any|all)$")
    owners: list[str] = Field(default_factory=list)
    dag_id_pattern: str | None = None
    dag_id_prefix_pattern: str | None = None
    exclude_stale: bool = True
    paused: bool | None = None


class UpdateMask(Schema):
    update_mask: list[str] = Field(default_factory=list)


class _Ranges(RunRanges):
    """The list query parameters' ranges: the batch bodies' and `updated_at`."""

    updated_at_gte: UtcDatetime | None = None
    updated_at_gt: UtcDatetime | None = None
    updated_at_lte: UtcDatetime | None = None
    updated_at_lt: UtcDatetime | None = None


class RunFilters(Page, _Ranges):
    cursor: str | None = None
    partition_date_gte: str | None = None
    partition_date_lte: str | None = None
    conf_contains: str | None = None
    run_type: list[str] = Field(default_factory=list)
    state: list[str] = Field(default_factory=list)
    dag_version: list[int] = Field(default_factory=list)
    bundle_version: str | None = None
    run_id_pattern: str | None = None
    run_id_prefix_pattern: str | None = None
    triggering_user_name_pattern: str | None = None
    triggering_user_name_prefix_pattern: str | None = None
    dag_id_pattern: str | None = None
    dag_id_prefix_pattern: str | None = None
    partition_key_pattern: str | None = None
    partition_key_prefix_pattern: str | None = None
    consuming_asset_pattern: str | None = None

    def domain(self) -> run_reads.RunFilters:
        return run_reads.RunFilters(**self.dict(exclude={"limit", "offset", "order_by", "cursor"}))


class TIFilters(Page, _Ranges):
    cursor: str | None = None
    task_id: str | None = None
    task_display_name_pattern: str | None = None
    task_display_name_prefix_pattern: str | None = None
    task_group_id: str | None = None
    dag_id_pattern: str | None = None
    dag_id_prefix_pattern: str | None = None
    run_id_pattern: str | None = None
    run_id_prefix_pattern: str | None = None
    state: list[str] = Field(default_factory=list)
    pool: list[str] = Field(default_factory=list)
    pool_name_pattern: str | None = None
    pool_name_prefix_pattern: str | None = None
    queue: list[str] = Field(default_factory=list)
    queue_name_pattern: str | None = None
    queue_name_prefix_pattern: str | None = None
    executor: list[str] = Field(default_factory=list)
    version_number: list[int] = Field(default_factory=list)
    try_number: list[int] = Field(default_factory=list)
    operator: list[str] = Field(default_factory=list)
    operator_name_pattern: str | None = None
    operator_name_prefix_pattern: str | None = None
    map_index: list[int] = Field(default_factory=list)
    rendered_map_index_pattern: str | None = None
    rendered_map_index_prefix_pattern: str | None = None

    def domain(self) -> run_reads.TIFilters:
        return run_reads.TIFilters(**self.dict(exclude={"limit", "offset", "order_by", "cursor"}))


class WaitQuery(Schema):
    interval: float = Field(gt=0, le=3600)
    result: list[str] = Field(default_factory=list)


def _check_update_mask(update_mask: list[str]) -> None:
    if update_mask and update_mask != ["is_paused"]:
        raise exceptions.BadRequest(
            "Only `is_paused` field can be updated through the REST API",
            reason="invalid_update_mask",
        )


def _dag_collection(page) -> DAGCollectionResponse:
    return DAGCollectionResponse(
        dags=[DAGResponse.from_dag(dag) for dag in page.rows], total_entries=page.total_entries
    )


def _run_collection(page) -> DAGRunCollectionResponse:
    versions = dags.versions_of_runs(page.rows)
    return DAGRunCollectionResponse(
        dag_runs=[DAGRunResponse.from_run(run, versions=versions) for run in page.rows],
        total_entries=page.total_entries,
        total_entries_limit=page.total_entries_limit,
        next_cursor=page.next_cursor,
        previous_cursor=page.previous_cursor,
    )


def _ti_collection(page) -> TaskInstanceCollectionResponse:
    return TaskInstanceCollectionResponse(
        task_instances=[TaskInstanceResponse.from_ti(ti) for ti in page.rows],
        total_entries=page.total_entries,
        total_entries_limit=page.total_entries_limit,
        next_cursor=page.next_cursor,
        previous_cursor=page.previous_cursor,
    )


# --- Dags -----------------------------------------------------------------------------------


@router.get("/dags", response=responses(DAGCollectionResponse), url_name="dags")
@needs("view", Dag)
def get_dags(request: HttpRequest, filters: Query[DagFilters]) -> DAGCollectionResponse:
    """Dags, filtered and paged (Airflow: `GET /api/v2/dags`)."""
    page = dags.list_dags(
        filters=filters.domain(user_id=public_auth.user_of(request).pk),
        order_by=filters.order_by,
        limit=filters.limit,
        offset=filters.offset,
    )
    return _dag_collection(page)


@router.patch("/dags", response=responses(DAGCollectionResponse, 400, 404))
@needs("change", Dag)
def patch_dags(
    request: HttpRequest, body: DAGPatchBody, filters: Query[PatchDagsFilters]
) -> DAGCollectionResponse:
    """Pause or unpause every Dag matching `dag_id_pattern` / `dag_id_prefix_pattern` (`~`: all;
    neither: none), as Airflow's `PATCH /api/v2/dags`; answers a page of them."""
    _check_update_mask(filters.update_mask)
    values = filters.dict(exclude={"update_mask", "limit", "offset", "exclude_stale"})
    page = dags.set_paused(
        is_paused=body.is_paused,
        filters=dags.DagFilters(**values),
        limit=filters.limit,
        offset=filters.offset,
        actor=actor_of(request),
    )
    return _dag_collection(page)


@router.get("/dags/{dag_id}/details", response=responses(DAGDetailsResponse, 400, 404))
@needs("view", Dag)
def get_dag_details(request: HttpRequest, dag_id: str) -> DAGDetailsResponse:
    """One Dag with Airflow's details (asset expression, active runs)."""
    dag = dags.get_dag(dag_id, details=True)
    liked = dags.is_favorite(dag_id=dag_id, user_id=public_auth.user_of(request).pk)
    return DAGDetailsResponse.from_dag(
        dag, is_favorite=liked, latest_version=dags.latest_version(dag_id)
    )


# Airflow's 201 is a JSON body of any shape (`null`), never sent here.
@router.put("/parseDagFile/{file_token}", response=responses(Any, 404, status=201))
@needs("change", Dag)
def reparse_dag_file(request: HttpRequest, file_token: str):
    """Airflow queues a re-parse of the file a `file_token` (signed by its api-server, handed out
    in a Dag's details) names, and answers 404 "File not found" for a token it did not sign. This
    service signs none (its `file_token` is ""): Dag files are parsed by the worker
    (`bin/airflow-worker --sync-only`, or on its own schedule), so every token is that 404, with
    the reason."""
    raise exceptions.NotFound(
        "File not found: this service hands out no file tokens; Dag files are parsed by the "
        "worker (bin/airflow-worker --sync-only re-parses them now)",
        reason="dag_file_not_found",
    )


@router.post("/dags/{dag_id}/favorite", response=responses(None, 404, 409, status=204))
@needs("view", Dag)
def favorite_dag(request: HttpRequest, dag_id: str):
    """Mark the Dag as the caller's favorite (Airflow: same path; Dag read access suffices)."""
    user = public_auth.user_of(request)
    dags.favorite_dag(dag_id=dag_id, user_id=user.pk, actor=actor_of(request))
    return Status(204, None)


@router.post("/dags/{dag_id}/unfavorite", response=responses(None, 404, 409, status=204))
@needs("view", Dag)
def unfavorite_dag(request: HttpRequest, dag_id: str):
    """Unmark it (409 when it is not one, as Airflow)."""
    user = public_auth.user_of(request)
    dags.unfavorite_dag(dag_id=dag_id, user_id=user.pk, actor=actor_of(request))
    return Status(204, None)


@router.get("/dags/{dag_id}", response=responses(DAGResponse, 400, 404), url_name="dag")
@needs("view", Dag)
def get_dag(request: HttpRequest, dag_id: str) -> DAGResponse:
    """One Dag, or 404 (Airflow: same path)."""
    return DAGResponse.from_dag(dags.get_dag(dag_id))


@router.patch("/dags/{dag_id}", response=responses(DAGResponse, 400, 404))
@needs("change", Dag)
def patch_dag(
    request: HttpRequest, dag_id: str, body: DAGPatchBody, mask: Query[UpdateMask]
) -> DAGResponse:
    """Pause or unpause a Dag (Airflow: `PATCH /api/v2/dags/{dag_id}`, `is_paused` only)."""
    _check_update_mask(mask.update_mask)
    page = dags.set_paused(is_paused=body.is_paused, dag_id=dag_id, actor=actor_of(request))
    return DAGResponse.from_dag(page.rows[0])


@router.delete("/dags/{dag_id}", response=responses(None, 400, 404, 409, status=204))
@needs("delete", Dag)
def delete_dag(request: HttpRequest, dag_id: str):
    """Delete a Dag with its runs and history (Airflow: same path; 204 as Airflow's route
    answers, 409 while a TI runs), by retention's deleter (`retention.delete_dag`)."""
    retention.delete_dag(dag_id=dag_id, actor=actor_of(request))
    return Status(204, None)


@router.get(
    "/dags/{dag_id}/tasks", response=responses(TaskCollectionResponse, 400, 404), by_alias=True
)
@needs("view", Dag)
def get_tasks(
    request: HttpRequest, dag_id: str, order_by: str = "task_id"
) -> TaskCollectionResponse:
    """A Dag's tasks (Airflow: `GET /api/v2/dags/{dag_id}/tasks`), sorted by `order_by`."""
    found = dags.get_tasks(dag_id, order_by=order_by)
    tasks = [TaskResponse.from_task(task, dag=found.dag) for task in found.tasks]
    return TaskCollectionResponse(tasks=tasks, total_entries=len(tasks))


@router.get(
    "/dags/{dag_id}/tasks/{task_id}", response=responses(TaskResponse, 400, 404), by_alias=True
)
@needs("view", Dag)
def get_task(request: HttpRequest, dag_id: str, task_id: str) -> TaskResponse:
    """One task of a Dag, or 404 (Airflow: same path)."""
    found = dags.get_tasks(dag_id, task_id=task_id)
    return TaskResponse.from_task(found.tasks[0], dag=found.dag)


# --- Dag runs -------------------------------------------------------------------------------


@router.post("/dags/{dag_id}/dagRuns/list", response=responses(DAGRunCollectionResponse, 400, 404))
@needs("view", DagRun)
def get_list_dag_runs_batch(
    request: HttpRequest, dag_id: str, body: DAGRunsBatchBody
) -> DAGRunCollectionResponse:
    """Runs filtered by a body (Airflow: `POST /api/v2/dags/~/dagRuns/list`; `dag_ids` for several
    Dags)."""
    values = body.dict(exclude={"order_by", "page_offset", "page_limit", "states"})
    filters = run_reads.RunFilters(
        **values, state=["none" if s is None else s for s in (body.states or [])]
    )
    page = run_reads.list_runs(
        dag_id=dag_id,
        filters=filters,
        order_by=[body.order_by] if body.order_by else None,
        limit=body.page_limit,
        offset=body.page_offset,
    )
    return _run_collection(page)


@router.get("/dags/{dag_id}/dagRuns", response=responses(DAGRunCollectionResponse, 400, 404))
@needs("view", DagRun)
def get_dag_runs(
    request: HttpRequest, dag_id: str, filters: Query[RunFilters]
) -> DAGRunCollectionResponse:
    """Runs of a Dag (`~`: of every Dag), filtered, ordered and paged by offset or by cursor
    (Airflow: same path)."""
    page = run_reads.list_runs(
        dag_id=dag_id,
        filters=filters.domain(),
        order_by=filters.order_by,
        limit=filters.limit,
        offset=filters.offset,
        cursor=filters.cursor,
    )
    return _run_collection(page)


@router.post(
    "/dags/{dag_id}/dagRuns",
    response=responses(DAGRunResponse, 400, 404, 409),
    url_name="trigger_dag_run",
)
@needs("add", DagRun)
def trigger_dag_run(request: HttpRequest, dag_id: str, body: TriggerDagRunBody) -> DAGRunResponse:
    """Trigger a manual run (Airflow: `POST /api/v2/dags/{dag_id}/dagRuns`)."""
    run = runs.trigger_dag(
        dag_id=dag_id,
        conf=body.conf,
        triggering_user_name=public_auth.user_of(request).get_username(),
        triggered_by=DagRunTriggeredBy.REST_API,
        run_id=body.dag_run_id,
        run_after=body.run_after,
        logical_date=body.logical_date,
        data_interval_start=body.data_interval_start,
        data_interval_end=body.data_interval_end,
        note=body.note,
        actor=actor_of(request),
    )
    return DAGRunResponse.from_run(run)


@router.get(
    "/dags/{dag_id}/dagRuns/{dag_run_id}/upstreamAssetEvents",
    response=responses(AssetEventCollectionResponse, 404),
)
@needs("view", DagRun)
def get_upstream_asset_events(
    request: HttpRequest, dag_id: str, dag_run_id: str
) -> AssetEventCollectionResponse:
    """The asset events a run consumed (Airflow: same path)."""
    events = asset_events.events_consumed_by_run(dag_id=dag_id, run_id=dag_run_id)
    return AssetEventCollectionResponse(
        asset_events=[AssetEventResponse.from_event(e) for e in events],
        total_entries=len(events),
    )


@router.post(
    "/dags/{dag_id}/dagRuns/{dag_run_id}/clear",
    response=responses(ClearTaskInstanceCollectionResponse | DAGRunResponse, 404, 409),
)
@needs("change", DagRun)
def clear_dag_run(request: HttpRequest, dag_id: str, dag_run_id: str, body: DAGRunClearBody):
    """Clear a run (Airflow: same path): with `dry_run` (the default) the TIs it would clear (or,
    with `only_new`, the new tasks), else the run, queued again with new tries."""
    result = runs.clear_dag_run(
        dag_id=dag_id,
        run_id=dag_run_id,
        dry_run=body.dry_run,
        only_failed=body.only_failed,
        only_new=body.only_new,
        note=body.note,
        actor=actor_of(request),
    )
    if body.dry_run:
        items: list = [TaskInstanceResponse.from_ti(ti) for ti in result.task_instances]
        items += [NewTaskResponse(task_id=t, task_display_name=t) for t in result.new_task_ids]
        return ClearTaskInstanceCollectionResponse(task_instances=items, total_entries=len(items))
    return DAGRunResponse.from_run(result.run)


@router.get(
    "/dags/{dag_id}/dagRuns/{dag_run_id}/wait",
    response=responses(str, 404, 503),
    openapi_extra={
        "responses": {
            200: {
                "description": (
                    "The run's state, one JSON object a line (NDJSON), until it ends or for at "
                    "most RUN_WAIT_MAX_SECONDS (the last line is then an unfinished state)"
                ),
                "content": {NDJSON: {"schema": {"type": "string"}}},
            }
        }
    },
)
@needs("view", DagRun)
def wait_dag_run_until_finished(
    request: HttpRequest, dag_id: str, dag_run_id: str, query: Query[WaitQuery]
) -> StreamingHttpResponse:
    """Stream `{"state": ...}` lines, one now and one every `interval` seconds, until the run is
    success or failed (Airflow: same path, NDJSON), or the server's cap ends the stream early
    (`run_waits`). The service keeps no XCom results, so no line has `results`. 404 for an
    unknown run; 503 `too_many_waits` with Retry-After when this server streams its maximum."""
    wait = run_waits.open_wait(
        dag_id=dag_id, run_id=dag_run_id, interval=max(query.interval, MIN_WAIT_INTERVAL_SECONDS)
    )
    return StreamingHttpResponse(wait, content_type=NDJSON)


@router.patch("/dags/{dag_id}/dagRuns/{dag_run_id}", response=responses(DAGRunResponse, 400, 404))
@needs("change", DagRun)
def patch_dag_run(
    request: HttpRequest,
    dag_id: str,
    dag_run_id: str,
    body: DAGRunPatchBody,
    mask: Query[UpdateMask],
) -> DAGRunResponse:
    """Change a run's state or note (Airflow: same path): the body's fields, only those
    `update_mask` names when it is given (`run_states.patch_dag_run`)."""
    fields = body.model_fields_set
    if mask.update_mask:
        fields = fields & set(mask.update_mask)
    patched = run_states.patch_dag_run(
        dag_id=dag_id,
        run_id=dag_run_id,
        state=body.state,
        note=body.note,
        fields=frozenset(fields),
        actor=actor_of(request),
    )
    return DAGRunResponse.from_run(patched.run)


@router.delete(
    "/dags/{dag_id}/dagRuns/{dag_run_id}", response=responses(None, 400, 404, 409, status=204)
)
@needs("delete", DagRun)
def delete_dag_run(request: HttpRequest, dag_id: str, dag_run_id: str):
    """Delete a queued or finished run with its TIs and history (Airflow: same path; 409 for a
    running run), by retention's deleter (`retention.delete_dag_run`)."""
    retention.delete_dag_run(dag_id=dag_id, run_id=dag_run_id, actor=actor_of(request))
    return Status(204, None)


@router.get("/dags/{dag_id}/dagRuns/{dag_run_id}", response=responses(DAGRunResponse, 404))
@needs("view", DagRun)
def get_dag_run(request: HttpRequest, dag_id: str, dag_run_id: str) -> DAGRunResponse:
    """One run, or 404 (Airflow: same path)."""
    return DAGRunResponse.from_run(run_reads.get_run(dag_id=dag_id, run_id=dag_run_id))


# --- task instances -------------------------------------------------------------------------


@router.post(
    "/dags/{dag_id}/dagRuns/{dag_run_id}/taskInstances/list",
    response=responses(TaskInstanceCollectionResponse, 400, 404),
)
@needs("view", TaskInstance)
def get_task_instances_batch(
    request: HttpRequest, dag_id: str, dag_run_id: str, body: TaskInstancesBatchBody
) -> TaskInstanceCollectionResponse:
    """Task instances filtered by a body (Airflow: same path, usually with `~` / `~`)."""
    values = body.dict(
        exclude={"order_by", "page_offset", "page_limit", "pool", "queue", "executor", "state"}
    )
    filters = run_reads.TIFilters(
        **values,
        state=body.state or (),
        pool=body.pool or (),
        queue=body.queue or (),
        executor=body.executor or (),
    )
    page = run_reads.list_task_instances(
        dag_id=dag_id,
        run_id=dag_run_id,
        filters=filters,
        order_by=[body.order_by] if body.order_by else None,
        limit=body.page_limit,
        offset=body.page_offset,
    )
    return _ti_collection(page)


@router.get(
    "/dags/{dag_id}/dagRuns/{dag_run_id}/taskInstances",
    response=responses(TaskInstanceCollectionResponse, 400, 404),
)
@needs("view", TaskInstance)
def get_task_instances(
    request: HttpRequest, dag_id: str, dag_run_id: str, filters: Query[TIFilters]
) -> TaskInstanceCollectionResponse:
    """Task instances of a run (`~` for every run / Dag), filtered, ordered and paged by offset
    or by cursor (Airflow: same path)."""
    page = run_reads.list_task_instances(
        dag_id=dag_id,
        run_id=dag_run_id,
        filters=filters.domain(),
        order_by=filters.order_by,
        limit=filters.limit,
        offset=filters.offset,
        cursor=filters.cursor,
    )
    return _ti_collection(page)


class ExternalLogUrlResponse(Schema):
    url: str


@router.get(
    "/dags/{dag_id}/dagRuns/{dag_run_id}/taskInstances/{task_id}/externalLogUrl/{try_number}",
    response=responses(ExternalLogUrlResponse, 400, 404),
)
@needs("view", TaskInstance)
def get_external_log_url(
    request: HttpRequest,
    dag_id: str,
    dag_run_id: str,
    task_id: str,
    try_number: int = Path(..., gt=0),
    map_index: int = Query(-1, ge=-1, le=INT32_MAX),
):
    """Airflow answers 400 before looking the task instance up when its task log handler has no
    external links (its default file handler has none); here logs are stored in the database
    (`runtime.logs`), never in an external system: always that 400, with Airflow's message."""
    raise exceptions.BadRequest(
        "Task log handler does not support external logs.", reason="no_external_logs"
    )


@router.get(
    "/dags/{dag_id}/dagRuns/{dag_run_id}/taskInstances/{task_id}/logs/{try_number}",
    response=responses(TaskInstancesLogResponse, 400, 404),
)
@needs("view", TaskInstance)
def get_task_instance_log(
    request: HttpRequest,
    dag_id: str,
    dag_run_id: str,
    task_id: str,
    try_number: int,
    full_content: bool = False,
    map_index: int = -1,
    token: str | None = None,
    accept: Header[
        Literal["application/json", "text/plain", "application/x-ndjson", "*/*"]
    ] = "*/*",
):
    """One try's log as the worker shipped it (Airflow: same path, params and shape). JSON,
    except for `Accept: application/x-ndjson` (Airflow's UI asks for it): each structured
    message on a line of its own (Airflow's `read_log_stream`), the continuation token in the
    `Airflow-Continuation-Token` header while the log may grow."""
    ti = run_reads.get_task_instance(
        dag_id=dag_id, run_id=dag_run_id, task_id=task_id, map_index=map_index
    )
    # Airflow reads the TI at `try_number` or its history: a TI that never ran (try 0) has an
    # empty log at try 0, any other TI its tries 1..try_number.
    if try_number != ti.try_number and not 1 <= try_number <= ti.try_number:
        raise exceptions.NotFound(
            f"TaskInstance {dag_id}.{task_id} of run {dag_run_id} has no try {try_number}",
            reason="task_instance_not_found",
        )
    start = task_logs.position_of(token) if token and not full_content else 0
    text, end = task_logs.read(ti_id=ti.id, try_number=try_number, from_byte=start)
    finished = try_number < ti.try_number or ti.state in TI_FINISHED_STATES
    if accept == NDJSON:
        lines = "".join(
            json.dumps(message, separators=(",", ":")) + "\n"
            for message in task_logs.structured(text)
        )
        answer = HttpResponse(lines, content_type=NDJSON)
        if not finished:
            answer["Airflow-Continuation-Token"] = task_logs.continuation_token(
                end, end_of_log=False
            )
        return answer
    return {
        "content": task_logs.structured(text),
        "continuation_token": task_logs.continuation_token(end, end_of_log=finished),
    }


TI_PATH = "/dags/{dag_id}/dagRuns/{dag_run_id}/taskInstances/{task_id}"


def _tries(tis) -> TaskInstanceHistoryCollectionResponse:
    return TaskInstanceHistoryCollectionResponse(
        task_instances=[TaskInstanceHistoryResponse.from_ti(ti) for ti in tis],
        total_entries=len(tis),
    )


@router.get(TI_PATH + "/tries", response=responses(TaskInstanceHistoryCollectionResponse, 404))
@needs("view", TaskInstance)
def get_task_instance_tries(
    request: HttpRequest,
    dag_id: str,
    dag_run_id: str,
    task_id: str,
    map_index: int = Query(-1, ge=-1, le=INT32_MAX),
) -> TaskInstanceHistoryCollectionResponse:
    """A TI's tries (Airflow: same path): the current one, as earlier tries are not kept."""
    return _tries(
        run_reads.task_instance_tries(
            dag_id=dag_id, run_id=dag_run_id, task_id=task_id, map_index=map_index
        )
    )


@router.get(
    TI_PATH + "/tries/{task_try_number}", response=responses(TaskInstanceHistoryResponse, 404)
)
@needs("view", TaskInstance)
def get_task_instance_try_details(
    request: HttpRequest,
    dag_id: str,
    dag_run_id: str,
    task_id: str,
    task_try_number: int,
    map_index: int = Query(-1, ge=-1, le=INT32_MAX),
) -> TaskInstanceHistoryResponse:
    """One try of a TI (Airflow: same path): the current try; an earlier one is a 404 saying
    it is not kept."""
    ti = run_reads.task_instance_try(
        dag_id=dag_id,
        run_id=dag_run_id,
        task_id=task_id,
        try_number=task_try_number,
        map_index=map_index,
    )
    return TaskInstanceHistoryResponse.from_ti(ti)


@router.get(
    TI_PATH + "/{map_index}/tries", response=responses(TaskInstanceHistoryCollectionResponse, 404)
)
@needs("view", TaskInstance)
def get_mapped_task_instance_tries(
    request: HttpRequest, dag_id: str, dag_run_id: str, task_id: str, map_index: int
) -> TaskInstanceHistoryCollectionResponse:
    """A mapped TI's tries (Airflow: same path)."""
    return get_task_instance_tries(request, dag_id, dag_run_id, task_id, map_index)


@router.get(
    TI_PATH + "/{map_index}/tries/{task_try_number}",
    response=responses(TaskInstanceHistoryResponse, 404),
)
@needs("view", TaskInstance)
def get_mapped_task_instance_try_details(
    request: HttpRequest,
    dag_id: str,
    dag_run_id: str,
    task_id: str,
    map_index: int,
    task_try_number: int,
) -> TaskInstanceHistoryResponse:
    """One try of a mapped TI (Airflow: same path)."""
    return get_task_instance_try_details(
        request, dag_id, dag_run_id, task_id, task_try_number, map_index
    )


@router.get(TI_PATH + "/links", response=responses(ExtraLinkCollectionResponse, 404))
@needs("view", TaskInstance)
def get_extra_links(
    request: HttpRequest,
    dag_id: str,
    dag_run_id: str,
    task_id: str,
    map_index: int = Query(-1, ge=-1, le=INT32_MAX),
    try_number: int | None = Query(None, ge=0, le=INT32_MAX),
) -> ExtraLinkCollectionResponse:
    """A TI's operator extra links (Airflow: same path): none, as no task here declares any."""
    links = run_reads.extra_links(
        dag_id=dag_id,
        run_id=dag_run_id,
        task_id=task_id,
        map_index=map_index,
        try_number=try_number,
    )
    return ExtraLinkCollectionResponse(extra_links=links, total_entries=len(links))


@router.delete(
    TI_PATH,
    response=responses(None, 404, 409, status=200),
    openapi_extra={
        "responses": {
            200: {
                "description": "Successful Response (a null body, as Airflow's route answers)",
                "content": {"application/json": {"schema": {}}},
            }
        }
    },
)
@needs("delete", TaskInstance)
def delete_task_instance(
    request: HttpRequest,
    dag_id: str,
    dag_run_id: str,
    task_id: str,
    map_index: int = Query(-1, ge=-1, le=INT32_MAX),
):
    """Delete a TI with its history (Airflow: same path, 200 with a null body as its route
    answers), by retention's deleter (`retention.delete_task_instance`); 409 (ours) for a
    running one."""
    retention.delete_task_instance(
        dag_id=dag_id,
        run_id=dag_run_id,
        task_id=task_id,
        map_index=map_index,
        actor=actor_of(request),
    )
    return HttpResponse(b"null", content_type="application/json")


@router.get(
    "/dags/{dag_id}/dagRuns/{dag_run_id}/taskInstances/{task_id}/listMapped",
    response=responses(TaskInstanceCollectionResponse, 400, 404),
)
@needs("view", TaskInstance)
def get_mapped_task_instances(
    request: HttpRequest, dag_id: str, dag_run_id: str, task_id: str, filters: Query[TIFilters]
) -> TaskInstanceCollectionResponse:
    """A mapped task's map indexes in one run, filtered, ordered (by map_index unless asked)
    and paged by offset (Airflow: same path)."""
    page = run_reads.list_mapped_task_instances(
        dag_id=dag_id,
        run_id=dag_run_id,
        task_id=task_id,
        filters=filters.domain(),
        order_by=filters.order_by,
        limit=filters.limit,
        offset=filters.offset,
    )
    return _ti_collection(page)


def _patch_tis(
    request: HttpRequest,
    dag_id: str,
    dag_run_id: str,
    task_id: str,
    map_index: int | None,
    body: PatchTaskInstanceBody,
    update_mask: list[str],
    *,
    dry_run: bool,
) -> TaskInstanceCollectionResponse:
    fields = body.model_fields_set
    if update_mask:
        fields = fields & set(update_mask)
    tis = run_states.patch_task_instances(
        dag_id=dag_id,
        run_id=dag_run_id,
        task_id=task_id,
        map_index=map_index,
        new_state=body.new_state,
        note=body.note,
        fields=frozenset(fields),
        masked=bool(update_mask),
        includes=frozenset(f for f in run_states.INCLUDE_FLAGS if getattr(body, f)),
        dry_run=dry_run,
        actor=actor_of(request),
    )
    return TaskInstanceCollectionResponse(
        task_instances=[TaskInstanceResponse.from_ti(ti) for ti in tis], total_entries=len(tis)
    )


@router.patch(TI_PATH + "/dry_run", response=responses(TaskInstanceCollectionResponse, 400, 404))
@needs("change", TaskInstance)
def patch_task_instance_dry_run(
    request: HttpRequest,
    dag_id: str,
    dag_run_id: str,
    task_id: str,
    body: PatchTaskInstanceBody,
    mask: Query[UpdateMask],
    map_index: int | None = Query(None, ge=-1, le=INT32_MAX),
) -> TaskInstanceCollectionResponse:
    """The TIs a PATCH would change, nothing written (Airflow: same path)."""
    return _patch_tis(
        request, dag_id, dag_run_id, task_id, map_index, body, mask.update_mask, dry_run=True
    )


@router.patch(
    TI_PATH + "/{map_index}/dry_run",
    response=responses(TaskInstanceCollectionResponse, 400, 404),
)
@needs("change", TaskInstance)
def patch_task_instance_dry_run_by_map_index(
    request: HttpRequest,
    dag_id: str,
    dag_run_id: str,
    task_id: str,
    map_index: int,
    body: PatchTaskInstanceBody,
    mask: Query[UpdateMask],
) -> TaskInstanceCollectionResponse:
    """The mapped TI a PATCH would change, nothing written (Airflow: same path)."""
    return _patch_tis(
        request, dag_id, dag_run_id, task_id, map_index, body, mask.update_mask, dry_run=True
    )


@router.patch(TI_PATH, response=responses(TaskInstanceCollectionResponse, 400, 404, 409))
@needs("change", TaskInstance)
def patch_task_instance(
    request: HttpRequest,
    dag_id: str,
    dag_run_id: str,
    task_id: str,
    body: PatchTaskInstanceBody,
    mask: Query[UpdateMask],
    map_index: int | None = Query(None, ge=-1, le=INT32_MAX),
) -> TaskInstanceCollectionResponse:
    """Set a task's TIs' state or note (Airflow: same path; without `map_index`, every map
    index), `run_states.patch_task_instances`."""
    return _patch_tis(
        request, dag_id, dag_run_id, task_id, map_index, body, mask.update_mask, dry_run=False
    )


@router.patch(
    TI_PATH + "/{map_index}", response=responses(TaskInstanceCollectionResponse, 400, 404, 409)
)
@needs("change", TaskInstance)
def patch_task_instance_by_map_index(
    request: HttpRequest,
    dag_id: str,
    dag_run_id: str,
    task_id: str,
    map_index: int,
    body: PatchTaskInstanceBody,
    mask: Query[UpdateMask],
) -> TaskInstanceCollectionResponse:
    """Set one mapped TI's state or note (Airflow: same path)."""
    return _patch_tis(
        request, dag_id, dag_run_id, task_id, map_index, body, mask.update_mask, dry_run=False
    )


@router.get(
    "/dags/{dag_id}/dagRuns/{dag_run_id}/taskInstances/{task_id}/{map_index}",
    response=responses(TaskInstanceResponse, 404),
)
@needs("view", TaskInstance)
def get_mapped_task_instance(
    request: HttpRequest, dag_id: str, dag_run_id: str, task_id: str, map_index: int
) -> TaskInstanceResponse:
    """One mapped task instance (Airflow: same path)."""
    ti = run_reads.get_task_instance(
        dag_id=dag_id, run_id=dag_run_id, task_id=task_id, map_index=map_index
    )
    return TaskInstanceResponse.from_ti(ti)


@router.get(
    "/dags/{dag_id}/dagRuns/{dag_run_id}/taskInstances/{task_id}",
    response=responses(TaskInstanceResponse, 404),
)
@needs("view", TaskInstance)
def get_task_instance(
    request: HttpRequest, dag_id: str, dag_run_id: str, task_id: str
) -> TaskInstanceResponse:
    """One (unmapped) task instance, or 404 (Airflow: same path)."""
    ti = run_reads.get_task_instance(dag_id=dag_id, run_id=dag_run_id, task_id=task_id)
    return TaskInstanceResponse.from_ti(ti)


# --- import errors ----------------------------------------------------------------------------


class ImportErrorFilters(Page):
    filename: str | None = Field(default=None, max_length=2000)
    filename_pattern: str | None = Field(default=None, max_length=2000)
    filename_prefix_pattern: str | None = Field(default=None, max_length=2000)
    bundle_name: str | None = Field(default=None, max_length=250)


@router.get("/importErrors", response=responses(ImportErrorCollectionResponse, 400))
@needs("view", DagImportError)
def list_import_errors(
    request: HttpRequest, filters: Query[ImportErrorFilters]
) -> ImportErrorCollectionResponse:
    """The Dag files that did not import at the last sync (Airflow: `GET /api/v2/importErrors`)."""
    page = dags.list_import_errors(**filters.dict())
    return ImportErrorCollectionResponse(
        import_errors=[ImportErrorResponse.from_error(e) for e in page.rows],
        total_entries=page.total_entries,
    )


@router.get("/importErrors/{import_error_id}", response=responses(ImportErrorResponse, 404))
@needs("view", DagImportError)
def get_import_error(request: HttpRequest, import_error_id: int) -> ImportErrorResponse:
    return ImportErrorResponse.from_error(dags.get_import_error(import_error_id=import_error_id))
