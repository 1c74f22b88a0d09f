"""Bulk create / update / delete of Variables, Connections and Pools: Airflow 3.3.2's
`PATCH /api/v2/variables`, `/connections` and `/pools` (`BulkService` and its subclasses in
`api_fastapi/core_api/services/public/`), which `airflowctl variables|connections|pools import`
use.

A request is a list of actions, applied in order, in one transaction. Each action answers its
own result: the keys it wrote (`success`) or the one error that stopped it (`errors`, Airflow's
message). An action that fails writes nothing (its savepoint is rolled back; Airflow keeps the
entities an update wrote before the failing one), and the other actions still apply, as in
Airflow. Per action:

- `create`: `action_on_existence` `fail` (409 naming the existing keys, nothing created),
  `skip` (existing keys left alone) or `overwrite` (an existing row gets the fields the entity
  carried; a Variable its value and description, as Airflow's `Variable.set`);
- `update`: the rules of each route's own PATCH (`variables.update_variable`,
  `variables.patch_connection`, `pools.update_pool`), with the action's `update_mask`;
  `action_on_non_existence` `fail` (404 naming the missing keys) or `skip`;
- `delete`: by key, `action_on_non_existence` as for updates. `default_pool` is never deleted
  (Airflow's bulk delete would delete it; its single DELETE refuses).

Every write is audited as the single routes' writes are. At most `MAX_ENTITIES` entities per
request (Airflow has no limit): more is refused before anything is read.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from django.db import IntegrityError, transaction

from ..guards import encryption, exceptions, limits
from ..models import DEFAULT_POOL_NAME, Connection, Pool, Variable
from ..operations import audit
from . import pools, variables

MAX_ENTITIES = 1000

ActionName = Literal["create", "update", "delete"]
Permission = Literal["add", "change", "delete"]
NEEDED: dict[ActionName, Permission] = {"create": "add", "update": "change", "delete": "delete"}


@dataclass(frozen=True)
class Action:
    """One action of a bulk request. `entities`: for `create` and `update`, the fields each
    entity carried (only those its body set, the key included); for `delete`, the keys."""

    action: ActionName
    entities: Sequence[Any]
    action_on_existence: Literal["fail", "skip", "overwrite"] = "fail"
    action_on_non_existence: Literal["fail", "skip"] = "fail"
    update_mask: Sequence[str] | None = None


@dataclass
class ActionResult:
    success: list[str] = field(default_factory=list)
    errors: list[exceptions.DomainError] = field(default_factory=list)


@dataclass(frozen=True)
class Kind:
    """How one model is written in bulk."""

    model: type[Variable] | type[Connection] | type[Pool]
    key_field: str  # the model's key column
    entity_key: str  # the key's name in an entity
    noun: str  # Airflow's words in its messages: "variables", "connections", "pools"
    keys_word: str  # "keys", "connection_ids", "pool names"
    create: Callable[[dict[str, Any], audit.Actor | None], None]
    overwrite: Callable[[Any, dict[str, Any], audit.Actor | None], None]
    update: Callable[[Any, dict[str, Any], Sequence[str] | None, audit.Actor | None], None]
    delete: Callable[[Any, audit.Actor | None], None]


def _keys_text(keys: set[str]) -> str:
    """A set of keys as Airflow's messages print one (`{'a', 'b'}`), in a stable order."""
    return "{" + ", ".join(repr(key) for key in sorted(keys)) + "}"


# --- variables ----------------------------------------------------------------------------------


def _variable_create(entity: dict[str, Any], actor: audit.Actor | None) -> None:
    key = entity["key"]
    limits.check_lengths(Variable, {"key": key})
    Variable.objects.create(
        key=key,
        description=entity.get("description"),
        **variables._stored_value(entity.get("value")),
    )
    variables._record(actor, "variable.create", "variable", key, ("value", "description"))


def _variable_overwrite(row: Variable, entity: dict[str, Any], actor: audit.Actor | None) -> None:
    # Airflow's `Variable.set`: the value and the description (None when the entity has none).
    fields = {"value": entity.get("value"), "description": entity.get("description")}
    variables.write_variable(row, fields, actor=actor)


def _variable_update(
    row: Variable, entity: dict[str, Any], mask: Sequence[str] | None, actor: audit.Actor | None
) -> None:
    fields = variables._masked(entity, mask, allowed=("value", "description"), immutable=("key",))
    variables.write_variable(row, fields, actor=actor)


def _variable_delete(row: Variable, actor: audit.Actor | None) -> None:
    row.delete()
    variables._record(actor, "variable.delete", "variable", row.key)


# --- connections --------------------------------------------------------------------------------


def _connection_create(entity: dict[str, Any], actor: audit.Actor | None) -> None:
    conn_id = entity["connection_id"]
    plain = {name: entity.get(name) for name in variables.CONNECTION_FIELDS}
    limits.check_lengths(Connection, {"conn_id": conn_id, **plain})
    secrets = {name: entity.get(name) for name in ("password", "extra")}
    if any(value is not None for value in secrets.values()):
        encryption.check_key_reads_stored()
    Connection.objects.create(
        conn_id=conn_id,
        **plain,
        **{name: encryption.encrypt(value) for name, value in secrets.items()},
    )
    written = [name for name, value in {**plain, **secrets}.items() if value is not None]
    variables._record(actor, "connection.create", "connection", conn_id, written)


def _connection_overwrite(
    row: Connection, entity: dict[str, Any], actor: audit.Actor | None
) -> None:
    # Airflow sets the fields the entity carried (`exclude_unset`), its password through
    # `set_password`, which keeps the stored one for a null or empty value: `patch_connection`'s
    # rules without a mask, but `extra` replaced rather than merged.
    sent = {k: v for k, v in entity.items() if k != "connection_id"}
    if "extra" in sent:
        extra = sent.pop("extra")
        if extra is not None:
            encryption.check_key_reads_stored()
        row.extra = encryption.encrypt(extra)
    variables.patch_connection_row(row, sent, None, actor=actor)


def _connection_update(
    row: Connection, entity: dict[str, Any], mask: Sequence[str] | None, actor: audit.Actor | None
) -> None:
    sent = {k: v for k, v in entity.items() if k != "connection_id"}
    variables.patch_connection_row(row, sent, mask, actor=actor)


def _connection_delete(row: Connection, actor: audit.Actor | None) -> None:
    row.delete()
    variables._record(actor, "connection.delete", "connection", row.conn_id)


# --- pools --------------------------------------------------------------------------------------


def _pool_create(entity: dict[str, Any], actor: audit.Actor | None) -> None:
    fields = {
        "name": entity["name"],
        "slots": entity.get("slots"),
        "description": entity.get("description"),
        "include_deferred": entity.get("include_deferred", False),
    }
    pools._check(fields)
    Pool.objects.create(**fields)
    pools._record(actor, "create", fields["name"], pools.POOL_FIELDS)


def _pool_overwrite(row: Pool, entity: dict[str, Any], actor: audit.Actor | None) -> None:
    # Airflow sets the fields the entity carried (`exclude_unset`), on `default_pool` too.
    fields = {k: v for k, v in entity.items() if k in pools.POOL_FIELDS and k != "name"}
    pools._check(fields)
    pools.write_pool(row, fields, actor=actor)


def _pool_update(
    row: Pool, entity: dict[str, Any], mask: Sequence[str] | None, actor: audit.Actor | None
) -> None:
    pools.write_pool(row, pools.patched_fields(row.name, entity, mask), actor=actor)


def _pool_delete(row: Pool, actor: audit.Actor | None) -> None:
    if row.name == DEFAULT_POOL_NAME:
        raise exceptions.BadRequest("Default Pool can't be deleted", reason="default_pool")
    row.delete()
    pools._record(actor, "delete", row.name)


VARIABLES = Kind(
    model=Variable,
    key_field="key",
    entity_key="key",
    noun="variables",
    keys_word="keys",
    create=_variable_create,
    overwrite=_variable_overwrite,
    update=_variable_update,
    delete=_variable_delete,
)
CONNECTIONS = Kind(
    model=Connection,
    key_field="conn_id",
    entity_key="connection_id",
    noun="connections",
    keys_word="connection_ids",
    create=_connection_create,
    overwrite=_connection_overwrite,
    update=_connection_update,
    delete=_connection_delete,
)
POOLS = Kind(
    model=Pool,
    key_field="name",
    entity_key="name",
    noun="pools",
    keys_word="pool names",
    create=_pool_create,
    overwrite=_pool_overwrite,
    update=_pool_update,
    delete=_pool_delete,
)


# --- the request --------------------------------------------------------------------------------


def permissions_needed(actions: Sequence[Action]) -> list[Permission]:
    """The model permissions a request needs, as Airflow's `requires_access_*_bulk` asks them:
    `add` for a create (and `change` when it may overwrite), `change` for an update, `delete`
    for a delete."""
    needed: list[Permission] = []
    for action in actions:
        wanted: list[Permission] = [NEEDED[action.action]]
        if action.action == "create" and action.action_on_existence == "overwrite":
            wanted.append("change")
        needed += [w for w in wanted if w not in needed]
    return needed


def apply(
    kind: Kind, actions: Sequence[Action], *, actor: audit.Actor | None = None
) -> dict[str, ActionResult]:
    """Apply a bulk request (one transaction); the result of each action name requested."""
    total = sum(len(action.entities) for action in actions)
    if total > MAX_ENTITIES:
        raise exceptions.BadRequest(
            f"A bulk request carries at most {MAX_ENTITIES} entities; this one carries {total}. "
            "Split it into several requests.",
            reason="too_many_entities",
        )
    results: dict[str, ActionResult] = {}
    with transaction.atomic(durable=True):
        for action in actions:
            result = results.setdefault(action.action, ActionResult())
            written: list[str] = []
            try:
                with transaction.atomic():
                    _apply_one(kind, action, written, actor)
            except exceptions.DomainError as exc:
                result.errors.append(exc)
                continue
            except IntegrityError:
                result.errors.append(
                    exceptions.Conflict(
                        f"The {kind.noun} with these {kind.keys_word} were written twice in one "
                        "action.",
                        reason="duplicate_entities",
                    )
                )
                continue
            result.success += written
    return results


def _key_of(kind: Kind, action: Action, entity: Any) -> str:
    if action.action == "delete":
        # Airflow takes a key or an entity object (whose key is then used).
        return entity[kind.entity_key] if isinstance(entity, dict) else str(entity)
    return entity[kind.entity_key]


def _apply_one(kind: Kind, action: Action, written: list[str], actor: audit.Actor | None) -> None:
    keys = {_key_of(kind, action, entity) for entity in action.entities}
    existing = {
        getattr(row, kind.key_field): row
        for row in kind.model.objects.select_for_update().filter(**{f"{kind.key_field}__in": keys})
    }
    missing = keys - set(existing)
    if action.action == "create":
        found = keys & set(existing)
        if action.action_on_existence == "fail" and found:
            raise exceptions.Conflict(
                f"The {kind.noun} with these {kind.keys_word}: {_keys_text(found)} already exist.",
                reason="already_exists",
            )
        for entity in action.entities:
            key = entity[kind.entity_key]
            if key in existing:
                if action.action_on_existence == "skip":
                    continue
                kind.overwrite(existing[key], entity, actor)
            else:
                kind.create(entity, actor)
            written.append(key)
        return
    if action.action_on_non_existence == "fail" and missing:
        raise exceptions.NotFound(
            f"The {kind.noun} with these {kind.keys_word}: {_keys_text(missing)} were not found.",
            reason="not_found",
        )
    if action.action == "update":
        for entity in action.entities:
            key = entity[kind.entity_key]
            if key in existing:
                kind.update(existing[key], entity, action.update_mask, actor)
                written.append(key)
        return
    for key in sorted(keys & set(existing)):
        kind.delete(existing[key], actor)
        written.append(key)
