"""Issue 24, asset and time: `Dag.schedule_mode` says how a Dag with both an asset schedule and
a timetable runs (`asset_or_time`, Airflow's AssetOrTimeSchedule, the default; or the service's
`asset_and_time`). A database default, so existing rows need no rewrite of their values."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("assets_app", "0015_retention_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="dag",
            name="schedule_mode",
            field=models.CharField(
                choices=[("asset_or_time", "Asset Or Time"), ("asset_and_time", "Asset And Time")],
                db_default="asset_or_time",
                default="asset_or_time",
                max_length=20,
            ),
        ),
        migrations.AddConstraint(
            model_name="dag",
            constraint=models.CheckConstraint(
                condition=models.Q(("schedule_mode__in", ["asset_or_time", "asset_and_time"])),
                name="dag_schedule_mode",
            ),
        ),
    ]
