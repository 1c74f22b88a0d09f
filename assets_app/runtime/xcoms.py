"""XComs: values TIs push and later tasks pull (DESIGN 2), as the worker API serves them.

A value is the JSON the Task SDK sent (it serializes before sending), stored per
(dag_id, run_id, task_id, map_index, key). Writes are idempotent: pushing the same key again
replaces the value (one row, `xcom_unique`), deleting a missing one is a no-op.
"""

from typing import Any

from django.conf import settings
from django.db import transaction

from ..guards import exceptions, limits
from ..models import DagRun, TaskInstance, XCom


def _address(dag_id: str, run_id: str, task_id: str, key: str) -> dict[str, Any]:
    return {"dag_id": dag_id, "run_id": run_id, "task_id": task_id, "key": key}


def push(
    *,
    dag_id: str,
    run_id: str,
    task_id: str,
    key: str,
    value: Any,
    map_index: int = -1,
    mapped_length: int | None = None,
) -> XCom:
    """Store `value` under the address, replacing an earlier one (own durable transaction).
    NotFound when the run does not exist (as Airflow: an XCom belongs to a run); InvalidInput
    when `value` passes a `limits` JSON rule (depth, width, size). `mapped_length` is what the
    Task SDK sends with the return value of an unmapped task that has mapped downstreams
    (`len(value)`, task-sdk 1.3.2 `_push_xcom_if_needed`); beyond MAX_MAP_LENGTH the push is
    refused before anything is written, as Airflow 3.3.2's `set_xcom` does; within it, it is
    stored with the value (Airflow's TaskMap row) for `mapping.expand`."""
    if not key:
        raise exceptions.BadRequest("XCom key must be a non-empty string.", reason="invalid_key")
    if mapped_length is not None and mapped_length > settings.MAX_MAP_LENGTH:
        raise exceptions.BadRequest(
            "pushed value is too large to map as a downstream's dependency "
            f"(length {mapped_length}, max_map_length {settings.MAX_MAP_LENGTH})",
            reason="unmappable_return_value_length",
        )
    limits.check_lengths(XCom, _address(dag_id, run_id, task_id, key))
    limits.check_json(value, field="value", loc=("body",))
    if not DagRun.objects.filter(dag_id=dag_id, run_id=run_id).exists():
        raise exceptions.NotFound(
            f"DAG run not found on DAG {dag_id!r} with ID {run_id!r}", reason="dag_run_not_found"
        )
    with transaction.atomic(durable=True):
        xcom, _ = XCom.objects.update_or_create(
            **_address(dag_id, run_id, task_id, key),
            map_index=map_index,
            defaults={"value": value, "mapped_length": mapped_length},
        )
    return xcom


def pull(
    *,
    dag_id: str,
    run_id: str,
    task_id: str,
    key: str,
    map_index: int = -1,
    offset: int | None = None,
) -> Any:
    """The value at `map_index`, or with `offset` the offset-th non-null value in map index
    order (negative: from the end). NotFound (`not_found`) when there is none."""
    rows = XCom.objects.filter(**_address(dag_id, run_id, task_id, key))
    if offset is None:
        found = rows.filter(map_index=map_index).values_list("value", flat=True).first()
        exists = found is not None or rows.filter(map_index=map_index).exists()
        where = f"map_index={map_index}"
    else:
        rows = rows.exclude(value=None)
        ordered = rows.order_by("map_index" if offset >= 0 else "-map_index")
        position = offset if offset >= 0 else -1 - offset
        picked = list(ordered.values_list("value", flat=True)[position : position + 1])
        exists, found = bool(picked), picked[0] if picked else None
        where = f"offset={offset}"
    if not exists:
        raise exceptions.NotFound(
            f"XCom with key={key!r} {where} not found for task {task_id!r} in DAG run "
            f"{run_id!r} of {dag_id!r}"
        )
    return found


def count(*, dag_id: str, run_id: str, task_id: str, key: str) -> int:
    """How many (mapped) values the address has, over every map index."""
    return XCom.objects.filter(**_address(dag_id, run_id, task_id, key)).count()


def _values(*, dag_id: str, run_id: str, task_id: str, key: str) -> list[Any]:
    return list(
        XCom.objects.filter(**_address(dag_id, run_id, task_id, key))
        .order_by("map_index")
        .values_list("value", flat=True)
    )


def item(*, dag_id: str, run_id: str, task_id: str, key: str, offset: int) -> Any:
    """The offset-th value in map index order (negative from the end, as a sequence);
    NotFound past either end."""
    values = _values(dag_id=dag_id, run_id=run_id, task_id=task_id, key=key)
    if not -len(values) <= offset < len(values):
        raise exceptions.NotFound(
            f"XCom with key={key!r} offset={offset} not found for task {task_id!r} in DAG run "
            f"{run_id!r} of {dag_id!r}"
        )
    return values[offset]


def value_slice(
    *,
    dag_id: str,
    run_id: str,
    task_id: str,
    key: str,
    start: int | None,
    stop: int | None,
    step: int | None,
) -> list[Any]:
    """`values[start:stop:step]` of the values in map index order (Python's slice rules)."""
    if step == 0:
        raise exceptions.BadRequest("slice step cannot be zero", reason="invalid_slice")
    values = _values(dag_id=dag_id, run_id=run_id, task_id=task_id, key=key)
    return values[start:stop:step]


def delete(*, dag_id: str, run_id: str, task_id: str, key: str, map_index: int = -1) -> int:
    """Delete the value at the address (none there: nothing happens). Returns rows deleted."""
    deleted, _ = XCom.objects.filter(
        **_address(dag_id, run_id, task_id, key), map_index=map_index
    ).delete()
    return deleted


def keys_of(ti: TaskInstance) -> list[str]:
    """The keys a TI already pushed (an earlier try's): the run context lists them as
    `xcom_keys_to_clear` and the Task SDK deletes them before the new try runs."""
    return list(
        XCom.objects.filter(
            dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id, map_index=ti.map_index
        )
        .order_by("key")
        .values_list("key", flat=True)
    )
