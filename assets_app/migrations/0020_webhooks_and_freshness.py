"""Issue 29, events out: webhook endpoints, their subscriptions (event type + glob pattern), the
messages owed to them with each attempt, and per-asset freshness policies with their state."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('assets_app', '0019_xcom_read_scope'),
    ]

    operations = [
        migrations.CreateModel(
            name='WebhookEndpoint',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('url', models.URLField(max_length=2000)),
                ('description', models.TextField(blank=True, default='')),
                ('state', models.CharField(choices=[('active', 'Active'), ('paused', 'Paused'), ('disabled', 'Disabled')], default='active', max_length=20)),
                ('state_reason', models.TextField(blank=True, default='')),
                ('secret', models.TextField()),
                ('previous_secret', models.TextField(blank=True, null=True)),
                ('previous_secret_expires_at', models.DateTimeField(blank=True, null=True)),
                ('max_in_flight', models.PositiveIntegerField(default=4)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('updated_at', models.DateTimeField(auto_now=True)),
            ],
            options={
                'ordering': ['id'],
                'constraints': [models.CheckConstraint(condition=models.Q(('max_in_flight__gte', 1)), name='webhook_in_flight_positive')],
            },
        ),
        migrations.CreateModel(
            name='WebhookDelivery',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('message_id', models.CharField(max_length=64, unique=True)),
                ('event_type', models.CharField(choices=[('asset.event.registered', 'asset event registered'), ('dag_run.succeeded', 'run finished (success)'), ('dag_run.failed', 'run failed'), ('outbox.parked', 'outbox row parked'), ('asset.late', 'asset late'), ('asset.fresh', 'asset fresh again')], max_length=40)),
                ('body', models.TextField()),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('state', models.CharField(choices=[('pending', 'Pending'), ('delivered', 'Delivered'), ('failed', 'Failed')], default='pending', max_length=20)),
                ('attempts', models.PositiveIntegerField(default=0)),
                ('next_attempt_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('claimed_until', models.DateTimeField(blank=True, null=True)),
                ('last_status', models.IntegerField(blank=True, null=True)),
                ('last_error', models.TextField(blank=True, default='')),
                ('delivered_at', models.DateTimeField(blank=True, null=True)),
                ('endpoint', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='deliveries', to='assets_app.webhookendpoint')),
            ],
            options={
                'verbose_name_plural': 'webhook deliveries',
                'ordering': ['-id'],
            },
        ),
        migrations.CreateModel(
            name='WebhookSubscription',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('event_type', models.CharField(choices=[('asset.event.registered', 'asset event registered'), ('dag_run.succeeded', 'run finished (success)'), ('dag_run.failed', 'run failed'), ('outbox.parked', 'outbox row parked'), ('asset.late', 'asset late'), ('asset.fresh', 'asset fresh again')], max_length=40)),
                ('pattern', models.CharField(default='*', max_length=1500)),
                ('like_pattern', models.CharField(default='%', max_length=3000)),
                ('endpoint', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='subscriptions', to='assets_app.webhookendpoint')),
            ],
        ),
        migrations.CreateModel(
            name='FreshnessPolicy',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('kind', models.CharField(choices=[('max_interval', 'an event at least every X seconds'), ('cron_deadline', 'an event by each cron deadline')], max_length=20)),
                ('interval_seconds', models.PositiveIntegerField(blank=True, null=True)),
                ('cron', models.CharField(blank=True, default='', max_length=200)),
                ('timezone', models.CharField(default='UTC', max_length=100)),
                ('state', models.CharField(choices=[('unknown', 'Unknown'), ('fresh', 'Fresh'), ('late', 'Late')], default='unknown', max_length=20)),
                ('state_since', models.DateTimeField(blank=True, null=True)),
                ('due_at', models.DateTimeField(blank=True, null=True)),
                ('last_evaluated_at', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('asset', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='freshness', to='assets_app.asset')),
            ],
            options={
                'verbose_name_plural': 'freshness policies',
                'ordering': ['id'],
                'constraints': [models.CheckConstraint(condition=models.Q(models.Q(('interval_seconds__gte', 1), ('kind', 'max_interval')), models.Q(('kind', 'cron_deadline'), models.Q(('cron', ''), _negated=True)), _connector='OR'), name='freshness_policy_complete')],
            },
        ),
        migrations.CreateModel(
            name='WebhookAttempt',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('attempted_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('status_code', models.IntegerField(blank=True, null=True)),
                ('error', models.TextField(blank=True, default='')),
                ('duration_ms', models.PositiveIntegerField(default=0)),
                ('next_attempt_at', models.DateTimeField(blank=True, null=True)),
                ('delivery', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='attempt_history', to='assets_app.webhookdelivery')),
            ],
            options={
                'ordering': ['delivery', 'id'],
                'indexes': [models.Index(fields=['delivery', 'id'], name='webhook_attempt_by_delivery')],
            },
        ),
        migrations.AddIndex(
            model_name='webhookdelivery',
            index=models.Index(condition=models.Q(('state', 'pending')), fields=['endpoint', 'next_attempt_at'], name='webhook_delivery_due'),
        ),
        migrations.AddIndex(
            model_name='webhookdelivery',
            index=models.Index(fields=['created_at'], name='webhook_delivery_by_time'),
        ),
        migrations.AddIndex(
            model_name='webhooksubscription',
            index=models.Index(fields=['event_type'], name='webhook_subscription_by_type'),
        ),
        migrations.AddConstraint(
            model_name='webhooksubscription',
            constraint=models.UniqueConstraint(fields=('endpoint', 'event_type', 'pattern'), name='webhook_subscription_unique'),
        ),
    ]
