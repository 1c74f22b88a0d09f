"""Issue 30, retention: the indexes its selections need (every foreign key that cascades from
a table it deletes is already indexed on the referencing column: tests/test_retention_indexes.py).

- dag_run_by_dag_id (dag_id, id): "the last N runs of this Dag" is one backward probe per
  candidate run; without it each probe reads and sorts all the Dag's runs.
- xcom_by_time (timestamp): old XComs in (timestamp, id) order.

Built CONCURRENTLY on PostgreSQL, so the worker API and the scheduler keep writing while a large
table is indexed (hence atomic = False); a plain CREATE INDEX on SQLite.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models
from django.db.migrations.operations import AddIndex


class AddIndexOnline(AddIndexConcurrently):
    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        return AddIndex.database_forwards(self, app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.remove_index(model, self.index)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("assets_app", "0013_task_log_chunks"),
    ]

    operations = [
        AddIndexOnline(
            model_name="dagrun",
            index=models.Index(fields=["dag", "id"], name="dag_run_by_dag_id"),
        ),
        AddIndexOnline(
            model_name="xcom",
            index=models.Index(fields=["timestamp"], name="xcom_by_time"),
        ),
    ]
