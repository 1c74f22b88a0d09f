"""The database router of the read replica (issue 46): installed only when
DATABASE_REPLICA_URL is set. The decisions are `replica`'s; this class only answers Django."""

from typing import Any

from . import replica


class ReplicaRouter:
    """Reads: the replica inside a replica scope (`replica.read_alias`), else the primary.
    Writes, and so every `select_for_update`: always the primary (named, because Django would
    otherwise write an object back to the alias it was read from). Migrations: the primary only
    (the standby follows it)."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return replica.read_alias(model)

    def db_for_write(self, model: Any, **hints: Any) -> str:
        replica.note_write(model)
        return replica.PRIMARY

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool:
        return True

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        return False if db == replica.REPLICA else None
