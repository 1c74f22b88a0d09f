"""Issue 26: the audit trail's `via` gains "task", a running task acting through the worker API
with its token (Variables it sets or deletes, runs it triggers or clears); the entry names the TI.
The check constraint is replaced to allow the new value (a catalogue change, no table rewrite)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("assets_app", "0016_schedule_mode"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="auditentry",
            name="audit_via_valid",
        ),
        migrations.AlterField(
            model_name="auditentry",
            name="via",
            field=models.CharField(
                choices=[
                    ("admin", "Admin"),
                    ("command", "Command"),
                    ("api", "Api"),
                    ("task", "Task"),
                    ("system", "System"),
                ],
                max_length=20,
            ),
        ),
        migrations.AddConstraint(
            model_name="auditentry",
            constraint=models.CheckConstraint(
                condition=models.Q(("via__in", ["admin", "command", "api", "task", "system"])),
                name="audit_via_valid",
            ),
        ),
    ]
