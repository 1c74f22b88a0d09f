"""Public API v2: the bodies and answer of Airflow 3.3.2's bulk routes (`BulkBody[T]`,
`BulkResponse` in `core_api/datamodels/common.py`), shared by `PATCH /variables`,
`/connections` and `/pools` (`runtime.bulk` applies them). The permissions each request needs
beyond the route's own (`add`) are checked from its actions, as Airflow's
`requires_access_*_bulk` does, before anything is read."""

from typing import Annotated, Any, Literal

from django.http import HttpRequest
from pydantic import BaseModel, Field, create_model

from assets_app.guards import exceptions
from assets_app.runtime import bulk

from . import errors, public_auth
from .public import actor_of
from .public_schemas import StrictSchema


class BulkActionResponse(StrictSchema):
    success: list[str] = []
    errors: list[dict[str, Any]] = []


class BulkResponse(StrictSchema):
    create: BulkActionResponse | None = None
    update: BulkActionResponse | None = None
    delete: BulkActionResponse | None = None


def _field(annotation: Any, default: Any) -> Any:
    """A `create_model` field (typed `Any`: mypy cannot read a Literal built at run time)."""
    return (annotation, default)


def bulk_body(entity: type[BaseModel], name: str) -> type[BaseModel]:
    """Airflow's `BulkBody[<entity>]`: a list of create, update and delete actions, told apart
    by `action`."""
    create = create_model(
        f"BulkCreateAction{name}",
        __base__=StrictSchema,
        action=_field(Literal["create"], ...),
        entities=_field(list[entity], ...),  # type: ignore[valid-type]
        action_on_existence=_field(Literal["fail", "skip", "overwrite"], "fail"),
    )
    update = create_model(
        f"BulkUpdateAction{name}",
        __base__=StrictSchema,
        action=_field(Literal["update"], ...),
        entities=_field(list[entity], ...),  # type: ignore[valid-type]
        update_mask=_field(list[str] | None, None),
        action_on_non_existence=_field(Literal["fail", "skip"], "fail"),
    )
    delete = create_model(
        f"BulkDeleteAction{name}",
        __base__=StrictSchema,
        action=_field(Literal["delete"], ...),
        entities=_field(list[str | entity], ...),  # type: ignore[valid-type]
        action_on_non_existence=_field(Literal["fail", "skip"], "fail"),
    )
    item = Annotated[create | update | delete, Field(discriminator="action")]  # type: ignore[valid-type]
    return create_model(f"BulkBody{name}", __base__=StrictSchema, actions=_field(list[item], ...))


def apply(
    request: HttpRequest,
    kind: bulk.Kind,
    body: Any,
    entity_fields: Any,
) -> BulkResponse:
    """Apply a parsed `BulkBody`: `entity_fields(entity)` gives the fields an entity carried
    (its body's set fields, under the domain's names)."""

    def entity(action: str, given: Any) -> Any:
        if action != "delete":
            return entity_fields(given)
        # A delete names a key, or an entity whose key is taken (Airflow's `list[str | T]`).
        return given if isinstance(given, str) else entity_fields(given)[kind.entity_key]

    actions = []
    for item in body.actions:
        entities = [entity(item.action, given) for given in item.entities]
        actions.append(
            bulk.Action(
                action=item.action,
                entities=entities,
                action_on_existence=getattr(item, "action_on_existence", "fail"),
                action_on_non_existence=getattr(item, "action_on_non_existence", "fail"),
                update_mask=getattr(item, "update_mask", None),
            )
        )
    user = public_auth.user_of(request)
    model = kind.model._meta
    for action_name in bulk.permissions_needed(actions):
        public_auth.authorize(user, f"{model.app_label}.{action_name}_{model.model_name}")
    results = bulk.apply(kind, actions, actor=actor_of(request))
    return BulkResponse(
        **{
            name: BulkActionResponse(
                success=result.success,
                errors=[_error(exc) for exc in result.errors],
            )
            for name, result in results.items()
        }
    )


def _error(exc: exceptions.DomainError) -> dict[str, Any]:
    """One error of an action, as Airflow reports it: its message and status code."""
    return {"error": exc.message, "status_code": errors.status_of(exc)}
