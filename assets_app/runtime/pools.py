"""Pools (issue 39): operator-managed slot limits on the claimed and running TIs of the tasks
that name them (Airflow's `airflow/models/pool.py`, `/api/v2/pools`).

`default_pool` (128 slots, Airflow's `[core] default_pool_task_slot_count`) is created by the
migration that adds pools and again after a flush (`ensure_default_pool`, on post_migrate, as
Airflow's `db migrate` adds it when missing); it cannot be deleted or renamed, and only its
`slots` and `include_deferred` change (Airflow's `update_orm_from_pydantic`). A task naming a
pool that does not exist is synced as it is and its TIs are never claimed until the pool is
created (Airflow's scheduler logs it and does not queue them).

Every write is its own durable transaction, audited with the actor its door names. An edit
or delete of a pool takes that pool's row lock (a plain UPDATE / DELETE), which waits at most
for one claim transaction of that pool (`sql/locks.py`, step 0).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from ..catalog import listing
from ..guards import exceptions, limits
from ..models import DEFAULT_POOL_NAME, Pool
from ..models.pools import DEFAULT_POOL_SLOTS
from ..operations import audit
from ..sql import claims as claims_sql

POOL_ORDERING = listing.Ordering(
    keys={"id": "id", "pool": "name", "name": "name"},
    default=("id",),
)
POOL_FIELDS = ("name", "slots", "description", "include_deferred")
# What may change on `default_pool` (Airflow's patch route allows only these).
DEFAULT_POOL_FIELDS = ("slots", "include_deferred")


@dataclass(frozen=True)
class PoolSlots:
    """A pool and its slots as Airflow's `PoolResponse` counts them: running; queued (claimed
    by a worker, claim not expired); scheduled (queued here, not claimed yet); deferred;
    occupied (running + queued, + deferred when `include_deferred`); open (slots less
    occupied, None: unlimited)."""

    pool: Pool
    running: int = 0
    queued: int = 0
    scheduled: int = 0
    deferred: int = 0

    @property
    def occupied(self) -> int:
        return self.running + self.queued + (self.deferred if self.pool.include_deferred else 0)

    @property
    def open(self) -> int | None:
        return None if self.pool.slots == -1 else self.pool.slots - self.occupied


def ensure_default_pool() -> None:
    """Create `default_pool` with Airflow's default slots when it is missing (idempotent)."""
    Pool.objects.get_or_create(
        name=DEFAULT_POOL_NAME,
        defaults={"slots": DEFAULT_POOL_SLOTS, "description": "Default pool"},
    )


def with_slots(pools: Sequence[Pool]) -> list[PoolSlots]:
    """Each pool with its slot counts: 1 query for all of them (the live TIs of their tasks)."""
    expired = timezone.now() - timedelta(seconds=settings.WORKLOAD_CLAIM_TIMEOUT_SECONDS)
    counts = claims_sql.pool_slot_counts(names=[p.name for p in pools], expired=expired)
    return [PoolSlots(pool, *counts.get(pool.name, (0, 0, 0, 0))) for pool in pools]


def list_pools(
    *,
    pool_name_pattern: str | None = None,
    pool_name_prefix_pattern: str | None = None,
    order_by: Sequence[str] | None = None,
    limit: int = listing.DEFAULT_PAGE_LIMIT,
    offset: int = 0,
) -> listing.Page:
    found = Pool.objects.filter(
        listing.pattern_q("name", pool_name_pattern),
        listing.prefix_q("name", pool_name_prefix_pattern),
    )
    page = listing.offset_page(found, POOL_ORDERING, order_by=order_by, limit=limit, offset=offset)
    return listing.Page(rows=with_slots(page.rows), total_entries=page.total_entries)


def get_pool(*, name: str) -> PoolSlots:
    pool = Pool.objects.filter(name=name).first()
    if pool is None:
        raise exceptions.NotFound(f"The Pool with name: `{name}` was not found")
    return with_slots([pool])[0]


def _check(fields: dict[str, Any]) -> None:
    if "name" in fields and not fields["name"]:
        raise exceptions.InvalidInput("a pool name must not be empty", reason="invalid_name")
    if "slots" in fields and (
        fields["slots"] is None or not -1 <= fields["slots"] <= Pool.MAX_SLOTS
    ):
        raise exceptions.InvalidInput(
            f"slots must be -1 (unlimited) or a number of slots from 0 to {Pool.MAX_SLOTS}",
            reason="invalid_slots",
        )
    if "include_deferred" in fields and fields["include_deferred"] is None:
        raise exceptions.InvalidInput(
            "include_deferred must be true or false", reason="invalid_include_deferred"
        )
    limits.check_lengths(Pool, {k: v for k, v in fields.items() if k == "name"})


def _record(actor: audit.Actor | None, verb: str, name: str, fields: Sequence[str] = ()) -> None:
    audit.record(
        actor=actor,
        action=f"pool.{verb}",
        summary=f"{verb}d pool {name}",
        targets=[audit.Target(kind="pool", object_id=name)],
        detail={"name": name, "fields": sorted(fields)},
    )


def create_pool(
    *,
    name: str,
    slots: int,
    description: str | None = None,
    include_deferred: bool = False,
    actor: audit.Actor | None = None,
) -> PoolSlots:
    """A new pool; Conflict when `name` exists (Airflow's POST answers 409). Audited."""
    fields = {
        "name": name,
        "slots": slots,
        "description": description,
        "include_deferred": include_deferred,
    }
    _check(fields)
    try:
        with transaction.atomic(durable=True):
            pool = Pool.objects.create(**fields)
            _record(actor, "create", name, POOL_FIELDS)
    except IntegrityError:
        raise exceptions.Conflict(
            f"The Pool with name: `{name}` already exists", reason="already_exists"
        ) from None
    return with_slots([pool])[0]


def update_pool(
    *,
    name: str,
    changes: dict[str, Any],
    update_mask: Sequence[str] | None = None,
    actor: audit.Actor | None = None,
) -> PoolSlots:
    """Change an existing pool: the fields `changes` carries (what the body sent), only those
    `update_mask` also names when given (an update erases only what it names, invariant 19).
    `default_pool`: only `slots` and `include_deferred`, named by `update_mask` (Airflow's
    rule, 400 otherwise). A body naming another pool than the path: 400. NotFound when it does
    not exist. Audited."""
    fields = patched_fields(name, changes, update_mask)
    with transaction.atomic(durable=True):
        pool = Pool.objects.filter(name=name).first()
        if pool is None:
            raise exceptions.NotFound(f"The Pool with name: `{name}` was not found")
        write_pool(pool, fields, actor=actor)
    return with_slots([pool])[0]


def patched_fields(
    name: str, changes: dict[str, Any], update_mask: Sequence[str] | None
) -> dict[str, Any]:
    """The checked fields an update of pool `name` writes (`update_pool`'s rules)."""
    if changes.get("name") not in (None, name):
        raise exceptions.BadRequest(
            "Invalid body, pool name from request body doesn't match uri parameter",
            reason="name_mismatch",
        )
    if update_mask:
        # Airflow's `apply_patch_with_update_mask`: the fields the body carried that the mask
        # also names; a masked field the body left out keeps its value, other names are ignored.
        wanted = {"name" if m.strip() == "pool" else m.strip() for m in update_mask}
        fields = {k: v for k, v in changes.items() if k in wanted and k in POOL_FIELDS}
        fields.pop("name", None)
    else:
        fields = {k: v for k, v in changes.items() if k in POOL_FIELDS and k != "name"}
    if name == DEFAULT_POOL_NAME and not (
        update_mask and all(m.strip() in DEFAULT_POOL_FIELDS for m in update_mask)
    ):
        raise exceptions.BadRequest(
            "Only slots and included_deferred can be modified on Default Pool",
            reason="default_pool",
        )
    _check(fields)
    return fields


def write_pool(pool: Pool, fields: dict[str, Any], *, actor: audit.Actor | None) -> None:
    """Write checked `fields` to a pool row, audited, inside the caller's transaction."""
    for field, value in fields.items():
        setattr(pool, field, value)
    if fields:
        pool.save(update_fields=list(fields))
    _record(actor, "update", pool.name, list(fields))


def delete_pool(*, name: str, actor: audit.Actor | None = None) -> None:
    """Delete a pool (its tasks' TIs are then never claimed until it exists again). 400 for
    `default_pool` (Airflow: "Default Pool can't be deleted"), NotFound when missing. Audited."""
    if name == DEFAULT_POOL_NAME:
        raise exceptions.BadRequest("Default Pool can't be deleted", reason="default_pool")
    with transaction.atomic(durable=True):
        deleted, _ = Pool.objects.filter(name=name).delete()
        if not deleted:
            raise exceptions.NotFound(f"The Pool with name: `{name}` was not found")
        _record(actor, "delete", name)
