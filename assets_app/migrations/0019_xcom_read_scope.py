# Issue 26: a Dag's task tokens read XComs of their own run only, unless the Dag opts into wider
# reads (`xcom_read_scope`: run | dag | all). Existing Dags get the narrow default.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('assets_app', '0018_backfills'),
    ]

    operations = [
        migrations.AddField(
            model_name='dag',
            name='xcom_read_scope',
            field=models.CharField(choices=[('run', 'its own run'), ('dag', 'any run of its Dag'), ('all', "any Dag's runs")], db_default='run', default='run', max_length=8),
        ),
        migrations.AddConstraint(
            model_name='dag',
            constraint=models.CheckConstraint(condition=models.Q(('xcom_read_scope__in', ['run', 'dag', 'all'])), name='dag_xcom_read_scope_valid'),
        ),
    ]
