"""The success path's TI statements (`task_state.success.succeed`): the unlocked TI read and the
running -> success UPDATE, each written once per process."""

import functools
from datetime import datetime
from uuid import UUID

from django.db import connection
from django.db.models.expressions import RawSQL

from ..models import TaskInstance, TIState
from .connection import prepared_cursor

# --- the success path's TI statements (task_state.success) ---------------------------------------


@functools.cache
def _task_instance_select() -> tuple[str, list[str]]:
    meta = TaskInstance._meta
    fields = meta.concrete_fields
    columns = ", ".join(f'"{f.column}"' for f in fields)
    return f'SELECT {columns} FROM "{meta.db_table}" WHERE "id" = %s', [f.attname for f in fields]


def read_task_instance(ti_id: UUID) -> TaskInstance | None:
    """The TI, unlocked: `TaskInstance.objects.filter(id=ti_id).first()`, autocommit or in the
    caller's transaction.

    PostgreSQL: the SELECT built once per process and the instance made by the documented
    `Model.from_db` (psycopg returns every column type of the model as the ORM would): building
    and compiling the query on every success was a measured part of its CPU
    (bench/success_breakdown.py, "TI read"). SQLite: the ORM."""
    if connection.vendor != "postgresql":
        return TaskInstance.objects.filter(id=ti_id).first()
    text, names = _task_instance_select()
    with prepared_cursor() as cursor:
        cursor.execute(text, [ti_id])
        row = cursor.fetchone()
    return None if row is None else TaskInstance.from_db(connection.alias, names, row)


def set_success_if_running(
    *, ti_id: UUID, try_number: int, end_date: datetime, now: datetime
) -> int:
    """running (that try) -> success in one UPDATE, which takes the TI row lock; in the caller's
    transaction. Returns the number of rows it matched (0 or 1).

    PostgreSQL: raw, the statement text written once: the ORM's `filter().update()` built and
    compiled it on every success while the TI lock is held. SQLite: the ORM."""
    if connection.vendor != "postgresql":
        return TaskInstance.objects.filter(
            id=ti_id, state=TIState.RUNNING, try_number=try_number
        ).update(state=TIState.SUCCESS, end_date=end_date, updated_at=now)
    with prepared_cursor() as cursor:
        cursor.execute(
            f'UPDATE "{TaskInstance._meta.db_table}" SET "state" = %s, "end_date" = %s, '
            '"updated_at" = %s WHERE "id" = %s AND "state" = %s AND "try_number" = %s',
            [TIState.SUCCESS, end_date, now, ti_id, TIState.RUNNING, try_number],
        )
        return cursor.rowcount


# --- the console grid's cells (admin.runs.run_grid, issue 45) ----------------------------------


def grid_cell_annotations() -> dict[str, RawSQL]:
    """The grid's per-TI columns, computed by the database (no timestamp is built in Python:
    200,000 of them at 1,000 tasks x 100 runs): `text`, the cell's text after its state letter
    (the duration in ms, `+` while unfinished, `~try` after the first try); `start_ms` and
    `end_ms`, a map index's span in epoch milliseconds (None for an unmapped TI). PostgreSQL
    and SQLite (the default `bin/serve`) spell the epoch arithmetic differently."""
    if connection.vendor == "postgresql":
        now = "statement_timestamp()"

        def epoch_ms(column: str) -> str:
            return f"(EXTRACT(EPOCH FROM {column}) * 1000)::bigint"

        duration = f"(EXTRACT(EPOCH FROM COALESCE(end_date, {now}) - start_date) * 1000)::bigint"
        as_text = "{}::text"
    else:
        now = "'now'"

        def epoch_ms(column: str) -> str:
            return f"CAST(ROUND((julianday({column}) - 2440587.5) * 86400000) AS INTEGER)"

        duration = (
            f"CAST(ROUND((julianday(COALESCE(end_date, {now})) - julianday(start_date)) "
            "* 86400000) AS INTEGER)"
        )
        as_text = "CAST({} AS TEXT)"
    text = (
        f"CASE WHEN start_date IS NULL THEN '' ELSE {as_text.format(duration)} "
        "|| CASE WHEN end_date IS NULL THEN '+' ELSE '' END END "
        f"|| CASE WHEN try_number <> 1 THEN '~' || {as_text.format('try_number')} ELSE '' END"
    )
    return {
        "text": RawSQL(text, ()),
        "start_ms": RawSQL(f"CASE WHEN map_index >= 0 THEN {epoch_ms('start_date')} END", ()),
        "end_ms": RawSQL(
            f"CASE WHEN map_index >= 0 THEN {epoch_ms(f'COALESCE(end_date, {now})')} END", ()
        ),
    }
