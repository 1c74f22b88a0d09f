from django.db import migrations, models


class Migration(migrations.Migration):
    """A task mapped over several upstream outputs (issue 39): Airflow's `zip` and `concat`."""
    dependencies = [
        ("assets_app", "0054_hitl"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="map_combine",
            field=models.CharField(
                blank=True,
                choices=[
                    ("", "one source"),
                    ("zip", "Zip"),
                    ("zip_longest", "Zip Longest"),
                    ("concat", "Concat"),
                ],
                db_default="",
                default="",
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="task",
            name="map_sources",
            field=models.JSONField(
                blank=True, db_default=models.Value([], models.JSONField()), default=list
            ),
        ),
        migrations.AddConstraint(
            model_name="task",
            constraint=models.CheckConstraint(
                condition=models.Q(("map_combine__in", ["", "zip", "zip_longest", "concat"])),
                name="task_map_combine",
            ),
        ),
        migrations.AddConstraint(
            model_name="task",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("map_combine", ""),
                    models.Q(("map_upstream", ""), _negated=True),
                    _connector="OR",
                ),
                name="task_map_combine_over_outputs",
            ),
        ),
    ]
