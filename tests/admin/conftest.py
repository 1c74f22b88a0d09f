import itertools
import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from assets_app.definitions import sources
from assets_app.guards import encryption
from assets_app.models import (
    ApiToken,
    AssetAliasAsset,
    AssetAliasEvent,
    AssetDagRunQueue,
    AssetStateStore,
    Backfill,
    BackfillDagRun,
    ComponentHeartbeat,
    DagCallbackRequest,
    DagFavorite,
    DagImportError,
    DagRunAssetEvent,
    DagRunType,
    DagScheduleAliasReference,
    DagScheduleAssetReference,
    DagVersion,
    FreshnessPolicy,
    HITLDetail,
    MetricCounter,
    Pool,
    QueueWatcher,
    RenderedTaskFields,
    RevokedToken,
    TaskLogChunk,
    TaskOutletAliasReference,
    TaskOutletAssetReference,
    TaskReschedule,
    TaskSetupLink,
    TaskStateStore,
    TaskUpstream,
    TIState,
    Trigger,
    Variable,
    WatcherMessage,
    WatcherRoute,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookSubscription,
    WorkerBundle,
    XCom,
)
from assets_app.operations import audit
from assets_app.runtime import variables
from tests.factories import (
    AssetAliasFactory,
    AssetEventFactory,
    AssetEventQueueFactory,
    AssetFactory,
    DagFactory,
    DagRunFactory,
    TaskFactory,
    TaskInstanceFactory,
)


@pytest.fixture
def staff_client(db, django_user_model):
    user = django_user_model.objects.create_superuser(username="operator", password="pw")
    client = Client()
    client.force_login(user)
    return client


_serial = itertools.count()


def populate(n: int) -> None:
    """`n` of everything the admin shows, linked the way the drain and scheduler link them."""
    alias = AssetAliasFactory()
    user, _ = get_user_model().objects.get_or_create(username="token-owner")
    for _ in range(n):
        i = next(_serial)
        producer = DagFactory(dag_id=f"producer_{i}")
        asset = AssetFactory()
        task = TaskFactory(dag=producer)
        TaskOutletAssetReference.objects.create(task=task, asset=asset)
        TaskOutletAliasReference.objects.create(task=task, alias=alias)
        downstream = TaskFactory(dag=producer)
        TaskUpstream.objects.create(task=downstream, upstream=task)
        TaskSetupLink.objects.create(task=downstream, other=task, kind="setup")
        consumer = DagFactory(schedule={"any": [{"asset": {"name": asset.name, "uri": asset.uri}}]})
        DagScheduleAssetReference.objects.create(dag=consumer, asset=asset)
        DagScheduleAliasReference.objects.create(dag=consumer, alias=alias)
        run = DagRunFactory(dag=producer)
        ti = TaskInstanceFactory(dag_run=run, task_id=task.task_id, succeeded=True)
        event = AssetEventFactory(
            asset=asset,
            source_dag_id=producer.dag_id,
            source_run_id=run.run_id,
            source_task_id=task.task_id,
            source_ti_id=ti.id,
            source_try_number=1,
        )
        AssetAliasAsset.objects.get_or_create(alias=alias, asset=asset)
        AssetAliasEvent.objects.create(alias=alias, asset_event=event)
        consuming_run = DagRunFactory(dag=consumer, run_type=DagRunType.ASSET_TRIGGERED)
        TaskInstanceFactory(dag_run=consuming_run)
        DagRunAssetEvent.objects.create(dag_run=consuming_run, dag=consumer, asset_event=event)
        waiting = AssetEventFactory(asset=asset)
        AssetDagRunQueue.objects.create(target_dag=consumer, asset_event=waiting, asset=asset)
        AssetEventQueueFactory(source_dag_id=producer.dag_id)
        # Issue 49: a version of the producer and a user's favorite; issue 44: a served bundle.
        DagVersion.objects.create(dag=producer, version_number=1)
        DagFavorite.objects.create(dag=producer, user=user)
        WorkerBundle.objects.create(
            bundle_name=f"bundle-{i}", last_claim_at=timezone.now(), last_hostname="host"
        )
        AssetEventQueueFactory(source_dag_id=producer.dag_id, parked=True)
        MetricCounter.objects.create(name="outbox_registered", shard=i, value=i)
        ApiToken.objects.create(user=user, name=f"token-{i}", key_hash=ApiToken.hash_key(f"k{i}"))
        RevokedToken.objects.create(jti=f"{i:032x}", exp=timezone.now())
        audit.record(
            actor=audit.Actor.from_user(user, via="admin"),
            action="outbox.requeue",
            summary=f"requeued outbox rows {i}",
            targets=[audit.Target(kind="outbox_row", object_id=i, ti_id=ti.id)],
            dag_id=producer.dag_id,
        )
        Variable.objects.create(key=f"variable_{i}", val="v")
        Pool.objects.create(name=f"pool_{i}", slots=i)
        variables.save_connection(
            conn_id=f"connection_{i}", create=True, conn_type="http", password="p", extra="{}"
        )
        XCom.objects.create(
            dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id, key="k", value=[i]
        )
        TaskStateStore.objects.create(
            dag_run=ti.dag_run, dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id,
            key=f"k{i}", value=json.dumps({"job": i}),
        )  # fmt: skip
        AssetStateStore.objects.create(
            asset=asset, key=f"watermark_{i}", value=json.dumps(i), last_updated_by_kind="api"
        )
        TaskReschedule.objects.create(
            ti=ti,
            try_number=1,
            start_date=timezone.now(),
            end_date=timezone.now(),
            reschedule_date=timezone.now(),
        )
        RenderedTaskFields.objects.create(ti=ti, fields={"op_args": "[]"})
        TaskLogChunk.objects.create(ti=ti, try_number=1, offset=0, size=4, content="log\n")
        # Issue 42: a Human-in-the-loop request, answered.
        HITLDetail.objects.create(
            ti=ti,
            options=["Approve", "Reject"],
            subject=f"Ship {i}?",
            responded_at=timezone.now(),
            responded_by={"id": "1", "name": "ops"},
            chosen_options=["Approve"],
        )
        now = timezone.now()
        # Issue 42: a deferred TI and its trigger, held by a triggerer.
        trigger = Trigger.objects.create(
            classpath="airflow.providers.standard.triggers.temporal.DateTimeTrigger",
            kwargs='{"moment": null}',
            claimed_by="triggerer-1",
            lease_until=now,
        )
        TaskInstanceFactory(
            dag_run=run,
            # Its own task id: the factory's "task_<n>" sequence met the producer task's
            # (TaskFactory's, counted apart) in this run after some test orders (unique per run).
            task_id=f"deferred_{i}",
            state=TIState.DEFERRED,
            trigger=trigger,
            next_method="execute_complete",
            trigger_timeout=now,
        )
        # Issue 39: a Dag callback request that failed.
        DagCallbackRequest.objects.create(
            dag_run=run,
            dag_id=run.dag_id,
            clear_number=i,
            is_failure_callback=True,
            reason="task_failure",
            state="failed",
            attempts=1,
            last_error="Traceback ...\nRuntimeError: Boom",
        )
        backfill = Backfill.objects.create(dag=producer, from_date=now, to_date=now)
        BackfillDagRun.objects.create(
            backfill=backfill,
            dag_run=run,
            logical_date=now,
            data_interval_start=now,
            data_interval_end=now,
            run_after=now,
            sort_ordinal=1,
            started_at=now,
        )
        # Issue 29: an endpoint, its subscription, a message with an attempt, a policy.
        endpoint = WebhookEndpoint.objects.create(
            url=f"https://hooks.example.com/{i}", secret=encryption.encrypt("whsec_AAAA")
        )
        WebhookSubscription.objects.create(endpoint=endpoint, event_type="asset.late")
        delivery = WebhookDelivery.objects.create(
            message_id=f"msg_admin_{i}", endpoint=endpoint, event_type="asset.late", body="{}"
        )
        WebhookAttempt.objects.create(delivery=delivery, status_code=500, error="HTTP 500")
        FreshnessPolicy.objects.create(asset=asset, kind="max_interval", interval_seconds=60)
        DagImportError.objects.create(
            filename=f"broken_{i}.py", timestamp=now, stack_trace="SyntaxError: invalid syntax"
        )
        DagFactory(dag_id=f"unimported_{i}", fileloc=f"broken_{i}.py", bundle_name="dags-folder")
        # Issue 45: the file's source as last synced.
        sources.record_sources([sources.cut(f"broken_{i}.py", f"# file {i}\n")])
        # Issue 28: a watcher with a route and a registered and a parked message.
        watcher = QueueWatcher.objects.create(name=f"watcher-{i}", queue=f"queue-{i}")
        WatcherRoute.objects.create(watcher=watcher).assets.set([asset])
        WatcherMessage.objects.create(
            watcher=watcher, message_id=f"m-{i}", state="registered", registered_at=now
        )
        WatcherMessage.objects.create(
            watcher=watcher, message_id=f"p-{i}", state="parked", reason="not_json", body=b"x"
        )
    for component in ("drain", "scheduler"):
        ComponentHeartbeat.objects.update_or_create(
            component=component,
            defaults={"last_run_at": timezone.now(), "last_ok_at": timezone.now()},
        )
