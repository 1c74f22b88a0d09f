"""The two HTTP APIs (the worker-facing execution API, the public API) and request middleware.

Owns: the worker API (`execution`, `execution_runtime`, `execution_store`, `schemas`,
`runtime_schemas`, `auth`), the public API (`public*`), the error mapping both share (`errors`),
the JSON parser (`parser`) and the middleware (`middleware`: the JSON APIs' request guards;
`service_middleware`: the latency histogram, the operator's time zone, 503 when the database is
away).

Writes: nothing itself but `ApiToken` use (`public_auth`); views are thin and call the domain
functions that own each write.

May import: every layer and shared package (a door); no domain module imports it.
"""

from ninja import NinjaAPI

from . import errors
from .parser import FullPrecisionRenderer, JsonParser

execution_api = NinjaAPI(
    title="Asset event service - execution API",
    version="2026-06-30",
    urls_namespace="execution",
    docs_url="/docs",
    parser=JsonParser(),
)
public_api = NinjaAPI(
    title="Asset event service - public API",
    version="2",
    urls_namespace="public_api",
    docs_url="/docs",
    parser=JsonParser(),
    renderer=FullPrecisionRenderer(),
)
errors.install(execution_api)
errors.install(public_api)

from . import (  # noqa: E402  (routers register on the APIs)
    execution,
    execution_hitl,
    execution_runtime,
    execution_store,
    public,
    public_backfills,
    public_dag_lists,
    public_dags,
    public_event_logs,
    public_hitl,
    public_pools,
    public_service,
    public_settings,
    public_state_store,
    public_webhooks,
    public_xcoms,
)

execution_api.add_router("", execution.router)
# After `execution`: its static `/task-instances/...` paths stay first.
execution_api.add_router("", execution_runtime.router)
execution_api.add_router("", execution_store.router)
execution_api.add_router("", execution_hitl.router)
# Static paths before the ones with a variable segment where both could match (`dagRuns/list`).
# Before `public_dags`: its `.../taskInstances/{task_id}/{map_index}` would take `state-store`
# and `xcomEntries` (a literal segment wins over a parameter, as in Airflow).
public_api.add_router("", public_state_store.router)
public_api.add_router("", public_xcoms.router)
public_api.add_router("", public_hitl.router)
public_api.add_router("", public_dags.router)
public_api.add_router("", public.router)
public_api.add_router("", public_settings.router)
public_api.add_router("", public_pools.router)
public_api.add_router("", public_backfills.router)
public_api.add_router("", public_webhooks.router)
public_api.add_router("", public_dag_lists.router)
public_api.add_router("", public_service.router)
public_api.add_router("", public_event_logs.router)
