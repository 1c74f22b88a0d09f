"""Issue 41: the repair, retention, webhook delivery and freshness sweeps became timers of the
timers process (`manage.py run_timers`); their django-q2 Schedule rows are deleted, so a
cluster of this version never runs an entry point that no longer exists. `setup_schedules`
deletes them too (`cluster.sweeps.RETIRED`); this covers a database migrated without it."""

from django.db import migrations

RETIRED = (
    "task-instance-repair-sweep",
    "retention-sweep",
    "webhook-delivery-sweep",
    "freshness-sweep",
)


def delete_retired(apps, schema_editor):
    Schedule = apps.get_model("django_q", "Schedule")
    Schedule.objects.filter(name__in=RETIRED).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("assets_app", "0030_timers_indexes"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [migrations.RunPython(delete_retired, migrations.RunPython.noop)]
