"""factory-boy factories: build preconditions; the behaviour under test goes through real code."""

import uuid

import factory
from django.utils import timezone

from assets_app.models import (
    Asset,
    AssetAlias,
    AssetEvent,
    AssetEventQueue,
    Dag,
    DagRun,
    DagRunType,
    QueueWatcher,
    Task,
    TaskInstance,
    TIState,
    WatcherRoute,
)


class AssetFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Asset
        django_get_or_create = ("name",)

    name = factory.Sequence(lambda n: f"asset-{n}")
    uri = factory.LazyAttribute(lambda o: f"s3://bucket/{o.name}")


class AssetAliasFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = AssetAlias
        django_get_or_create = ("name",)

    name = factory.Sequence(lambda n: f"alias-{n}")


class DagFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Dag

    dag_id = factory.Sequence(lambda n: f"dag_{n}")
    schedule = None

    class Params:
        paused = factory.Trait(is_paused=True)


class TaskFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Task

    dag = factory.SubFactory(DagFactory)
    task_id = factory.Sequence(lambda n: f"task_{n}")


class DagRunFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = DagRun

    dag = factory.SubFactory(DagFactory)
    run_id = factory.Sequence(lambda n: f"manual__run_{n}")
    run_type = DagRunType.MANUAL


class TaskInstanceFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = TaskInstance

    dag_run = factory.SubFactory(DagRunFactory)
    dag_id = factory.LazyAttribute(lambda o: o.dag_run.dag_id)
    run_id = factory.LazyAttribute(lambda o: o.dag_run.run_id)
    task_id = factory.Sequence(lambda n: f"task_{n}")
    state = TIState.QUEUED

    class Params:
        running = factory.Trait(
            state=TIState.RUNNING,
            hostname="worker-1",
            unixname="airflow",
            pid=4242,
            start_date=factory.LazyFunction(timezone.now),
        )
        succeeded = factory.Trait(
            state=TIState.SUCCESS,
            hostname="worker-1",
            unixname="airflow",
            pid=4242,
            start_date=factory.LazyFunction(timezone.now),
            end_date=factory.LazyFunction(timezone.now),
        )


class AssetEventFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = AssetEvent

    asset = factory.SubFactory(AssetFactory)
    extra = factory.LazyFunction(dict)


class AssetEventQueueFactory(factory.django.DjangoModelFactory):
    """An outbox row for a running TI's success (the TI itself need not exist)."""

    class Meta:
        model = AssetEventQueue

    ti_id = factory.Faker("uuid4", cast_to=None)
    try_number = 1
    source_dag_id = "producer"
    source_run_id = "manual__1"
    source_task_id = factory.Sequence(lambda n: f"task_{n}")
    payload = factory.LazyAttribute(
        lambda o: {
            "outlets": [],
            "outlet_events": [],
            "source": {
                "ti_id": str(o.ti_id),
                "dag_id": o.source_dag_id,
                "run_id": o.source_run_id,
                "task_id": o.source_task_id,
                "map_index": -1,
                "try_number": o.try_number,
            },
            "end_date": timezone.now().isoformat(),
        }
    )

    class Params:
        parked = factory.Trait(
            attempts=10,
            parked_at=factory.LazyFunction(timezone.now),
            last_error="boom",
            last_error_type="RuntimeError",
        )


class QueueWatcherFactory(factory.django.DjangoModelFactory):
    """A watcher on a queue of its own (tests publish to it on the real RabbitMQ)."""

    class Meta:
        model = QueueWatcher

    name = factory.Sequence(lambda n: f"watcher-{n}")
    queue = factory.LazyFunction(lambda: f"test-watcher-{uuid.uuid4().hex}")
    prefetch = 20

    class Params:
        disabled = factory.Trait(enabled=False)


class WatcherRouteFactory(factory.django.DjangoModelFactory):
    """A route; `assets=[...]` links its assets."""

    class Meta:
        model = WatcherRoute
        skip_postgeneration_save = True

    watcher = factory.SubFactory(QueueWatcherFactory)
    routing_key_pattern = "*"

    @factory.post_generation
    def assets(self, create, extracted, **kwargs):
        if create and extracted:
            self.assets.set(extracted)
