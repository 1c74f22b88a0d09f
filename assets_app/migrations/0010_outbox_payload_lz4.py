"""The outbox payload column compressed with lz4 instead of pglz (PostgreSQL 14+, built with
lz4; elsewhere nothing changes). Every success writes a payload of ~19 kB at 300 outlets, which
PostgreSQL compresses out of line, and every drain reads it back: with lz4 the INSERT costs the
backend 0.42 ms of CPU instead of 0.58 and the read half the time (issue 14). Only values written
from now on are lz4; older ones stay readable as they are."""

from django.db import migrations


def _lz4(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql" or connection.pg_version < 140000:
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' "
                       "AND 'lz4' = ANY(enumvals)")
        if cursor.fetchone() is None:
            return  # a server built without lz4
        cursor.execute('ALTER TABLE "assets_app_asseteventqueue" ALTER COLUMN "payload" '
                       "SET COMPRESSION lz4")


def _pglz(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql" or connection.pg_version < 140000:
        return
    with connection.cursor() as cursor:
        cursor.execute('ALTER TABLE "assets_app_asseteventqueue" ALTER COLUMN "payload" '
                       "SET COMPRESSION DEFAULT")


class Migration(migrations.Migration):

    dependencies = [
        ("assets_app", "0009_task_runtime_data"),
    ]

    operations = [
        migrations.RunPython(_lz4, _pglz),
    ]
