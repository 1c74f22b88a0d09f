"""Issue 48, a year of history: indexes for the default orders of the big lists.

- ti_by_map_index (map_index, id): `GET /api/v2/dags/~/dagRuns/~/taskInstances` in its default
  order; without it every page sorted all TIs (3 M at a year's size, on disk).
- ti_by_start_date (start_date, id): the console's TI list sorted by start date.
- dag_run_by_run_after (run_after, id): the console's run list by run after.
- asset_event_by_time_id (timestamp, id) replaces asset_event_by_time (timestamp): the console's
  (-timestamp, -id) and the API's (timestamp, id) orders read it in order, tie included.
- asset_event_by_source_dag (source_dag_id): the console's source-Dag filter.

Built CONCURRENTLY on PostgreSQL (as 0015), so the worker API and the scheduler keep writing
while a large table is indexed (hence atomic = False); plain on SQLite.
"""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models
from django.db.migrations.operations import AddIndex, RemoveIndex


class AddIndexOnline(AddIndexConcurrently):
    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        return AddIndex.database_forwards(self, app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        return AddIndex.database_backwards(self, app_label, schema_editor, from_state, to_state)


class RemoveIndexOnline(RemoveIndexConcurrently):
    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        return RemoveIndex.database_forwards(self, app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        return RemoveIndex.database_backwards(self, app_label, schema_editor, from_state, to_state)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("assets_app", "0052_setup_teardown"),
    ]

    operations = [
        AddIndexOnline(
            model_name="taskinstance",
            index=models.Index(fields=["map_index", "id"], name="ti_by_map_index"),
        ),
        AddIndexOnline(
            model_name="taskinstance",
            index=models.Index(fields=["start_date", "id"], name="ti_by_start_date"),
        ),
        AddIndexOnline(
            model_name="dagrun",
            index=models.Index(fields=["run_after", "id"], name="dag_run_by_run_after"),
        ),
        AddIndexOnline(
            model_name="assetevent",
            index=models.Index(fields=["timestamp", "id"], name="asset_event_by_time_id"),
        ),
        RemoveIndexOnline(model_name="assetevent", name="asset_event_by_time"),
        AddIndexOnline(
            model_name="assetevent",
            index=models.Index(fields=["source_dag_id"], name="asset_event_by_source_dag"),
        ),
    ]
