"""Public API v2 (issue 16): runs of type asset_materialization, who triggered a run, and when it
was last queued (a clear queues it again). Existing runs keep their creation time as queued_at."""

import django.utils.timezone
from django.db import migrations, models


def backfill(apps, schema_editor):
    DagRun = apps.get_model("assets_app", "DagRun")
    DagRun.objects.update(queued_at=models.F("created_at"))
    DagRun.objects.filter(run_type="asset_triggered").update(triggered_by="asset")


class Migration(migrations.Migration):

    dependencies = [
        ('assets_app', '0002_operator_console'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='dagrun',
            name='dag_run_type_valid',
        ),
        migrations.AddField(
            model_name='dagrun',
            name='queued_at',
            field=models.DateTimeField(default=django.utils.timezone.now),
        ),
        migrations.AddField(
            model_name='dagrun',
            name='triggered_by',
            field=models.CharField(blank=True, choices=[('cli', 'Cli'), ('rest_api', 'Rest Api'), ('ui', 'Ui'), ('asset', 'Asset')], max_length=20, null=True),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
        migrations.AlterField(
            model_name='dagrun',
            name='run_type',
            field=models.CharField(choices=[('manual', 'Manual'), ('asset_triggered', 'Asset Triggered'), ('asset_materialization', 'Asset Materialization')], max_length=30),
        ),
        migrations.AddConstraint(
            model_name='dagrun',
            constraint=models.CheckConstraint(condition=models.Q(('run_type__in', ['manual', 'asset_triggered', 'asset_materialization'])), name='dag_run_type_valid'),
        ),
    ]
