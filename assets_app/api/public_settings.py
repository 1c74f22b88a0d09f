"""Public API v2: Variables and Connections, with Airflow 3.3.2's paths, parameters and bodies
(`GET|POST /variables`, `GET|PATCH|DELETE /variables/{variable_key}`, the same for
`/connections/{connection_id}`). Every answer is masked as Airflow's are (`masking`): a
Connection's password ("***" when set) and the sensitive keys of its `extra` at any depth, a
Variable whose key, or a key inside its JSON value, names a secret."""

import json
from datetime import datetime
from typing import Any

from django.http import HttpRequest
from ninja import Field, Header, Query, Router, Status

from assets_app.guards import exceptions, masking
from assets_app.models import Connection, Variable
from assets_app.runtime import bulk, variables

from . import public_bulk
from .public import Page, actor_of
from .public_auth import public_api_auth
from .public_permissions import needs
from .public_schemas import StrictSchema, responses
from .schemas import ResponseBody

router = Router(tags=["public"], auth=public_api_auth())


class VariableResponse(StrictSchema):
    key: str
    value: str | None
    description: str | None
    is_encrypted: bool
    team_name: str | None

    @classmethod
    def from_variable(cls, variable: Variable) -> "VariableResponse":
        return cls(
            key=variable.key,
            value=masking.masked_variable(variable.key, variables.value_of(variable)),
            description=variable.description,
            is_encrypted=variable.is_encrypted,
            team_name=None,
        )


class VariableCollectionResponse(StrictSchema):
    variables: list[VariableResponse]
    total_entries: int


class VariableBody(StrictSchema):
    key: str = Field(min_length=1, max_length=250)
    # Airflow's JsonValue: a string is stored as it is, anything else (null too) as its JSON
    # text, indented by 2 (`VariableBody.serialize_non_string_value`).
    value: Any
    description: str | None = None
    team_name: str | None = Field(default=None, max_length=50)


def _variable_text(value: Any) -> str:
    """The text Airflow 3.3.2 stores for a Variable body's value (`serialize_non_string_value`:
    `{"rows": 5}` is stored as `'{\n  "rows": 5\n}'`, null as `'null'`)."""
    return value if isinstance(value, str) else json.dumps(value, indent=2)


class VariableFilters(Page):
    variable_key_pattern: str | None = None
    variable_key_prefix_pattern: str | None = None


class ConnectionResponse(ResponseBody):
    """A plain pydantic model: ninja's Schema reads `schema` as its own method."""

    connection_id: str
    conn_type: str
    description: str | None
    host: str | None
    login: str | None
    schema_: str | None = Field(alias="schema")
    port: int | None
    password: str | None
    extra: str | None
    team_name: str | None

    @classmethod
    def from_connection(cls, connection: Connection) -> "ConnectionResponse":
        found = variables.reveal(connection)
        return cls(
            connection_id=connection.conn_id,
            conn_type=connection.conn_type,
            description=connection.description,
            host=connection.host,
            login=connection.login,
            schema=connection.schema,
            port=connection.port,
            password=masking.masked_password(found.password),
            extra=masking.masked_extra(found.extra),
            team_name=None,
        )


class ConnectionCollectionResponse(ResponseBody):
    connections: list[ConnectionResponse]
    total_entries: int


class ConnectionBody(StrictSchema):
    connection_id: str = Field(min_length=1, max_length=250, pattern=r"^[\w.-]+$")
    conn_type: str
    description: str | None = None
    host: str | None = None
    login: str | None = None
    schema_: str | None = Field(default=None, alias="schema")
    port: int | None = Field(default=None, ge=0, le=65535)
    password: str | None = None
    extra: str | None = None
    team_name: str | None = Field(default=None, max_length=50)

    def fields(self) -> dict[str, Any]:
        return {
            "conn_type": self.conn_type,
            "description": self.description,
            "host": self.host,
            "login": self.login,
            "schema": self.schema_,
            "port": self.port,
        }


class ConnectionFilters(Page):
    connection_id_pattern: str | None = None
    connection_id_prefix_pattern: str | None = None


# --- variables ----------------------------------------------------------------------------------


@router.get("/variables", response=responses(VariableCollectionResponse, 400))
@needs("view", Variable)
def get_variables(request: HttpRequest, filters: Query[VariableFilters]):
    page = variables.list_variables(**filters.dict())
    return VariableCollectionResponse(
        variables=[VariableResponse.from_variable(v) for v in page.rows],
        total_entries=page.total_entries,
    )


@router.post("/variables", response=responses(VariableResponse, 409, status=201))
@needs("add", Variable)
def post_variable(request: HttpRequest, body: VariableBody):
    variable = variables.create_variable(
        key=body.key,
        value=_variable_text(body.value),
        description=body.description,
        actor=actor_of(request),
    )
    return Status(201, VariableResponse.from_variable(variable))


BulkBodyVariableBody = public_bulk.bulk_body(VariableBody, "VariableBody")


def _variable_fields(body: VariableBody) -> dict[str, Any]:
    sent = {"key": body.key, "value": _variable_text(body.value), "description": body.description}
    return {name: value for name, value in sent.items() if name in body.model_fields_set}


@router.patch("/variables", response=responses(public_bulk.BulkResponse))
@needs("add", Variable)
def bulk_variables(request: HttpRequest, body: BulkBodyVariableBody):  # type: ignore[valid-type]
    """Airflow's bulk create / update / delete of Variables (`runtime.bulk`)."""
    return public_bulk.apply(request, bulk.VARIABLES, body, _variable_fields)


@router.get("/variables/{path:variable_key}", response=responses(VariableResponse, 404))
@needs("view", Variable)
def get_variable(request: HttpRequest, variable_key: str):
    return VariableResponse.from_variable(variables.get_variable(key=variable_key))


@router.patch("/variables/{path:variable_key}", response=responses(VariableResponse, 400, 404))
@needs("change", Variable)
def patch_variable(
    request: HttpRequest,
    variable_key: str,
    body: VariableBody,
    update_mask: Query[list[str] | None] = None,
):
    if body.key != variable_key:
        raise exceptions.BadRequest(
            "Invalid body, key from request body doesn't match uri parameter",
            reason="key_mismatch",
        )
    # Only the fields the body carried (Airflow's `model_fields_set`): a description it left out
    # keeps its stored value.
    sent = {"value": _variable_text(body.value), "description": body.description}
    variable = variables.update_variable(
        key=variable_key,
        changes={name: value for name, value in sent.items() if name in body.model_fields_set},
        update_mask=update_mask,
        actor=actor_of(request),
    )
    return VariableResponse.from_variable(variable)


@router.delete("/variables/{path:variable_key}", response=responses(None, 404, status=204))
@needs("delete", Variable)
def delete_variable(request: HttpRequest, variable_key: str):
    variables.delete_variable(key=variable_key, actor=actor_of(request))
    return Status(204, None)


# --- connections --------------------------------------------------------------------------------


@router.get(
    "/connections", response=responses(ConnectionCollectionResponse, 400, 404), by_alias=True
)
@needs("view", Connection)
def get_connections(request: HttpRequest, filters: Query[ConnectionFilters]):
    page = variables.list_connections(**filters.dict())
    return ConnectionCollectionResponse(
        connections=[ConnectionResponse.from_connection(c) for c in page.rows],
        total_entries=page.total_entries,
    )


@router.post("/connections", response=responses(ConnectionResponse, 409, status=201), by_alias=True)
@needs("add", Connection)
def post_connection(request: HttpRequest, body: ConnectionBody):
    connection = variables.save_connection(
        conn_id=body.connection_id,
        create=True,
        password=body.password,
        extra=body.extra,
        actor=actor_of(request),
        **body.fields(),
    )
    return Status(201, ConnectionResponse.from_connection(connection))


BulkBodyConnectionBody = public_bulk.bulk_body(ConnectionBody, "ConnectionBody")


def _connection_fields(body: ConnectionBody) -> dict[str, Any]:
    sent = {"connection_id": body.connection_id, **body.fields()}
    sent |= {"password": body.password, "extra": body.extra}
    given = {"schema" if name == "schema_" else name for name in body.model_fields_set}
    return {name: value for name, value in sent.items() if name in given}


@router.patch("/connections", response=responses(public_bulk.BulkResponse))
@needs("add", Connection)
def bulk_connections(request: HttpRequest, body: BulkBodyConnectionBody):  # type: ignore[valid-type]
    """Airflow's bulk create / update / delete of Connections (`runtime.bulk`): an update
    keeps a password it sends as null, as the single PATCH does."""
    return public_bulk.apply(request, bulk.CONNECTIONS, body, _connection_fields)


# `/connections/test` and `/connections/defaults` come before `/connections/{connection_id}`:
# a literal segment wins over a parameter, as in Airflow (`routes/public/connections.py`).


class ConnectionTestResponse(StrictSchema):
    status: bool
    message: str


@router.post("/connections/test", response=responses(ConnectionTestResponse))
@needs("add", Connection)
def test_connection(request: HttpRequest, body: ConnectionBody):
    """Airflow 3.3.2 tests a connection only when `[core] test_connection` is `Enabled` (by
    default it is not: 403, `_ensure_test_connection_enabled`). This service runs no hooks, so
    it never tests one: always that 403, with Airflow's message."""
    raise exceptions.PermissionDenied(
        "Testing connections is disabled in Airflow configuration. "
        "Contact your deployment admin to enable it.",
        reason="connection_test_disabled",
    )


class ConnectionTestRequestBody(ConnectionBody):
    commit_on_success: bool = False
    executor: str | None = None
    queue: str | None = None


class ConnectionTestQueuedResponse(StrictSchema):
    token: str
    connection_id: str
    state: str


class AsyncConnectionTestResponse(StrictSchema):
    token: str
    connection_id: str
    state: str
    result_message: str | None
    created_at: datetime


@router.post(
    "/connections/enqueue-test",
    response=responses(ConnectionTestQueuedResponse, 409, status=202),
)
@needs("add", Connection)
def enqueue_connection_test(request: HttpRequest, body: ConnectionTestRequestBody):
    """Airflow 3.3.2 enqueues a test for a worker only with `[core] test_connection` `Enabled`
    (`_ensure_test_connection_enabled`, before anything else): this service runs no hooks, so
    always that 403, with Airflow's message; nothing is queued."""
    raise exceptions.PermissionDenied(
        "Testing connections is disabled in Airflow configuration. "
        "Contact your deployment admin to enable it.",
        reason="connection_test_disabled",
    )


@router.get("/connections/enqueue-test", response=responses(AsyncConnectionTestResponse, 404))
@needs("view", Connection)
def get_connection_test(
    request: HttpRequest,
    connection_test_token: str = Header(..., alias="Airflow-Connection-Test-Token"),
):
    """Airflow's poll of an enqueued test by its token: none is ever enqueued here, so every
    token is Airflow's 404 for a token it does not know."""
    raise exceptions.NotFound(
        f"No connection test found for token: `{connection_test_token}`",
        reason="connection_test_not_found",
    )


@router.post("/connections/defaults", response=responses(None, status=204))
@needs("add", Connection)
def create_default_connections(request: HttpRequest):
    """Airflow creates its ~60 default connections (`airflow.utils.db.create_default_connections`:
    its metadata database, cloud providers' `*_default`). They name services this one neither
    runs nor emulates, so it creates none: 403, and nothing is written."""
    raise exceptions.PermissionDenied(
        "This service does not create Airflow's default connections: they point at Airflow's "
        "own services and providers, which it does not run. Create the connections your tasks "
        "use with POST /api/v2/connections.",
        reason="default_connections_not_offered",
    )


@router.get(
    "/connections/{connection_id}", response=responses(ConnectionResponse, 404), by_alias=True
)
@needs("view", Connection)
def get_connection(request: HttpRequest, connection_id: str):
    found = variables.get_connection(conn_id=connection_id)
    return ConnectionResponse.from_connection(found.connection)


@router.patch(
    "/connections/{connection_id}",
    response=responses(ConnectionResponse, 400, 404),
    by_alias=True,
)
@needs("change", Connection)
def patch_connection(
    request: HttpRequest,
    connection_id: str,
    body: ConnectionBody,
    update_mask: Query[list[str] | None] = None,
):
    if body.connection_id != connection_id:
        raise exceptions.BadRequest(
            "The connection_id in the request body does not match the URL parameter",
            reason="connection_id_mismatch",
        )
    # Only the fields the body carried: one it left out keeps its stored value (Airflow's
    # `model_fields_set`), where a null it sent may mean "keep" (password) or "clear".
    given = {"schema" if name == "schema_" else name for name in body.model_fields_set}
    fields = {**body.fields(), "password": body.password, "extra": body.extra}
    connection = variables.patch_connection(
        conn_id=connection_id,
        sent={name: value for name, value in fields.items() if name in given},
        update_mask=update_mask,
        actor=actor_of(request),
    )
    return ConnectionResponse.from_connection(connection)


@router.delete("/connections/{connection_id}", response=responses(None, 404, status=204))
@needs("delete", Connection)
def delete_connection(request: HttpRequest, connection_id: str):
    variables.delete_connection(conn_id=connection_id, actor=actor_of(request))
    return Status(204, None)
