"""Public API v2: what Airflow 3.3.2 says about its own deployment, answered as Airflow answers
when it has none of it (`routes/public/config.py`, `job.py`, `plugins.py`, `providers.py`).

- `GET /config`, `GET /config/section/{section}/option/{option}`: 403 with Airflow's message, as
  Airflow answers with its default `[api] expose_config = False`. The service has no Airflow
  configuration to show, and its own settings hold keys: nothing is exposed.
- `GET /jobs`: an empty list. Airflow's jobs are its scheduler, triggerer and Dag processor
  processes with an id, host and heartbeat each; the service's drain and scheduler keep only a
  last-run time per component (`/monitor/health` shows it), not jobs.
- `GET /plugins`, `GET /plugins/importErrors`: empty lists (the service loads no plugins).
- `GET /providers`: an empty list. Airflow lists the provider packages installed beside its API
  server; none is installed in this service (the workers' environment has its own).

Each needs `view` of `ComponentHeartbeat`, the model of the service's own processes (Airflow:
`requires_access_configuration` / `requires_access_view` for jobs, plugins and providers).
"""

from typing import Literal

from django.http import HttpRequest
from ninja import Field, Header, Query, Router, Schema

from assets_app.catalog import listing
from assets_app.guards import exceptions
from assets_app.models import ComponentHeartbeat

from .public_auth import public_api_auth
from .public_permissions import needs
from .public_schemas import Limit, Offset, StrictSchema, responses
from .schemas import UtcDatetime

router = Router(tags=["public"], auth=public_api_auth())


# --- config -------------------------------------------------------------------------------------


class ConfigOption(StrictSchema):
    key: str
    value: str | tuple[str, str]


class ConfigSection(StrictSchema):
    name: str
    options: list[ConfigOption]


class Config(StrictSchema):
    sections: list[ConfigSection]


Accept = Header[Literal["application/json", "text/plain", "*/*"]]


def _config_not_exposed() -> exceptions.PermissionDenied:
    return exceptions.PermissionDenied(
        "Your Airflow administrator chose not to expose the configuration, most likely for "
        "security reasons.",
        reason="config_not_exposed",
    )


@router.get("/config", response=responses(Config, 404, 406))
@needs("view", ComponentHeartbeat)
def get_config(request: HttpRequest, section: str | None = None, accept: Accept = "*/*"):
    """Airflow's answer with `expose_config` off (`_check_expose_config`): 403."""
    raise _config_not_exposed()


@router.get("/config/section/{section}/option/{option}", response=responses(Config, 404, 406))
@needs("view", ComponentHeartbeat)
def get_config_value(request: HttpRequest, section: str, option: str, accept: Accept = "*/*"):
    """Airflow's answer with `expose_config` off (`_check_expose_config`): 403."""
    raise _config_not_exposed()


# --- jobs ---------------------------------------------------------------------------------------


class JobResponse(Schema):
    id: int
    dag_id: str | None
    state: str | None
    job_type: str | None
    start_date: UtcDatetime | None
    end_date: UtcDatetime | None
    latest_heartbeat: UtcDatetime | None
    executor_class: str | None
    hostname: str | None
    unixname: str | None
    dag_display_name: str | None = None


class JobCollectionResponse(Schema):
    jobs: list[JobResponse]
    total_entries: int


# Airflow's `get_jobs` order_by names.
JOB_ORDER_BY = (
    "id",
    "dag_id",
    "state",
    "job_type",
    "start_date",
    "end_date",
    "latest_heartbeat",
    "executor_class",
    "hostname",
    "unixname",
)


class JobFilters(Schema):
    is_alive: bool | None = None
    start_date_gte: UtcDatetime | None = None
    start_date_gt: UtcDatetime | None = None
    start_date_lte: UtcDatetime | None = None
    start_date_lt: UtcDatetime | None = None
    end_date_gte: UtcDatetime | None = None
    end_date_gt: UtcDatetime | None = None
    end_date_lte: UtcDatetime | None = None
    end_date_lt: UtcDatetime | None = None
    limit: Limit = listing.DEFAULT_PAGE_LIMIT
    offset: Offset = 0
    order_by: list[str] = Field(default_factory=list)
    job_state: str | None = None
    job_type: str | None = None
    hostname: str | None = None
    executor_class: str | None = None


@router.get("/jobs", response=responses(JobCollectionResponse, 400))
@needs("view", ComponentHeartbeat)
def get_jobs(request: HttpRequest, filters: Query[JobFilters]) -> JobCollectionResponse:
    """No jobs (see the module docstring); an `order_by` Airflow refuses is refused (400)."""
    page = listing.sorted_page(
        [], order_by=filters.order_by, names=JOB_ORDER_BY, limit=filters.limit, offset=0
    )
    return JobCollectionResponse(jobs=page.rows, total_entries=page.total_entries)


# --- plugins and providers ----------------------------------------------------------------------


class _Extensible(Schema):
    """Airflow's plugin parts allow extra fields (`extra="allow"`)."""

    model_config = {"extra": "allow"}


class FastAPIAppResponse(_Extensible):
    app: str
    url_prefix: str
    name: str


class FastAPIRootMiddlewareResponse(_Extensible):
    middleware: str
    name: str


class AppBuilderViewResponse(_Extensible):
    name: str | None = None
    category: str | None = None
    view: str | None = None
    label: str | None = None


class AppBuilderMenuItemResponse(_Extensible):
    name: str
    href: str
    category: str | None = None


class _UIResponse(_Extensible):
    name: str
    icon: str | None = None
    icon_dark_mode: str | None = None
    url_route: str | None = None
    category: str | None = None
    nav_top_level: bool | None = False


class ExternalViewResponse(_UIResponse):
    href: str
    destination: Literal["nav", "dag", "dag_run", "task", "task_instance", "base"] = "nav"


class ReactAppResponse(_UIResponse):
    bundle_url: str
    destination: Literal["nav", "dag", "dag_run", "task", "task_instance", "base", "dashboard"] = (
        "nav"
    )


class PluginResponse(Schema):
    name: str
    macros: list[str]
    flask_blueprints: list[str]
    fastapi_apps: list[FastAPIAppResponse]
    fastapi_root_middlewares: list[FastAPIRootMiddlewareResponse]
    external_views: list[ExternalViewResponse]
    react_apps: list[ReactAppResponse]
    appbuilder_views: list[AppBuilderViewResponse]
    appbuilder_menu_items: list[AppBuilderMenuItemResponse]
    global_operator_extra_links: list[str]
    operator_extra_links: list[str]
    source: str
    listeners: list[str]
    timetables: list[str]


class PluginCollectionResponse(Schema):
    plugins: list[PluginResponse]
    total_entries: int


class PluginImportErrorResponse(Schema):
    source: str
    error: str


class PluginImportErrorCollectionResponse(Schema):
    import_errors: list[PluginImportErrorResponse]
    total_entries: int


class ProviderResponse(Schema):
    package_name: str
    description: str
    version: str
    documentation_url: str | None


class ProviderCollectionResponse(Schema):
    providers: list[ProviderResponse]
    total_entries: int


class PageOnly(Schema):
    limit: Limit = listing.DEFAULT_PAGE_LIMIT
    offset: Offset = 0


@router.get("/plugins", response=responses(PluginCollectionResponse))
@needs("view", ComponentHeartbeat)
def get_plugins(request: HttpRequest, page: Query[PageOnly]) -> PluginCollectionResponse:
    """No plugins: the service loads none."""
    return PluginCollectionResponse(plugins=[], total_entries=0)


@router.get("/plugins/importErrors", response=responses(PluginImportErrorCollectionResponse))
@needs("view", ComponentHeartbeat)
def get_plugin_import_errors(request: HttpRequest) -> PluginImportErrorCollectionResponse:
    """No plugin import errors: the service loads no plugins."""
    return PluginImportErrorCollectionResponse(import_errors=[], total_entries=0)


@router.get("/providers", response=responses(ProviderCollectionResponse))
@needs("view", ComponentHeartbeat)
def get_providers(request: HttpRequest, page: Query[PageOnly]) -> ProviderCollectionResponse:
    """No providers: none is installed in this service."""
    return ProviderCollectionResponse(providers=[], total_entries=0)
