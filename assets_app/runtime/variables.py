"""Variables and Connections: operator-managed settings tasks read at run time (DESIGN 2).

Connections keep `password` and `extra` encrypted at rest (`encryption`); `reveal` is the one
place that decrypts them. Every write is its own durable transaction and idempotent (a PUT of the
same key replaces, a delete of a missing key is NotFound and writes nothing), and is audited in
that transaction (`audit.record`, issue 26) with the `actor` its door names: the public API's
user, the admin's, or the running TI of a worker-API call. An entry names the key and the fields
written, never a value.
"""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction

from ..catalog import listing
from ..guards import encryption, exceptions, limits, masking
from ..models import Connection, Variable
from ..operations import audit

# --- variables ---------------------------------------------------------------------------------


def get_variable(*, key: str) -> Variable:
    variable = Variable.objects.filter(key=key).first()
    if variable is None:
        raise exceptions.NotFound(f"Variable with key '{key}' not found")
    return variable


def variable_keys(*, prefix: str | None = None, limit: int = 1000, offset: int = 0):
    """(a page of the keys in key order, optionally starting with `prefix`; the total)."""
    found = Variable.objects.order_by("key")
    if prefix is not None:
        found = found.filter(key__startswith=prefix)
    return list(found.values_list("key", flat=True)[offset : offset + limit]), found.count()


def _record(
    actor: audit.Actor | None, action: str, kind: str, key: str, fields: Sequence[str] = ()
) -> None:
    """The audit entry of one Variable / Connection write, inside the caller's transaction."""
    noun = "variable" if kind == "variable" else "connection"
    verb = action.rsplit(".", 1)[1]
    audit.record(
        actor=actor,
        action=action,
        summary=f"{verb}d {noun} {key}" if verb != "set" else f"set {noun} {key}",
        targets=[audit.Target(kind=kind, object_id=key)],
        detail={"key": key, "fields": sorted(fields)},
    )


def value_of(variable: Variable) -> str | None:
    """A Variable's clear value: decrypted when stored encrypted (`SecretsUnreadable`, 503, under
    a FERNET_KEY that cannot read it), as it is otherwise (a row from before issue 38)."""
    return encryption.decrypt(variable.val) if variable.is_encrypted else variable.val


def _stored_value(value: str | None) -> dict[str, Any]:
    """The columns a Variable's `value` is written to: encrypted, as Airflow stores it, after
    the key was checked against what is stored (`encryption.check_key_reads_stored`)."""
    if value is None:
        return {"val": None, "is_encrypted": False}
    encryption.check_key_reads_stored()
    return {"val": encryption.encrypt(value), "is_encrypted": True}


def set_variable(
    *,
    key: str,
    value: str | None,
    description: str | None = None,
    actor: audit.Actor | None = None,
) -> Variable:
    """Create or replace the Variable `key` (own durable transaction, audited)."""
    if not key:
        raise exceptions.InvalidInput("a variable key must not be empty", reason="invalid_key")
    limits.check_lengths(Variable, {"key": key})
    with transaction.atomic(durable=True):
        variable, _ = Variable.objects.update_or_create(
            key=key, defaults={**_stored_value(value), "description": description}
        )
        _record(actor, "variable.set", "variable", key, ("value", "description"))
    return variable


def create_variable(
    *,
    key: str,
    value: str | None,
    description: str | None = None,
    actor: audit.Actor | None = None,
) -> Variable:
    """A new Variable; Conflict when `key` exists (the public API's POST). Audited."""
    if not key:
        raise exceptions.InvalidInput("a variable key must not be empty", reason="invalid_key")
    limits.check_lengths(Variable, {"key": key})
    try:
        with transaction.atomic(durable=True):
            variable = Variable.objects.create(
                key=key, description=description, **_stored_value(value)
            )
            _record(actor, "variable.create", "variable", key, ("value", "description"))
            return variable
    except IntegrityError:
        raise exceptions.Conflict(
            f"The Variable with key: `{key}` already exists", reason="already_exists"
        ) from None


def delete_variable(*, key: str, actor: audit.Actor | None = None) -> None:
    """Delete the Variable `key` (NotFound, nothing written, when there is none). Audited."""
    with transaction.atomic(durable=True):
        deleted, _ = Variable.objects.filter(key=key).delete()
        if not deleted:
            raise exceptions.NotFound(f"Variable with key '{key}' not found")
        _record(actor, "variable.delete", "variable", key)


# --- connections -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConnectionSecrets:
    """A Connection with its password and extra decrypted."""

    connection: Connection
    password: str | None
    extra: str | None


def reveal(connection: Connection) -> ConnectionSecrets:
    """Decrypt a Connection's secrets; `encryption.SecretsUnreadable` (503) with a wrong key."""
    return ConnectionSecrets(
        connection=connection,
        password=encryption.decrypt(connection.password),
        extra=encryption.decrypt(connection.extra),
    )


def get_connection(*, conn_id: str) -> ConnectionSecrets:
    connection = Connection.objects.filter(conn_id=conn_id).first()
    if connection is None:
        raise exceptions.NotFound(f"Connection with ID {conn_id} not found")
    return reveal(connection)


CONNECTION_FIELDS = ("conn_type", "description", "host", "schema", "login", "port")


def save_connection(
    *,
    conn_id: str,
    create: bool,
    password: str | None = None,
    extra: str | None = None,
    actor: audit.Actor | None = None,
    **fields: object,
) -> Connection:
    """Create (`create`: Conflict when it exists) or update (NotFound when it does not) the
    Connection `conn_id`; `fields` are the plain columns, `password` and `extra` are encrypted
    before they are stored. Own durable transaction, audited."""
    unknown = set(fields) - set(CONNECTION_FIELDS)
    if unknown:
        raise exceptions.InvalidInput(f"unknown connection fields: {sorted(unknown)}")
    if not conn_id:
        raise exceptions.InvalidInput("a connection id must not be empty", reason="invalid_key")
    limits.check_lengths(Connection, {"conn_id": conn_id, **fields})
    values = {
        **fields,
        "password": encryption.encrypt(password),
        "extra": encryption.encrypt(extra),
    }
    try:
        with transaction.atomic(durable=True):
            if password is not None or extra is not None:
                encryption.check_key_reads_stored()
            written = [name for name, value in values.items() if value is not None]
            if create:
                made = Connection.objects.create(conn_id=conn_id, **values)
                _record(actor, "connection.create", "connection", conn_id, written)
                return made
            connection = Connection.objects.filter(conn_id=conn_id).first()
            if connection is None:
                raise exceptions.NotFound(
                    f"The Connection with connection_id: `{conn_id}` was not found"
                )
            for name, value in values.items():
                setattr(connection, name, value)
            connection.save()
            _record(actor, "connection.update", "connection", conn_id, list(values))
            return connection
    except IntegrityError:
        raise exceptions.Conflict(
            f"The connection with connection_id: `{conn_id}` already exists",
            reason="already_exists",
        ) from None


def delete_connection(*, conn_id: str, actor: audit.Actor | None = None) -> None:
    """Delete the Connection `conn_id` (NotFound, nothing written, when there is none). Audited."""
    with transaction.atomic(durable=True):
        deleted, _ = Connection.objects.filter(conn_id=conn_id).delete()
        if not deleted:
            raise exceptions.NotFound(
                f"The Connection with connection_id: `{conn_id}` was not found"
            )
        _record(actor, "connection.delete", "connection", conn_id)


# --- listing and updates for the public API ------------------------------------------------------

VARIABLE_ORDERING = listing.Ordering(
    keys={"key": "key", "id": "id", "_val": "val", "description": "description"},
    default=("id",),
)
CONNECTION_ORDERING = listing.Ordering(
    keys={
        "conn_id": "conn_id",
        "connection_id": "conn_id",
        "conn_type": "conn_type",
        "description": "description",
        "host": "host",
        "port": "port",
        "id": "id",
    },
    default=("id",),
)


def _offset_page(
    model, field: str, ordering, *, pattern, prefix, order_by, limit: int, offset: int
) -> listing.Page:
    found = model.objects.filter(listing.pattern_q(field, pattern), listing.prefix_q(field, prefix))
    return listing.offset_page(found, ordering, order_by=order_by, limit=limit, offset=offset)


def list_variables(
    *,
    variable_key_pattern: str | None = None,
    variable_key_prefix_pattern: str | None = None,
    order_by: Sequence[str] | None = None,
    limit: int = listing.DEFAULT_PAGE_LIMIT,
    offset: int = 0,
) -> listing.Page:
    return _offset_page(
        Variable,
        "key",
        VARIABLE_ORDERING,
        pattern=variable_key_pattern,
        prefix=variable_key_prefix_pattern,
        order_by=order_by,
        limit=limit,
        offset=offset,
    )


def list_connections(
    *,
    connection_id_pattern: str | None = None,
    connection_id_prefix_pattern: str | None = None,
    order_by: Sequence[str] | None = None,
    limit: int = listing.DEFAULT_PAGE_LIMIT,
    offset: int = 0,
) -> listing.Page:
    return _offset_page(
        Connection,
        "conn_id",
        CONNECTION_ORDERING,
        pattern=connection_id_pattern,
        prefix=connection_id_prefix_pattern,
        order_by=order_by,
        limit=limit,
        offset=offset,
    )


def update_variable(
    *,
    key: str,
    changes: dict[str, Any],
    update_mask: Sequence[str] | None = None,
    actor: audit.Actor | None = None,
) -> Variable:
    """Change an existing Variable's `value` / `description`: those `changes` carries (what
    the body sent; a field left out keeps its value), only the `update_mask` ones when given
    (`_masked`; `key` in the mask is a 400). NotFound when it does not exist; own durable
    transaction, audited."""
    fields = _masked(changes, update_mask, allowed=("value", "description"), immutable=("key",))
    with transaction.atomic(durable=True):
        variable = Variable.objects.filter(key=key).first()
        if variable is None:
            raise exceptions.NotFound(f"The Variable with key: `{key}` was not found")
        write_variable(variable, fields, actor=actor)
    return variable


def write_variable(
    variable: Variable, fields: dict[str, Any], *, actor: audit.Actor | None
) -> None:
    """Write `fields` (`value`, `description`) to a Variable row, audited: inside the caller's
    transaction (`update_variable`, the public API's bulk requests)."""
    if "value" in fields:
        stored = _stored_value(fields["value"])
        variable.val, variable.is_encrypted = stored["val"], stored["is_encrypted"]
    if "description" in fields:
        variable.description = fields["description"]
    variable.save()
    _record(actor, "variable.update", "variable", variable.key, list(fields))


def update_connection(
    *,
    conn_id: str,
    changes: dict[str, Any],
    update_mask: Sequence[str] | None = None,
    actor: audit.Actor | None = None,
) -> Connection:
    """Change an existing Connection (only the `update_mask` fields when given); a new password
    or extra is encrypted. NotFound when it does not exist; own durable transaction, audited."""
    fields = _masked(changes, update_mask, allowed=(*CONNECTION_FIELDS, "password", "extra"))
    limits.check_lengths(Connection, {k: v for k, v in fields.items() if k in CONNECTION_FIELDS})
    with transaction.atomic(durable=True):
        connection = Connection.objects.filter(conn_id=conn_id).first()
        if connection is None:
            raise exceptions.NotFound(
                f"The Connection with connection_id: `{conn_id}` was not found"
            )
        _write_connection(connection, fields, actor)
    return connection


def patch_connection(
    *,
    conn_id: str,
    sent: dict[str, Any],
    update_mask: Sequence[str] | None = None,
    actor: audit.Actor | None = None,
) -> Connection:
    """`PATCH /api/v2/connections/{id}` as Airflow 3.3.2 applies it (`update_orm_from_pydantic`
    with the Connection's `set_password` / `set_extra`). `sent` holds only the fields the body
    carried (a field it left out is not a null):

    - a plain field changes when it was sent (and, with an `update_mask`, named by it);
    - the password, when sent (or named by the mask): null, empty or the mask `***` keep the
      stored one (Airflow's `set_password` ignores a false value, `merge` puts `***` back);
      anything else replaces it;
    - `extra`, when sent (or named by the mask): null or empty clears it, JSON is merged with the
      stored JSON (`masking.merge`: every `***` under a secret key gets its stored value back),
      other text replaces it. One deviation, against losing a secret: the mask `***` alone, what
      the public API shows of an `extra` that is not JSON, keeps the stored text (Airflow would
      store "***").

    NotFound when the Connection does not exist; own durable transaction, audited with the
    fields written. The admin's form uses `update_connection`, where a null password clears."""
    with transaction.atomic(durable=True):
        connection = Connection.objects.filter(conn_id=conn_id).first()
        if connection is None:
            raise exceptions.NotFound(
                f"The Connection with connection_id: `{conn_id}` was not found"
            )
        patch_connection_row(connection, sent, update_mask, actor=actor)
    return connection


def patch_connection_row(
    connection: Connection,
    sent: dict[str, Any],
    update_mask: Sequence[str] | None,
    *,
    actor: audit.Actor | None,
) -> None:
    """`patch_connection`'s rules applied to a Connection row, audited, inside the caller's
    transaction (`patch_connection`, the public API's bulk requests)."""
    named = {name.strip() for name in update_mask} if update_mask else None
    plain = {
        name: sent[name]
        for name in CONNECTION_FIELDS
        if name in sent and (named is None or name in named)
    }
    secrets = [
        name
        for name in ("password", "extra")
        if (name in named if named is not None else name in sent)
    ]
    limits.check_lengths(Connection, plain)
    # The answer shows this Connection's secrets (masked): they must decrypt before any
    # write, or a host-only change would commit and then answer 503.
    reveal(connection)
    written = dict(plain)
    if "password" in secrets and sent.get("password") not in (None, "", masking.MASK):
        written["password"] = sent["password"]
    if "extra" in secrets:
        extra = _merged_extra(sent.get("extra"), connection.extra)
        if extra is not _KEEP:
            written["extra"] = extra
    _write_connection(connection, written, actor)


_KEEP = object()


def _write_connection(connection: Connection, fields: dict, actor: audit.Actor | None) -> None:
    """Write `fields` on a locked or fetched Connection, `password` and `extra` encrypted (the
    stored key checked first when either is set), and audit the names written."""
    if fields.get("password") is not None or fields.get("extra") is not None:
        encryption.check_key_reads_stored()
    for name, value in fields.items():
        if name in ("password", "extra"):
            value = encryption.encrypt(value)
        setattr(connection, name, value)
    connection.save()
    _record(actor, "connection.update", "connection", connection.conn_id, list(fields))


def _merged_extra(new: str | None, stored_token: str | None) -> Any:
    """The `extra` a patch stores (see `patch_connection`), or `_KEEP` for the stored one."""
    if new is None or new == "":
        return new
    old = encryption.decrypt(stored_token)
    if old is None:
        return new
    try:
        return json.dumps(masking.merge(json.loads(new), json.loads(old)))
    except ValueError:
        return _KEEP if new == masking.MASK else new


def _masked(
    changes: dict[str, Any],
    update_mask: Sequence[str] | None,
    *,
    allowed: Sequence[str],
    immutable: Sequence[str] = (),
) -> dict[str, Any]:
    """The fields an update writes, as Airflow 3.3.2's `apply_patch_with_update_mask` picks them:
    those `changes` carries (a field the body left out is never erased), and with an
    `update_mask` only those it also names. A mask naming an `immutable` field is a 400 with
    Airflow's message; other names the body cannot change are ignored, as Airflow ignores them."""
    if update_mask:
        restricted = {name.strip() for name in update_mask} & set(immutable)
        if restricted:
            raise exceptions.BadRequest(
                "Update not allowed: the following fields are immutable and cannot be "
                f"modified: {restricted}",
                reason="immutable_field",
            )
        named = {name.strip() for name in update_mask}
        return {k: v for k, v in changes.items() if k in allowed and k in named}
    return {name: value for name, value in changes.items() if name in allowed}
