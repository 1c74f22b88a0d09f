"""Queue watchers declared by Dag definitions (issue 28, the definition's `watchers`; what an
Airflow AssetWatcher on a queue becomes): the sync creates the watcher and the Dag's routes,
keeps the operator's, refuses what would take an admin watcher or change a queue another Dag
uses, and the consumer registers a published message on the declared assets (real RabbitMQ)."""

import sys
import uuid

import pytest

from assets_app.definitions import sync as definitions
from assets_app.definitions.sync import DefinitionError
from assets_app.models import AssetEvent, QueueWatcher, WatcherRoute
from tests import rabbitmq
from tests.factories import AssetFactory, QueueWatcherFactory, WatcherRouteFactory
from tests.test_watchers import consume

pytestmark = pytest.mark.django_db(transaction=True)

# Each test runs on a queue of its own (`_queue` sets QUEUE; this default only fills the
# parametrized definitions below, which never reach the broker). With one shared name, a test's
# teardown deleting it raced the next test's declare: fresh-clone CI runs saw 0 of 3 messages
# consumed (the teardown on another xdist worker) and, with the file on one worker, a publish
# whose queue had just been deleted come back unroutable.
QUEUE = "test-definition-watcher"


@pytest.fixture(autouse=True)
def _queue(monkeypatch):
    name = f"test-definition-watcher-{uuid.uuid4().hex[:12]}"
    monkeypatch.setattr(sys.modules[__name__], "QUEUE", name)
    yield
    rabbitmq.delete(name)
    rabbitmq.delete(name + "-2")


def dag(dag_id="orders_report", *, schedule=None, watchers=()):
    return {
        "dag_id": dag_id,
        "schedule": schedule or {"any": ["orders", "refunds"]},
        "tasks": [{"task_id": "t"}],
        "watchers": list(watchers),
    }


def watcher(**fields):
    return {"name": "shop", "queue": QUEUE, "assets": ["orders"], **fields}


def sync(*documents):
    dags = [
        d
        for i, raw in enumerate(documents)
        for d in definitions.parse_document(raw, file=f"f{i}.json", fileloc=f"f{i}.json")
    ]
    return definitions.sync_definitions(dags=dags)


def routes():
    """{(watcher, dag, pattern, field, value): sorted asset names} of every route."""
    return {
        (r.watcher.name, r.dag_id, r.routing_key_pattern, r.body_field, r.body_value): sorted(
            r.assets.values_list("name", flat=True)
        )
        for r in WatcherRoute.objects.select_related("watcher")
    }


def test_a_declared_watcher_is_created_with_the_dags_routes_and_a_resync_writes_nothing():
    result = sync(
        dag(
            watchers=[
                watcher(assets=["orders", "refunds"], routing_key="shop.*"),
                watcher(name="refunds-only", assets=["refunds"], body_field="kind", body_value="r"),
            ]
        )
    )
    assert (result.watchers_created, result.watchers_updated) == (2, 0)
    assert "queue watchers: 2 created, 0 updated" in result.summary()
    shop = QueueWatcher.objects.get(name="shop")
    assert (shop.queue, shop.broker_url, shop.enabled, shop.from_definitions) == (
        QUEUE,
        "",
        True,
        True,
    )
    assert routes() == {
        ("shop", "orders_report", "shop.*", "", ""): ["orders", "refunds"],
        ("refunds-only", "orders_report", "*", "kind", "r"): ["refunds"],
    }
    stamps = list(QueueWatcher.objects.order_by("pk").values_list("updated_at", flat=True))
    route_ids = sorted(WatcherRoute.objects.values_list("pk", flat=True))

    again = sync(
        dag(
            watchers=[
                watcher(assets=["orders", "refunds"], routing_key="shop.*"),
                watcher(name="refunds-only", assets=["refunds"], body_field="kind", body_value="r"),
            ]
        )
    )
    assert not again.changed
    assert (again.watchers_created, again.watchers_updated) == (0, 0)
    assert list(QueueWatcher.objects.order_by("pk").values_list("updated_at", flat=True)) == stamps
    assert sorted(WatcherRoute.objects.values_list("pk", flat=True)) == route_ids


def test_a_published_message_registers_an_event_on_each_declared_asset():
    sync(
        dag(watchers=[watcher(assets=["orders", "refunds"], routing_key="shop.*")]),
        dag("audit", schedule="orders", watchers=[watcher(routing_key="audit.*")]),
    )
    shop = QueueWatcher.objects.get(name="shop")
    rabbitmq.publish(
        QUEUE,
        [
            rabbitmq.message({"n": 1}, routing_key="shop.paid", message_id="m1"),
            rabbitmq.message({"n": 2}, routing_key="audit.seen", message_id="m2"),
            rabbitmq.message({"n": 3}, routing_key="other", message_id="m3"),
        ],
    )
    assert consume(shop, 3) == 3
    got = sorted(
        (e.extra["message_id"], e.asset.name) for e in AssetEvent.objects.select_related("asset")
    )
    # One consumer of the queue serves both Dags' routes; m3 matches none and is parked.
    assert got == [("m1", "orders"), ("m1", "refunds"), ("m2", "orders")]
    assert shop.messages.get(message_id="m3").reason == "unroutable"


def test_routes_follow_the_definition_keep_the_admins_and_the_last_one_gone_disables_it():
    sync(dag(watchers=[watcher()]))
    shop = QueueWatcher.objects.get(name="shop")
    WatcherRouteFactory(watcher=shop, routing_key_pattern="manual.*", assets=[AssetFactory()])

    changed = sync(dag(watchers=[watcher(assets=["refunds"])]))
    assert changed.changed
    assert {k: v for k, v in routes().items() if k[1]} == {
        ("shop", "orders_report", "*", "", ""): ["refunds"]
    }
    assert WatcherRoute.objects.filter(watcher=shop, dag=None).count() == 1  # the admin's

    WatcherRoute.objects.filter(dag=None).delete()
    sync(dag(watchers=[]))
    shop.refresh_from_db()
    assert not WatcherRoute.objects.exists()
    assert not shop.enabled  # with no route every message would park as unroutable

    sync(dag(watchers=[watcher()]))
    shop.refresh_from_db()
    assert shop.enabled
    assert routes() == {("shop", "orders_report", "*", "", ""): ["orders"]}


def test_a_watcher_made_in_the_admin_keeps_its_name():
    QueueWatcherFactory(name="shop", queue="admin-queue")
    with pytest.raises(DefinitionError) as info:
        sync(dag(watchers=[watcher()]))
    assert info.value.path == "watchers[0].name"
    assert "configured in the admin (queue 'admin-queue')" in info.value.message
    assert not WatcherRoute.objects.exists()
    assert QueueWatcher.objects.get(name="shop").queue == "admin-queue"


def test_a_queue_change_applies_unless_a_dag_outside_the_sync_uses_the_watcher():
    sync(dag(watchers=[watcher()]), dag("audit", schedule="orders", watchers=[watcher()]))
    moved = watcher(queue=QUEUE + "-2", broker_url="amqp://bob:secret@mq:5672/%2F")
    with pytest.raises(DefinitionError) as info:
        sync(dag(watchers=[moved]))
    assert info.value.path == "watchers[0]"
    assert "for dag 'audit' (not in this sync)" in info.value.message
    assert "secret" not in info.value.message and "amqp://bob:***@mq:5672/%2F" in info.value.message
    assert QueueWatcher.objects.get(name="shop").queue == QUEUE

    both = sync(dag(watchers=[moved]), dag("audit", schedule="orders", watchers=[moved]))
    assert (both.watchers_created, both.watchers_updated) == (0, 1)
    shop = QueueWatcher.objects.get(name="shop")
    assert (shop.queue, shop.broker_url) == (QUEUE + "-2", "amqp://bob:secret@mq:5672/%2F")


@pytest.mark.parametrize(
    "documents, path, message",
    [
        (
            [dag(watchers=[watcher(assets=["elsewhere"])])],
            "watchers[0].assets[0]",
            "feeds asset 'elsewhere', which the schedule of dag 'orders_report' does not name",
        ),
        (
            [dag(watchers=[watcher(), watcher(assets=["refunds"])])],
            "watchers[1].name",
            "watcher 'shop' is declared twice in dag 'orders_report'",
        ),
        (
            [dag(watchers=[watcher(assets=["orders", "orders"])])],
            "watchers[0].assets[1]",
            "lists asset 'orders' twice",
        ),
        (
            [dag(schedule=None, watchers=[watcher()]) | {"schedule": None}],
            "watchers[0].assets[0]",
            "which the schedule of dag 'orders_report' does not name",
        ),
        (
            [dag(watchers=[watcher()]), dag("b", watchers=[watcher(queue="another")])],
            "watchers[0].queue",
            f"watcher 'shop' has queue 'another' here but '{QUEUE}' at f0.json: watchers[0]",
        ),
        (
            [dag(watchers=[watcher(name="no spaces")])],
            "watchers[0].name",
            "may contain only letters, digits, '_' and '-'",
        ),
        (
            [dag(watchers=[watcher(broker_url="redis://x")])],
            "watchers[0].broker_url",
            "must be an amqp:// or amqps:// URL",
        ),
        (
            [dag(watchers=[{"name": "shop", "queue": QUEUE}])],
            "watchers[0]",
            "a watcher needs assets",
        ),
    ],
)
def test_a_bad_watcher_names_its_path_and_writes_nothing(documents, path, message):
    with pytest.raises(DefinitionError) as info:
        sync(*documents)
    assert info.value.path == path
    assert message in info.value.message
    assert not QueueWatcher.objects.exists()
    assert not WatcherRoute.objects.exists()
