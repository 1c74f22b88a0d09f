"""Public API v2: the lists about Dags that Airflow 3.3.2 serves beside them, with its paths,
parameters and shapes (`routes/public/dag_tags.py`, `dag_stats.py`, `dag_warning.py`,
`dag_versions.py`):

- `GET /dagTags`: the distinct tags of the Dags, filtered and paged.
- `GET /dagStats`: per Dag with runs, its runs counted by state.
- `GET /dagWarnings`: an empty list. Airflow's warning types (asset conflict, non-existent pool,
  runtime-varying value) are not detected here; a Dag the scheduler cannot evaluate shows its
  `schedule_error` in the admin instead.
- `GET /dags/{dag_id}/dagVersions[/{version_number}]`: a Dag's versions, one per synced
  definition change (`definitions.sync`); 404 for an unknown Dag or version (`~` lists every
  Dag's).
- `GET /dagSources/{dag_id}` (`dag_sources.py`, issue 45): the source of the Dag's file as the
  worker last synced it (`definitions.sources`), as Airflow's `DAGSourceResponse`, or the text
  alone with `Accept: text/plain`. `version_number` is the Dag's latest version; the source
  of an earlier version is not kept, and asking for one is Airflow's 404. A source cut at
  the limit ends with a comment line saying so. Airflow redacts the code when the caller may not
  read every Dag of the file; here the read permission is the model's (`view_dag`), so whoever
  may read one Dag may read them all and nothing is redacted.
"""

from typing import Literal

from django.http import HttpRequest, HttpResponse
from ninja import Field, Header, Query, Router, Schema

from assets_app.catalog import dags, listing
from assets_app.definitions import sources
from assets_app.guards import exceptions
from assets_app.models import Dag, DagRun

from .errors import error_response
from .public import Page
from .public_auth import public_api_auth
from .public_permissions import needs
from .public_schemas import DagVersionResponse, responses
from .schemas import INT32_MAX, UtcDatetime

router = Router(tags=["public"], auth=public_api_auth())


class DAGTagCollectionResponse(Schema):
    tags: list[str]
    total_entries: int


class TagFilters(Page):
    tag_name_pattern: str | None = None
    tag_name_prefix_pattern: str | None = None


@router.get("/dagTags", response=responses(DAGTagCollectionResponse))
@needs("view", Dag)
def get_dag_tags(request: HttpRequest, filters: Query[TagFilters]) -> DAGTagCollectionResponse:
    page = dags.list_dag_tags(**filters.dict())
    return DAGTagCollectionResponse(tags=page.rows, total_entries=page.total_entries)


RunState = Literal["queued", "running", "success", "failed"]


class DagStatsStateResponse(Schema):
    state: RunState
    count: int


class DagStatsResponse(Schema):
    dag_id: str
    dag_display_name: str
    stats: list[DagStatsStateResponse]


class DagStatsCollectionResponse(Schema):
    dags: list[DagStatsResponse]
    total_entries: int


class StatsFilters(Schema):
    dag_ids: list[str] = Field(default_factory=list)


@router.get("/dagStats", response=responses(DagStatsCollectionResponse, 400, 404))
@needs("view", DagRun)
def get_dag_stats(request: HttpRequest, filters: Query[StatsFilters]) -> DagStatsCollectionResponse:
    found = dags.dag_stats(dag_ids=filters.dag_ids)
    return DagStatsCollectionResponse(
        dags=[
            DagStatsResponse(
                dag_id=s.dag_id,
                dag_display_name=s.dag_id,
                stats=[
                    DagStatsStateResponse(state=state, count=count)  # type: ignore[arg-type]
                    for state, count in s.counts.items()
                ],
            )
            for s in found
        ],
        total_entries=len(found),
    )


WarningType = Literal["asset conflict", "non-existent pool", "runtime varying value"]


class DAGWarningResponse(Schema):
    dag_id: str
    warning_type: WarningType
    message: str
    timestamp: UtcDatetime
    dag_display_name: str


class DAGWarningCollectionResponse(Schema):
    dag_warnings: list[DAGWarningResponse]
    total_entries: int


class WarningFilters(Page):
    dag_id: str | None = None
    warning_type: WarningType | None = None


@router.get("/dagWarnings", response=responses(DAGWarningCollectionResponse))
@needs("view", Dag)
def list_dag_warnings(
    request: HttpRequest, filters: Query[WarningFilters]
) -> DAGWarningCollectionResponse:
    """No warnings (see the module docstring); an `order_by` Airflow refuses is refused."""
    page = listing.sorted_page(
        [],
        order_by=filters.order_by,
        names=("dag_id", "warning_type", "message", "timestamp"),
        limit=filters.limit,
        offset=0,
    )
    return DAGWarningCollectionResponse(dag_warnings=page.rows, total_entries=0)


class DAGVersionCollectionResponse(Schema):
    dag_versions: list[DagVersionResponse]
    total_entries: int


class VersionFilters(Page):
    version_number: int | None = None
    bundle_name: str | None = None
    bundle_version: str | None = None


@router.get("/dags/{dag_id}/dagVersions", response=responses(DAGVersionCollectionResponse, 404))
@needs("view", Dag)
def get_dag_versions(
    request: HttpRequest, dag_id: str, filters: Query[VersionFilters]
) -> DAGVersionCollectionResponse:
    """A Dag's versions (`~`: every Dag's), one per synced definition change; 404 for an
    unknown Dag, as Airflow."""
    page = dags.list_dag_versions(dag_id=dag_id, **filters.dict())
    return DAGVersionCollectionResponse(
        dag_versions=[DagVersionResponse.from_version(v) for v in page.rows],
        total_entries=page.total_entries,
    )


@router.get(
    "/dags/{dag_id}/dagVersions/{version_number}", response=responses(DagVersionResponse, 404)
)
@needs("view", Dag)
def get_dag_version(request: HttpRequest, dag_id: str, version_number: int) -> DagVersionResponse:
    """One version, or Airflow's 404."""
    found = dags.get_dag_version(dag_id=dag_id, version_number=version_number)
    return DagVersionResponse.from_version(found)


class DAGSourceResponse(Schema):
    """Airflow 3.3.2's `DAGSourceResponse`."""

    content: str | None
    dag_id: str
    version_number: int | None
    dag_display_name: str


@router.get("/dagSources/{dag_id}", response=responses(DAGSourceResponse, 400, 404, 406))
@needs("view", Dag)
def get_dag_source(
    request: HttpRequest,
    dag_id: str,
    version_number: int | None = Query(None, ge=0, le=INT32_MAX),
    accept: Header[str] = "*/*",
):
    """The Dag's file as last synced; Airflow's Accept rule (`header_accept_json_or_text_depends`)
    and its two 404 messages (`get_dag_source`)."""
    if not accept.startswith(("*/*", "application/json", "text/plain")):
        return error_response(
            406, "not_acceptable", "Only application/json or text/plain is supported"
        )
    dag = Dag.objects.filter(dag_id=dag_id).only("dag_id", "fileloc").first()
    latest = dags.latest_version(dag_id) if dag is not None else None
    latest_number = latest.version_number if latest is not None else None
    # Only the current source is kept: it is the latest version's; an earlier one is a 404.
    if dag is None or version_number not in (None, latest_number):
        raise exceptions.NotFound(
            f"The source code of the Dag {dag_id}, version_number {version_number} was not found",
            reason="dag_source_not_found",
        )
    code = sources.source_of(dag.fileloc)
    if code is None:
        raise exceptions.NotFound(
            f"Code not found. dag_id='{dag_id}' version_number='{version_number}'",
            reason="dag_source_not_found",
        )
    content = code.source_code
    if code.truncated:
        content += f"\n# [asset service] {sources.note(code)}\n"
    if accept.startswith("text/plain"):
        return HttpResponse(content, content_type="text/plain; charset=utf-8")
    return DAGSourceResponse(
        content=content, dag_id=dag_id, version_number=latest_number, dag_display_name=dag_id
    )
