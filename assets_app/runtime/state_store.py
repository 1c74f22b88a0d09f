"""The task and asset state store (Airflow 3.3's AIP-103), as Airflow 3.3.2 keeps it.

- **Task state** is scoped to (run, task_id, map_index) (Airflow's `TaskScope`): every try of a
  TI, and the TI cleared and run again, reads what an earlier one wrote; another run of the Dag
  starts empty. Clearing a TI or a run keeps its keys (Airflow's `clear_task_instances` does not
  touch them; `[state_store] clear_on_success` is off by default); deleting the run deletes
  them (the foreign key's cascade; retention deletes them with the run).
- **Asset state** is scoped to the asset (Airflow's `AssetScope`), across runs and Dags: a
  producer's watermark its consumers read. It lives until deleted or its asset is; each write
  records its writer (`AssetStateWriter`: the TI of a task write, none for the API's).

A value is the JSON text of what the caller sent, stored and returned verbatim (Airflow's Text
column). Every write is its own durable transaction, one `INSERT ... ON CONFLICT DO UPDATE` on
the scope's unique constraint (`task_state_store_unique`, `asset_state_store_unique`): a replay
writes the same row again, two writers racing on a key end with one row (the last one's value),
and no TI or run row is locked. A delete of a missing key, and a clear of an empty scope, is a
no-op (Airflow's). Writes through the public API and the admin, and every asset write, are
audited in their transaction; a task's writes to its own task state are not (as its XComs).

Bounds (Airflow's): a key is 1 to 512 characters (its column; longer is a 422 here where
Airflow's database would fail); a value is not null and, as every JSON value a caller gives us,
within `guards.limits`; through the public API at most STATE_STORE_MAX_VALUE_BYTES bytes of JSON
(Airflow's `[state_store] max_value_storage_bytes`, 65535; 0 = no limit), while a worker's write
is only held to the request body limit (Airflow logs a warning on the worker and writes it).
"""

import json
import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from ..guards import exceptions, limits
from ..models import Asset, AssetStateStore, AssetStateWriter, TaskInstance, TaskStateStore
from ..operations import audit


@dataclass(frozen=True)
class TaskScope:
    """Where a TI's keys live: its run (by row id and by ids), task and map index."""

    dag_run_id: int
    dag_id: str
    run_id: str
    task_id: str
    map_index: int

    def rows(self) -> QuerySet[TaskStateStore]:
        return TaskStateStore.objects.filter(
            dag_run_id=self.dag_run_id, task_id=self.task_id, map_index=self.map_index
        )


@dataclass(frozen=True)
class Writer:
    """Who writes an asset key: a task (its TI's ids) or the API (none)."""

    kind: str
    dag_id: str | None = None
    run_id: str | None = None
    task_id: str | None = None
    map_index: int | None = None


API_WRITER = Writer(kind=AssetStateWriter.API)


def task_scope(*, ti_id: Any) -> TaskScope:
    """The scope of TI `ti_id` (one query); NotFound when it does not exist."""
    row = (
        TaskInstance.objects.filter(id=ti_id)
        .values_list("dag_run_id", "dag_id", "run_id", "task_id", "map_index")
        .first()
    )
    if row is None:
        raise exceptions.NotFound(f"Task instance {ti_id} not found")
    return TaskScope(*row)


def task_scope_at(
    *, dag_id: str, run_id: str, task_id: str, map_index: int | None = -1
) -> TaskScope | None:
    """The scope of the TI at this address (the public API's), None when there is none;
    `map_index=None`: any map index of the task (a clear of all of them)."""
    tis = TaskInstance.objects.filter(dag_id=dag_id, run_id=run_id, task_id=task_id)
    if map_index is not None:
        tis = tis.filter(map_index=map_index)
    row = tis.values_list("dag_run_id", "dag_id", "run_id", "task_id", "map_index").first()
    if row is None:
        return None
    return TaskScope(*row[:4], map_index if map_index is not None else row[4])


def require_task_scope(
    *, dag_id: str, run_id: str, task_id: str, map_index: int | None = -1
) -> TaskScope:
    """`task_scope_at`, NotFound with Airflow's message when the TI does not exist."""
    scope = task_scope_at(dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=map_index)
    if scope is None:
        addressed = "all_map_indices=True" if map_index is None else f"map_index={map_index}"
        raise exceptions.NotFound(
            f"Task instance not found for dag_id={dag_id!r}, run_id={run_id!r}, "
            f"task_id={task_id!r}, {addressed}"
        )
    return scope


def asset_by_id(*, asset_id: int) -> Asset:
    """The asset by id; NotFound (Airflow's message) when there is none."""
    found = Asset.objects.filter(pk=asset_id).first()
    if found is None:
        raise exceptions.NotFound(f"Asset with id {asset_id!r} not found")
    return found


def asset_of(*, name: str | None = None, uri: str | None = None) -> Asset:
    """The asset by name or by URI; NotFound (Airflow's message) when there is none."""
    if name is not None:
        found = Asset.objects.filter(name=name).first()
        what = f"name={name!r}"
    else:
        found = Asset.objects.filter(uri=uri).first()
        what = f"uri={uri!r}"
    if found is None:
        raise exceptions.NotFound(f"Asset with {what} not found")
    return found


def _check_key(key: str) -> None:
    if not key:
        raise exceptions.InvalidInput(
            "state store key must be a non-empty string", reason="invalid_key", loc=["key"]
        )
    limits.check_lengths(TaskStateStore, {"key": key})


def encode_value(value: Any, *, public: bool = False) -> str:
    """The JSON text stored for `value`: InvalidInput for null, a non-finite number, a value
    past `guards.limits`, or (`public`) one longer than STATE_STORE_MAX_VALUE_BYTES."""
    if value is None:
        raise exceptions.InvalidInput("value cannot be null", reason="invalid_value", loc=["value"])
    if isinstance(value, float) and not math.isfinite(value):
        raise exceptions.InvalidInput(
            "value must be a finite number; NaN and Inf are not JSON representable",
            reason="invalid_value",
            loc=["value"],
        )
    limits.check_json(value, field="value", loc=("body", "value"))
    try:
        text = json.dumps(value, allow_nan=False)
    except ValueError as exc:
        raise exceptions.InvalidInput(
            f"value is not JSON representable: {exc}", reason="invalid_value", loc=["value"]
        ) from exc
    limit = settings.STATE_STORE_MAX_VALUE_BYTES
    if public and limit > 0 and len(text.encode()) > limit:
        raise exceptions.InvalidInput(
            f"value exceeds max_value_storage_bytes ({limit}); raise "
            "STATE_STORE_MAX_VALUE_BYTES or set it to 0 to disable the limit",
            reason="value_too_large",
            loc=["value"],
            limit=limit,
        )
    return text


# --- task state -------------------------------------------------------------------------------


def get_task_value(*, scope: TaskScope, key: str) -> str:
    """The stored JSON text of `key`; NotFound (`not_found`) when it is not set."""
    return get_task_row(scope=scope, key=key).value


def get_task_row(*, scope: TaskScope | None, key: str) -> TaskStateStore:
    """The row of `key` (None scope: no TI there); NotFound when it is not set."""
    row = None if scope is None else scope.rows().filter(key=key).first()
    if row is None:
        raise exceptions.NotFound(f"Task state store key {key!r} not found")
    return row


def patch_task_value(*, scope: TaskScope, key: str, value: Any, actor: audit.Actor) -> None:
    """Replace the value of an existing key, keeping its expiry (the public API's PATCH);
    NotFound when it is not set. Own durable transaction, audited."""
    _check_key(key)
    text = encode_value(value, public=True)
    with transaction.atomic(durable=True):
        updated = scope.rows().filter(key=key).update(value=text, updated_at=timezone.now())
        if not updated:
            raise exceptions.NotFound(f"Task state store key {key!r} not found")
        _audit_task(actor, "task_state.set", f"set task state {key}", scope, key=key)


def set_task_value(
    *,
    scope: TaskScope,
    key: str,
    value: Any,
    expires_at: datetime | None = None,
    public: bool = False,
    actor: audit.Actor | None = None,
) -> None:
    """Create or replace `key` (own durable transaction, one upsert; a replay rewrites the same
    row). `actor`: audit the write (the public API's and the admin's doors)."""
    _check_key(key)
    text = encode_value(value, public=public)
    row = TaskStateStore(
        dag_run_id=scope.dag_run_id,
        dag_id=scope.dag_id,
        run_id=scope.run_id,
        task_id=scope.task_id,
        map_index=scope.map_index,
        key=key,
        value=text,
        updated_at=timezone.now(),
        expires_at=expires_at,
    )
    with transaction.atomic(durable=True):
        TaskStateStore.objects.bulk_create(
            [row],
            update_conflicts=True,
            unique_fields=["dag_run", "task_id", "map_index", "key"],
            update_fields=["value", "updated_at", "expires_at"],
        )
        if actor is not None:
            _audit_task(actor, "task_state.set", f"set task state {key}", scope, key=key)


def delete_task_value(*, scope: TaskScope, key: str, actor: audit.Actor | None = None) -> int:
    """Delete `key` (a missing one: nothing happens); rows deleted. Own durable transaction."""
    with transaction.atomic(durable=True):
        deleted, _ = scope.rows().filter(key=key).delete()
        if actor is not None and deleted:
            _audit_task(actor, "task_state.delete", f"deleted task state {key}", scope, key=key)
    return deleted


def clear_task_values(
    *, scope: TaskScope, all_map_indices: bool = False, actor: audit.Actor | None = None
) -> int:
    """Delete every key of the TI (`all_map_indices`: of every map index of its task, the
    public API's and CLI's option, never a running task's); rows deleted."""
    rows = scope.rows()
    if all_map_indices:
        rows = TaskStateStore.objects.filter(dag_run_id=scope.dag_run_id, task_id=scope.task_id)
    with transaction.atomic(durable=True):
        deleted, _ = rows.delete()
        if actor is not None and deleted:
            _audit_task(actor, "task_state.clear", "cleared task state", scope, rows=deleted)
    return deleted


def task_values(*, scope: TaskScope, all_map_indices: bool = False) -> QuerySet[TaskStateStore]:
    """The TI's keys in key order (the public API's list)."""
    if all_map_indices:
        return TaskStateStore.objects.filter(
            dag_run_id=scope.dag_run_id, task_id=scope.task_id
        ).order_by("map_index", "key")
    return scope.rows().order_by("key")


def _audit_task(actor: audit.Actor, action: str, summary: str, scope: TaskScope, **detail) -> None:
    audit.record(
        actor=actor,
        action=action,
        summary=f"{summary} of {scope.dag_id}.{scope.task_id}[{scope.map_index}] ({scope.run_id})",
        targets=[audit.Target(kind="dag_run", object_id=scope.dag_run_id)],
        dag_id=scope.dag_id,
        detail={"task_id": scope.task_id, "map_index": scope.map_index, **detail},
    )


# --- asset state ------------------------------------------------------------------------------


def get_asset_value(*, asset: Asset, key: str) -> str:
    """The stored JSON text of the asset's `key`; NotFound when it is not set."""
    return get_asset_row(asset=asset, key=key).value


def get_asset_row(*, asset: Asset, key: str) -> AssetStateStore:
    """The row of the asset's `key`; NotFound when it is not set."""
    row = AssetStateStore.objects.filter(asset=asset, key=key).first()
    if row is None:
        raise exceptions.NotFound(f"Asset state store key {key!r} not found")
    return row


def set_asset_value(
    *,
    asset: Asset,
    key: str,
    value: Any,
    writer: Writer,
    actor: audit.Actor | None,
    public: bool = False,
) -> None:
    """Create or replace the asset's `key`, recording `writer` (own durable transaction, one
    upsert, audited in it)."""
    _check_key(key)
    text = encode_value(value, public=public)
    row = AssetStateStore(
        asset=asset,
        key=key,
        value=text,
        updated_at=timezone.now(),
        last_updated_by_kind=writer.kind,
        last_updated_by_dag_id=writer.dag_id,
        last_updated_by_run_id=writer.run_id,
        last_updated_by_task_id=writer.task_id,
        last_updated_by_map_index=writer.map_index,
    )
    with transaction.atomic(durable=True):
        AssetStateStore.objects.bulk_create(
            [row],
            update_conflicts=True,
            unique_fields=["asset", "key"],
            update_fields=[
                "value",
                "updated_at",
                "last_updated_by_kind",
                "last_updated_by_dag_id",
                "last_updated_by_run_id",
                "last_updated_by_task_id",
                "last_updated_by_map_index",
            ],
        )
        _audit_asset(actor, "asset_state.set", f"set asset state {key}", asset, key=key)


def delete_asset_value(*, asset: Asset, key: str, actor: audit.Actor | None) -> int:
    """Delete the asset's `key` (missing: nothing happens); rows deleted."""
    with transaction.atomic(durable=True):
        deleted, _ = AssetStateStore.objects.filter(asset=asset, key=key).delete()
        if deleted:
            _audit_asset(actor, "asset_state.delete", f"deleted asset state {key}", asset, key=key)
    return deleted


def clear_asset_values(*, asset: Asset, actor: audit.Actor | None) -> int:
    """Delete every key of the asset; rows deleted."""
    with transaction.atomic(durable=True):
        deleted, _ = AssetStateStore.objects.filter(asset=asset).delete()
        if deleted:
            _audit_asset(actor, "asset_state.clear", "cleared asset state", asset, rows=deleted)
    return deleted


def asset_values(*, asset: Asset) -> QuerySet[AssetStateStore]:
    """The asset's keys in key order (the public API's list)."""
    return AssetStateStore.objects.filter(asset=asset).order_by("key")


def _audit_asset(
    actor: audit.Actor | None, action: str, summary: str, asset: Asset, **detail
) -> None:
    audit.record(
        actor=actor,
        action=action,
        summary=f"{summary} of asset {asset.name}",
        targets=[audit.Target(kind="asset", object_id=asset.pk)],
        detail=detail,
    )
