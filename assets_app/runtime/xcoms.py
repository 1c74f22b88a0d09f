"""XComs: values TIs push and later tasks pull (DESIGN 2), as the worker API serves them.

A value is the JSON the Task SDK sent (it serializes before sending), stored per
(dag_id, run_id, task_id, map_index, key). Writes are idempotent: pushing the same key again
replaces the value (one row, `xcom_unique`), deleting a missing one is a no-op.

The public API's XCom entries (`list_entries`, `get_entry`, `readable`) are read here too, with
the run's `logical_date` and `run_after` beside each value, as Airflow's XCom routes answer.
"""

import contextlib
import json
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.utils import timezone

from ..catalog import listing
from ..guards import exceptions, limits
from ..models import Dag, DagRun, Task, TaskInstance, XCom
from ..operations import audit


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


# --- the public API's XCom entries (Airflow 3.3.2 `routes/public/xcom.py`) --------------------

# Airflow's `get_xcom_entries` order_by names and default.
ENTRY_ORDERING = listing.Ordering(
    keys={
        "key": "key",
        "dag_id": "dag_id",
        "run_id": "run_id",
        "task_id": "task_id",
        "map_index": "map_index",
        "timestamp": "timestamp",
        "run_after": "run_after",
    },
    default=("dag_id", "task_id", "run_id", "map_index", "key"),
)


def _with_run_fields(queryset: QuerySet) -> QuerySet:
    """XComs of runs that exist (Airflow joins `dag_run`), each with its run's `logical_date`
    and `run_after`."""
    run = DagRun.objects.filter(dag_id=OuterRef("dag_id"), run_id=OuterRef("run_id"))
    return queryset.annotate(
        run_after=Subquery(run.values("run_after")[:1]),
        logical_date=Subquery(run.values("logical_date")[:1]),
    ).filter(run_after__isnull=False)


def list_entries(
    *,
    dag_id: str,
    run_id: str,
    task_id: str,
    limit: int,
    offset: int,
    order_by: Sequence[str] | None = None,
    xcom_key: str | None = None,
    map_index: int | None = None,
    xcom_key_pattern: str | None = None,
    xcom_key_prefix_pattern: str | None = None,
    dag_display_name_pattern: str | None = None,
    dag_display_name_prefix_pattern: str | None = None,
    run_id_pattern: str | None = None,
    run_id_prefix_pattern: str | None = None,
    task_id_pattern: str | None = None,
    task_id_prefix_pattern: str | None = None,
    map_index_filter: int | None = None,
    logical_date_gte: datetime | None = None,
    logical_date_gt: datetime | None = None,
    logical_date_lte: datetime | None = None,
    logical_date_lt: datetime | None = None,
    run_after_gte: datetime | None = None,
    run_after_gt: datetime | None = None,
    run_after_lte: datetime | None = None,
    run_after_lt: datetime | None = None,
) -> listing.Page:
    """XCom entries, a page by offset, with Airflow's filters: `~` for `dag_id`, `run_id` or
    `task_id` matches every one (`get_xcom_entries`). No lock; count and page."""
    q = Q()
    for field, value in (("dag_id", dag_id), ("run_id", run_id), ("task_id", task_id)):
        if value != "~":
            q &= Q(**{field: value})
    for index in (map_index, map_index_filter):
        if index is not None:
            q &= Q(map_index=index)
    if xcom_key is not None:
        q &= Q(key=xcom_key)
    # The Dag's display name is its id here.
    for field, pattern, prefix in (
        ("key", xcom_key_pattern, xcom_key_prefix_pattern),
        ("dag_id", dag_display_name_pattern, dag_display_name_prefix_pattern),
        ("run_id", run_id_pattern, run_id_prefix_pattern),
        ("task_id", task_id_pattern, task_id_prefix_pattern),
    ):
        q &= listing.pattern_q(field, pattern) & listing.prefix_q(field, prefix)
    q &= listing.range_q(
        "logical_date",
        gte=logical_date_gte,
        gt=logical_date_gt,
        lte=logical_date_lte,
        lt=logical_date_lt,
    )
    q &= listing.range_q(
        "run_after", gte=run_after_gte, gt=run_after_gt, lte=run_after_lte, lt=run_after_lt
    )
    return listing.offset_page(
        _with_run_fields(XCom.objects.all()).filter(q),
        ENTRY_ORDERING,
        order_by=order_by,
        limit=limit,
        offset=offset,
    )


def get_entry(*, dag_id: str, run_id: str, task_id: str, key: str, map_index: int = -1) -> XCom:
    """One XCom entry with its run's fields, or NotFound with Airflow's message."""
    found = (
        _with_run_fields(XCom.objects.all())
        .filter(dag_id=dag_id, run_id=run_id, task_id=task_id, key=key, map_index=map_index)
        .first()
    )
    if found is None:
        raise exceptions.NotFound(
            f"XCom entry with key: `{key}` not found", reason="xcom_entry_not_found"
        )
    return found


# Airflow 3.3.2's `airflow.serialization.stringify`: a serialized object rendered for people.
_CLASSNAME, _VERSION, _DATA = "__classname__", "__version__", "__data__"
_DAGBAG_PREFIX = re.compile(r"unusual_prefix_[a-f0-9]{40}_")


class _NotStringifiable(ValueError):
    """Airflow's StringifyNotSupportedError: an `airflow.` class needs full deserialization."""


def _stringify(value: Any) -> Any:
    if value is None or isinstance(value, (int, bool, float, str)):
        return value
    if isinstance(value, list):
        return [_stringify(item) for item in value]
    if not isinstance(value, dict):
        return value
    if "__type" in value and "__var" in value:  # the old serialization's spelling
        if value["__type"] == "dict":
            value = value["__var"]
        else:
            value = {_CLASSNAME: value["__type"], _VERSION: 0, _DATA: value["__var"]}
    if not isinstance(value, dict) or _CLASSNAME not in value or _VERSION not in value:
        if isinstance(value, dict):
            return {str(k): _stringify(v) for k, v in value.items()}
        return _stringify(value)
    classname, version, data = value[_CLASSNAME], value[_VERSION], value.get(_DATA)
    if not isinstance(classname, str) or not isinstance(version, int) or not classname:
        raise _NotStringifiable(f"cannot decode {value!r}")
    if classname.startswith("airflow."):
        raise _NotStringifiable(classname)
    if classname in ("builtins.tuple", "builtins.set", "builtins.frozenset") and isinstance(
        data, list
    ):
        return "(" + ",".join(str(_stringify(item)) for item in data) + ")"
    text = f"{_DAGBAG_PREFIX.sub('', classname)}@version={version}("
    if isinstance(data, (int, bool, float, str)):
        text += f"{data}"
    elif isinstance(data, list):
        text += ",".join(str(_stringify(item)) for item in data)
    elif isinstance(data, dict):
        text += ", ".join(
            f"{k}={v!r}" if isinstance(v, str) else f"{k}={_stringify(v)}" for k, v in data.items()
        )
    return text + ")"


def readable(value: Any) -> Any:
    """An XCom value as Airflow's `deserialize=true` shows it: a JSON string is parsed first, then
    serialized objects are rendered as `Class@version=N(...)` (Airflow's `stringify`). An
    `airflow.` class, which Airflow fully deserializes with its own classes, is left as stored:
    the service has none of them."""
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = json.loads(value)
    try:
        return _stringify(value)
    except _NotStringifiable:
        return value


# --- the public API's XCom writes (Airflow 3.3.2 `create_xcom_entry`, `update_xcom_entry`,
# `delete_xcom_entry`) ---------------------------------------------------------------------------

# Airflow's FORBIDDEN_XCOM_KEYS (`airflow._shared.serialization`): keys of its serialization that
# an operator's value may not carry, at any depth, so a read never deserializes what they wrote.
FORBIDDEN_KEYS = frozenset(
    {
        "__classname__",
        "__version__",
        "__data__",
        "__id__",
        "__cache__",
        "__type",
        "__source",
        "__var",
    }
)


def check_no_reserved_keys(value: Any, path: str = "value") -> None:
    """Airflow's `_check_forbidden_xcom_keys`: InvalidInput (422) naming the reserved keys a
    value (or a JSON text inside it, re-parsed as a read would) carries."""
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except ValueError:
            return
        if isinstance(decoded, (dict, list)):
            check_no_reserved_keys(decoded, path)
    elif isinstance(value, dict):
        found = FORBIDDEN_KEYS & value.keys()
        if found:
            raise exceptions.InvalidInput(
                f"XCom {path} contains reserved serialization keys: {', '.join(sorted(found))}. "
                "These keys are reserved for internal use.",
                reason="reserved_xcom_keys",
                loc=("body", "value"),
            )
        for k, v in value.items():
            check_no_reserved_keys(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_no_reserved_keys(item, f"{path}[{i}]")


def _record(actor: audit.Actor | None, verb: str, xcom: dict[str, Any]) -> None:
    audit.record(
        actor=actor,
        action=f"xcom.{verb}",
        summary=f"{verb}d XCom {xcom['key']} of {xcom['dag_id']}.{xcom['task_id']}"
        f"[{xcom['map_index']}] in run {xcom['run_id']}",
        targets=[audit.Target(kind="dag_run", object_id=f"{xcom['dag_id']}/{xcom['run_id']}")],
        dag_id=xcom["dag_id"],
        detail=xcom,
    )


def create_entry(
    *,
    dag_id: str,
    run_id: str,
    task_id: str,
    key: str,
    value: Any,
    map_index: int = -1,
    actor: audit.Actor | None = None,
) -> XCom:
    """An operator's new XCom (the public API's POST), own durable transaction, audited:
    NotFound for an unknown Dag, a task the Dag does not have or an unknown run (Airflow's
    messages, in its order); Conflict when the address holds a value already (the unique
    constraint decides under concurrency); BadRequest for an empty key."""
    if not key:
        raise exceptions.BadRequest("XCom key must be a non-empty string.", reason="invalid_key")
    check_no_reserved_keys(value)
    limits.check_lengths(XCom, _address(dag_id, run_id, task_id, key))
    limits.check_json(value, field="value", loc=("body", "value"))
    if not Dag.objects.filter(dag_id=dag_id).exists():
        raise exceptions.NotFound(
            f"The Dag with ID: `{dag_id}` was not found", reason="dag_not_found"
        )
    if not Task.objects.filter(dag_id=dag_id, task_id=task_id).exists():
        raise exceptions.NotFound(
            f"Task with ID: `{task_id}` not found in dag: `{dag_id}`", reason="task_not_found"
        )
    if not DagRun.objects.filter(dag_id=dag_id, run_id=run_id).exists():
        raise exceptions.NotFound(
            f"Dag Run with ID: `{run_id}` not found for dag: `{dag_id}`",
            reason="dag_run_not_found",
        )
    address = {**_address(dag_id, run_id, task_id, key), "map_index": map_index}
    try:
        with transaction.atomic(durable=True):
            XCom.objects.create(**address, value=value)
            _record(actor, "create", address)
    except IntegrityError:
        raise exceptions.Conflict(
            f"The XCom with key: `{key}` with mentioned task instance already exists.",
            reason="already_exists",
        ) from None
    return get_entry(dag_id=dag_id, run_id=run_id, task_id=task_id, key=key, map_index=map_index)


def _missing(key: str) -> exceptions.NotFound:
    return exceptions.NotFound(
        f"The XCom with key: `{key}` with mentioned task instance doesn't exist.",
        reason="xcom_entry_not_found",
    )


def update_entry(
    *,
    dag_id: str,
    run_id: str,
    task_id: str,
    key: str,
    value: Any,
    map_index: int = -1,
    actor: audit.Actor | None = None,
) -> XCom:
    """Replace the value of an existing XCom (the public API's PATCH), own durable
    transaction, audited; NotFound (nothing written) when there is none."""
    check_no_reserved_keys(value)
    limits.check_json(value, field="value", loc=("body", "value"))
    address = {**_address(dag_id, run_id, task_id, key), "map_index": map_index}
    with transaction.atomic(durable=True):
        if not XCom.objects.filter(**address).update(value=value, timestamp=timezone.now()):
            raise _missing(key)
        _record(actor, "update", address)
    return get_entry(dag_id=dag_id, run_id=run_id, task_id=task_id, key=key, map_index=map_index)


def delete_entry(
    *,
    dag_id: str,
    run_id: str,
    task_id: str,
    key: str,
    map_index: int = -1,
    actor: audit.Actor | None = None,
) -> None:
    """Delete one XCom (the public API's DELETE), own durable transaction, audited; NotFound
    (nothing written) when there is none."""
    address = {**_address(dag_id, run_id, task_id, key), "map_index": map_index}
    with transaction.atomic(durable=True):
        deleted, _ = XCom.objects.filter(**address).delete()
        if not deleted:
            raise _missing(key)
        _record(actor, "delete", address)
