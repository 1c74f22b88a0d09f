"""Variables and Connections: operator-managed settings tasks read at run time (DESIGN 2).

Connections keep `password` and `extra` encrypted at rest (`encryption`); `reveal` is the one
place that decrypts them. Every write is its own durable transaction and idempotent (a PUT of the
same key replaces, a delete of a missing key is NotFound and writes nothing).
"""

from dataclasses import dataclass

from django.db import IntegrityError, transaction

from . import encryption, exceptions
from .models import Connection, Variable

# --- variables ---------------------------------------------------------------------------------


def get_variable(*, key: str) -> Variable:
    variable = Variable.objects.filter(key=key).first()
    if variable is None:
        raise exceptions.NotFound(f"Variable with key '{key}' not found")
    return variable


def set_variable(*, key: str, value: str | None, description: str | None = None) -> Variable:
    """Create or replace the Variable `key` (own durable transaction)."""
    if not key:
        raise exceptions.InvalidInput("a variable key must not be empty", reason="invalid_key")
    with transaction.atomic(durable=True):
        variable, _ = Variable.objects.update_or_create(
            key=key, defaults={"val": value, "description": description}
        )
    return variable


def create_variable(*, key: str, value: str | None, description: str | None = None) -> Variable:
    """A new Variable; Conflict when `key` exists (the public API's POST)."""
    try:
        with transaction.atomic(durable=True):
            return Variable.objects.create(key=key, val=value, description=description)
    except IntegrityError:
        raise exceptions.Conflict(
            f"The Variable with key: `{key}` already exists", reason="already_exists"
        ) from None


def delete_variable(*, key: str) -> None:
    deleted, _ = Variable.objects.filter(key=key).delete()
    if not deleted:
        raise exceptions.NotFound(f"Variable with key '{key}' not found")


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
    **fields: object,
) -> Connection:
    """Create (`create`: Conflict when it exists) or update (NotFound when it does not) the
    Connection `conn_id`; `fields` are the plain columns, `password` and `extra` are encrypted
    before they are stored. Own durable transaction."""
    unknown = set(fields) - set(CONNECTION_FIELDS)
    if unknown:
        raise exceptions.InvalidInput(f"unknown connection fields: {sorted(unknown)}")
    if not conn_id:
        raise exceptions.InvalidInput("a connection id must not be empty", reason="invalid_key")
    values = {
        **fields,
        "password": encryption.encrypt(password),
        "extra": encryption.encrypt(extra),
    }
    try:
        with transaction.atomic(durable=True):
            if create:
                return Connection.objects.create(conn_id=conn_id, **values)
            connection = Connection.objects.filter(conn_id=conn_id).first()
            if connection is None:
                raise exceptions.NotFound(
                    f"The Connection with connection_id: `{conn_id}` was not found"
                )
            for name, value in values.items():
                setattr(connection, name, value)
            connection.save()
            return connection
    except IntegrityError:
        raise exceptions.Conflict(
            f"The connection with connection_id: `{conn_id}` already exists",
            reason="already_exists",
        ) from None


def delete_connection(*, conn_id: str) -> None:
    deleted, _ = Connection.objects.filter(conn_id=conn_id).delete()
    if not deleted:
        raise exceptions.NotFound(f"The Connection with connection_id: `{conn_id}` was not found")
