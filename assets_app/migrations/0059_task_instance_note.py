from django.db import migrations, models


class Migration(migrations.Migration):
    """A task instance's note (issue 49: Airflow's `PATCH .../taskInstances/{task_id}` sets it);
    a nullable column without a default: no table rewrite."""

    dependencies = [("assets_app", "0058_dag_code")]

    operations = [
        migrations.AddField(
            model_name="taskinstance",
            name="note",
            field=models.TextField(blank=True, null=True),
        ),
    ]
