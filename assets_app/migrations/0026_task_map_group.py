from django.db import migrations, models


class Migration(migrations.Migration):
    """Mapped task groups (issue 25): the group a mapped task belongs to."""

    dependencies = [
        ("assets_app", "0025_task_mapping"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="map_group",
            field=models.CharField(blank=True, default="", max_length=250),
        ),
        migrations.AddConstraint(
            model_name="task",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("map_group", ""),
                    ("map_length__isnull", False),
                    models.Q(("map_upstream", ""), _negated=True),
                    _connector="OR",
                ),
                name="task_map_group_is_mapped",
            ),
        ),
    ]
