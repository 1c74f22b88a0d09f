"""Public API v2: Pools, with Airflow 3.3.2's paths, parameters and bodies
(`api_fastapi/core_api/routes/public/pools.py`, `datamodels/pools.py`): `GET|POST /pools`,
`GET|PATCH|DELETE /pools/{pool_name}`. `default_pool` cannot be deleted (400) and only its
`slots` and `include_deferred` change, named by `update_mask`; `team_name` is refused when set
(Airflow refuses it without multi-team mode, which the service does not have)."""

from typing import Any

from django.http import HttpRequest
from ninja import Field, Query, Router, Status
from pydantic import AliasChoices, field_validator

from assets_app.models import Pool
from assets_app.runtime import bulk, pools

from . import public_bulk
from .public import Page, actor_of
from .public_auth import public_api_auth
from .public_permissions import needs
from .public_schemas import StrictSchema, responses
from .schemas import INT32_MAX

router = Router(tags=["public"], auth=public_api_auth())

NO_TEAMS = (
    "team_name cannot be set when multi_team mode is disabled. Please contact your administrator."
)


class PoolResponse(StrictSchema):
    name: str
    slots: int
    description: str | None
    include_deferred: bool
    occupied_slots: int
    running_slots: int
    queued_slots: int
    scheduled_slots: int
    open_slots: int  # -1: unlimited, as Airflow's
    deferred_slots: int
    team_name: str | None

    @classmethod
    def from_domain(cls, found: pools.PoolSlots) -> "PoolResponse":
        return cls(
            name=found.pool.name,
            slots=found.pool.slots,
            description=found.pool.description,
            include_deferred=found.pool.include_deferred,
            occupied_slots=found.occupied,
            running_slots=found.running,
            queued_slots=found.queued,
            scheduled_slots=found.scheduled,
            open_slots=-1 if found.open is None else found.open,
            deferred_slots=found.deferred,
            team_name=None,
        )


class PoolCollectionResponse(StrictSchema):
    pools: list[PoolResponse]
    total_entries: int


def _no_team(value: str | None) -> str | None:
    if value is not None:
        raise ValueError(NO_TEAMS)
    return value


class PoolBody(StrictSchema):
    name: str = Field(min_length=1, max_length=256)
    slots: int = Field(ge=-1, le=INT32_MAX, description="Number of slots. Use -1 for unlimited.")
    description: str | None = None
    include_deferred: bool = False
    team_name: str | None = Field(default=None, max_length=50)

    _team = field_validator("team_name")(_no_team)


class PoolPatchBody(StrictSchema):
    # Airflow's field `name`, spelled `pool` on the wire (its alias), `name` accepted too.
    pool: str | None = Field(default=None, validation_alias=AliasChoices("pool", "name"))
    slots: int | None = Field(default=None, ge=-1, le=INT32_MAX)
    description: str | None = None
    include_deferred: bool | None = None
    team_name: str | None = Field(default=None, max_length=50)

    _team = field_validator("team_name")(_no_team)


class PoolFilters(Page):
    pool_name_pattern: str | None = None
    pool_name_prefix_pattern: str | None = None


@router.get("/pools", response=responses(PoolCollectionResponse, 400, 404))
@needs("view", Pool)
def get_pools(request: HttpRequest, filters: Query[PoolFilters]):
    page = pools.list_pools(**filters.dict())
    return PoolCollectionResponse(
        pools=[PoolResponse.from_domain(p) for p in page.rows], total_entries=page.total_entries
    )


@router.post("/pools", response=responses(PoolResponse, 409, status=201))
@needs("add", Pool)
def post_pool(request: HttpRequest, body: PoolBody):
    created = pools.create_pool(
        name=body.name,
        slots=body.slots,
        description=body.description,
        include_deferred=body.include_deferred,
        actor=actor_of(request),
    )
    return Status(201, PoolResponse.from_domain(created))


BulkBodyPoolBody = public_bulk.bulk_body(PoolBody, "PoolBody")


def _pool_fields(body: PoolBody) -> dict[str, Any]:
    return {"name": body.name, **body.model_dump(exclude_unset=True, exclude={"team_name"})}


@router.patch("/pools", response=responses(public_bulk.BulkResponse))
@needs("add", Pool)
def bulk_pools(request: HttpRequest, body: BulkBodyPoolBody):  # type: ignore[valid-type]
    """Airflow's bulk create / update / delete of pools (`runtime.bulk`)."""
    return public_bulk.apply(request, bulk.POOLS, body, _pool_fields)


@router.get("/pools/{path:pool_name}", response=responses(PoolResponse, 404))
@needs("view", Pool)
def get_pool(request: HttpRequest, pool_name: str):
    return PoolResponse.from_domain(pools.get_pool(name=pool_name))


@router.patch("/pools/{path:pool_name}", response=responses(PoolResponse, 400, 404))
@needs("change", Pool)
def patch_pool(
    request: HttpRequest,
    pool_name: str,
    body: PoolPatchBody,
    update_mask: Query[list[str] | None] = None,
):
    changes = body.model_dump(exclude_unset=True, exclude={"team_name"})
    if "pool" in changes:
        changes["name"] = changes.pop("pool")
    updated = pools.update_pool(
        name=pool_name, changes=changes, update_mask=update_mask, actor=actor_of(request)
    )
    return PoolResponse.from_domain(updated)


@router.delete("/pools/{path:pool_name}", response=responses(None, 400, 404, status=204))
@needs("delete", Pool)
def delete_pool(request: HttpRequest, pool_name: str):
    pools.delete_pool(name=pool_name, actor=actor_of(request))
    return Status(204, None)
