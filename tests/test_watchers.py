"""Queue watchers (issue 28) against the real RabbitMQ and PostgreSQL: routing to several
assets, one registration per message id, parking with a reason, requeue after a new route, and
the ack after commit (a crash between commit and ack is a redelivery that registers nothing)."""

import hashlib
import json
import threading
import time

import pytest
from django.db.models import Count

from assets_app.models import (
    AssetDagRunQueue,
    AssetEvent,
    AuditEntry,
    MessageState,
    ParkReason,
    QueueWatcher,
    WatcherMessage,
)
from assets_app.operations import audit, metrics
from assets_app.watchers import consumer as watcher_consumer
from assets_app.watchers import messages as watchers
from tests import rabbitmq
from tests.asset_flow import scheduled_dag
from tests.factories import AssetFactory, QueueWatcherFactory, WatcherRouteFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def watcher():
    w = QueueWatcherFactory()
    yield w
    rabbitmq.delete(w.queue)


def consume(watcher, count, *, before_ack=None):
    """Run the consumer in a thread (its own connections, as the process does) until it acked
    `count` messages; fail after 30 s."""
    stop = threading.Event()
    result: dict = {}

    def target():
        try:
            result["acked"] = watcher_consumer.consume(
                watcher_id=watcher.pk, stop=stop, before_ack=before_ack, max_messages=count
            )
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(timeout=30)
    stop.set()
    thread.join(timeout=10)
    assert not thread.is_alive()
    if "error" in result:
        raise result["error"]
    return result["acked"]


def test_a_message_routed_to_several_assets_registers_an_event_on_each(watcher):
    orders, customers, other = AssetFactory(), AssetFactory(), AssetFactory()
    dag = scheduled_dag("report_on_orders", {"all": [orders.name]})
    WatcherRouteFactory(watcher=watcher, routing_key_pattern="sales.*", assets=[orders, customers])
    WatcherRouteFactory(watcher=watcher, routing_key_pattern="hr.*", assets=[other])
    rabbitmq.publish(
        watcher.queue,
        [rabbitmq.message({"day": "2026-12-03"}, routing_key="sales.eu", message_id="m-1")],
    )

    assert consume(watcher, 1) == 1

    events = AssetEvent.objects.order_by("asset_id")
    assert [e.asset_id for e in events] == sorted([orders.pk, customers.pk])
    for event in events:
        assert event.extra == {
            "from_queue": watcher.name,
            "message_id": "m-1",
            "routing_key": "sales.eu",
            "payload": {"day": "2026-12-03"},
        }
    # Queued for the Dag scheduled on orders (and only it), with the event.
    assert list(AssetDagRunQueue.objects.values_list("target_dag_id", "asset_event_id")) == [
        (dag.dag_id, events.get(asset=orders).pk)
    ]
    row = WatcherMessage.objects.get()
    assert (row.message_id, row.state, row.body) == ("m-1", MessageState.REGISTERED, None)
    assert sorted(row.event_ids) == sorted(e.pk for e in events)
    assert rabbitmq.depth(watcher.queue) == 0


def test_a_body_field_route_matches_on_the_value(watcher):
    eu, us = AssetFactory(), AssetFactory()
    WatcherRouteFactory(watcher=watcher, body_field="region.code", body_value="eu", assets=[eu])
    WatcherRouteFactory(watcher=watcher, body_field="n", body_value="42", assets=[us])
    rabbitmq.publish(
        watcher.queue,
        [
            rabbitmq.message({"region": {"code": "eu"}}, message_id="a"),
            rabbitmq.message({"region": {"code": "us"}, "n": 42}, message_id="b"),
            rabbitmq.message({"region": "eu"}, message_id="c"),
        ],
    )
    consume(watcher, 3)
    registered = dict(
        AssetEvent.objects.values_list("extra__message_id", "asset_id").order_by("id")
    )
    assert registered == {"a": eu.pk, "b": us.pk}
    assert WatcherMessage.objects.get(message_id="c").reason == ParkReason.UNROUTABLE


def test_a_duplicate_message_id_registers_once(watcher):
    assets = [AssetFactory() for _ in range(3)]
    WatcherRouteFactory(watcher=watcher, assets=assets)
    duplicates_before = metrics.value(metrics.WATCHER_DUPLICATES)
    rabbitmq.publish(
        watcher.queue,
        [rabbitmq.message({"n": i}, message_id="same") for i in range(3)]
        + [rabbitmq.message({"n": 9}, message_id="other")],
    )

    assert consume(watcher, 4) == 4  # every delivery acknowledged

    per_message = dict(
        AssetEvent.objects.values_list("extra__message_id")
        .annotate(n=Count("id"))
        .values_list("extra__message_id", "n")
    )
    assert per_message == {"same": 3, "other": 3}  # one event per asset per message
    assert AssetEvent.objects.get(extra__message_id="same", asset=assets[0]).extra["payload"] == {
        "n": 0
    }
    assert WatcherMessage.objects.count() == 2
    assert metrics.value(metrics.WATCHER_DUPLICATES) - duplicates_before == 2
    assert rabbitmq.depth(watcher.queue) == 0


def test_a_message_without_id_gets_a_stable_derived_one(watcher):
    asset = AssetFactory()
    WatcherRouteFactory(watcher=watcher, assets=[asset])
    body = json.dumps({"file": "a.csv"}).encode()
    rabbitmq.publish(watcher.queue, [rabbitmq.message(body, routing_key="files") for _ in range(2)])
    consume(watcher, 2)
    row = WatcherMessage.objects.get()
    assert row.message_id_derived
    assert row.message_id == "sha256:" + hashlib.sha256(b"files\0" + body).hexdigest()
    assert AssetEvent.objects.count() == 1


def test_unparseable_and_unroutable_messages_are_parked_with_their_reason(watcher):
    WatcherRouteFactory(watcher=watcher, routing_key_pattern="known", assets=[AssetFactory()])
    too_deep = json.dumps(json.loads("[" * 100 + "]" * 100)).encode()
    rabbitmq.publish(
        watcher.queue,
        [
            rabbitmq.message(b"\xff\xfe", routing_key="known", message_id="bad-utf8"),
            rabbitmq.message(b"{not json", routing_key="known", message_id="bad-json"),
            rabbitmq.message(too_deep, routing_key="known", message_id="too-deep"),
            rabbitmq.message({"s": "a\u0000b"}, routing_key="known", message_id="nul"),
            rabbitmq.message({"ok": 1}, routing_key="unknown", message_id="nowhere"),
        ],
    )

    assert consume(watcher, 5) == 5

    parked = {m.message_id: m for m in WatcherMessage.objects.all()}
    assert {k: m.reason for k, m in parked.items()} == {
        "bad-utf8": ParkReason.NOT_UTF8,
        "bad-json": ParkReason.NOT_JSON,
        "too-deep": ParkReason.INVALID_BODY,
        "nul": ParkReason.INVALID_BODY,  # PostgreSQL's jsonb cannot hold it
        "nowhere": ParkReason.UNROUTABLE,
    }
    assert all(m.state == MessageState.PARKED and m.detail for m in parked.values())
    assert bytes(parked["bad-utf8"].body) == b"\xff\xfe"
    assert parked["nowhere"].routing_key == "unknown"
    assert not AssetEvent.objects.exists()  # nothing else written
    assert not AssetDagRunQueue.objects.exists()
    assert rabbitmq.depth(watcher.queue) == 0  # acknowledged


def test_a_parked_message_is_registered_by_a_requeue_after_a_route_is_added(watcher):
    first, later = AssetFactory(), AssetFactory()
    WatcherRouteFactory(watcher=watcher, routing_key_pattern="orders.*", assets=[first])
    rabbitmq.publish(
        watcher.queue,
        [
            rabbitmq.message({"id": 7}, routing_key="invoices.eu", message_id="inv-7"),
            rabbitmq.message(b"junk", routing_key="invoices.eu", message_id="junk"),
        ],
    )
    consume(watcher, 2)
    parked = WatcherMessage.objects.get(message_id="inv-7")
    junk = WatcherMessage.objects.get(message_id="junk")

    WatcherRouteFactory(watcher=watcher, routing_key_pattern="invoices.*", assets=[later])
    actor = audit.Actor(name="ops", via="admin")
    result = watchers.requeue_parked(ids=[parked.pk, junk.pk], actor=actor)

    assert result.registered == (parked.pk,) and result.still_parked == (junk.pk,)
    parked.refresh_from_db()
    assert (parked.state, parked.reason, parked.body, parked.requeues) == (
        MessageState.REGISTERED,
        "",
        None,
        1,
    )
    event = AssetEvent.objects.get()
    assert event.asset_id == later.pk and event.extra["payload"] == {"id": 7}
    assert parked.event_ids == [event.pk]
    junk.refresh_from_db()
    assert (junk.state, junk.reason, junk.requeues) == (MessageState.PARKED, "not_json", 1)
    entry = AuditEntry.objects.get(action="watcher_message.requeue")
    assert entry.actor_name == "ops" and entry.row_count == 2
    # A second requeue of a registered message does nothing.
    assert watchers.requeue_parked(ids=[parked.pk]).registered == ()
    assert AssetEvent.objects.count() == 1


class Crash(BaseException):
    """The process dying (a BaseException, as SystemExit: the consumer does not catch it)."""


def test_a_crash_between_commit_and_ack_is_a_redelivery_that_registers_nothing(watcher):
    assets = [AssetFactory(), AssetFactory()]
    WatcherRouteFactory(watcher=watcher, assets=assets)
    rabbitmq.publish(watcher.queue, [rabbitmq.message({"x": 1}, message_id="crash-1")])
    seen = []

    def crash_before_ack(outcome):
        seen.append(outcome.kind)
        raise Crash  # committed, not acknowledged: the process "dies" here

    with pytest.raises(Crash):
        consume(watcher, 1, before_ack=crash_before_ack)
    assert AssetEvent.objects.count() == 2  # committed

    # The broker delivers it again (the connection closed without an ack).
    assert consume(watcher, 1, before_ack=lambda o: seen.append(o.kind)) == 1
    assert seen == ["registered", "duplicate"]
    assert AssetEvent.objects.count() == 2
    assert WatcherMessage.objects.count() == 1
    assert rabbitmq.depth(watcher.queue) == 0


def test_two_consumers_on_one_queue_register_every_message_once(watcher):
    assets = [AssetFactory() for _ in range(4)]
    for i, asset in enumerate(assets):
        WatcherRouteFactory(watcher=watcher, routing_key_pattern=f"k{i}", assets=[asset])
    n = 200
    rabbitmq.publish(
        watcher.queue,
        [rabbitmq.message({"i": i}, routing_key=f"k{i % 4}", message_id=f"m{i}") for i in range(n)],
    )
    stop = threading.Event()
    counts: list[int] = []
    threads = [
        threading.Thread(
            target=lambda: counts.append(watcher_consumer.consume(watcher_id=watcher.pk, stop=stop))
        )
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    deadline = 60
    started = time.monotonic()
    while WatcherMessage.objects.count() < n and time.monotonic() - started < deadline:
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join(timeout=15)
    assert sum(counts) == n
    assert AssetEvent.objects.count() == n
    assert set(AssetEvent.objects.values_list("extra__message_id", flat=True)) == {
        f"m{i}" for i in range(n)
    }
    for asset in assets:
        assert AssetEvent.objects.filter(asset=asset).count() == n // 4


def test_the_consumer_stops_when_its_watcher_is_disabled(watcher, settings):
    settings.ASSET_WATCHER_CHECK_SECONDS = 0.2
    stop = threading.Event()
    thread = threading.Thread(
        target=lambda: watcher_consumer.consume(watcher_id=watcher.pk, stop=stop)
    )
    thread.start()
    deadline = time.monotonic() + 10
    while not QueueWatcher.objects.filter(pk=watcher.pk, depth_checked_at__isnull=False).exists():
        assert time.monotonic() < deadline, "the consumer did not connect"
        time.sleep(0.05)
    assert QueueWatcher.objects.get(pk=watcher.pk).queue_depth == 0
    QueueWatcher.objects.filter(pk=watcher.pk).update(enabled=False)
    thread.join(timeout=10)
    stop.set()
    assert not thread.is_alive()


def test_message_ids_longer_than_the_column_are_digested_not_cut():
    asset = AssetFactory()
    watcher = QueueWatcherFactory()
    WatcherRouteFactory(watcher=watcher, assets=[asset])
    table = watchers.route_table(watcher_id=watcher.pk)
    long_a, long_b = "x" * 300 + "a", "x" * 300 + "b"  # the same first 255 characters
    for message_id in (long_a, long_b, long_a):
        watchers.handle_message(
            table=table,
            delivery=watchers.Delivery(routing_key="k", body=b"{}", message_id=message_id),
        )
    assert AssetEvent.objects.count() == 2
    assert all(
        m.startswith("sha256:") for m in WatcherMessage.objects.values_list("message_id", flat=True)
    )


def test_an_unexpected_error_before_the_ack_is_retried_after_a_backoff(watcher, settings):
    settings.ASSET_WATCHER_RECONNECT_BASE_SECONDS = 0.05
    WatcherRouteFactory(watcher=watcher, assets=[AssetFactory()])
    rabbitmq.publish(watcher.queue, [rabbitmq.message({"x": 1}, message_id="bug-1")])
    seen = []

    def fail_once(outcome):
        seen.append(outcome.kind)
        if len(seen) == 1:
            raise RuntimeError("a bug")

    assert consume(watcher, 1, before_ack=fail_once) == 1  # the same consumer, reconnected
    assert seen == ["registered", "duplicate"]
    assert AssetEvent.objects.count() == 1 and rabbitmq.depth(watcher.queue) == 0


def test_messages_it_cannot_store_are_parked_and_acked_and_the_rest_flow_without_a_reconnect(
    watcher, settings, caplog
):
    """Issue 38: a message whose id or routing key holds a NUL byte, and one over the HTTP
    door's size bound (MAX_REQUEST_BODY_BYTES, 10 MB), are parked and acknowledged; the 100
    good messages around them are registered, and the consumer never reconnects."""
    settings.ASSET_WATCHER_RECONNECT_BASE_SECONDS = 0.05
    settings.ASSET_WATCHER_RECONNECT_CAP_SECONDS = 0.05
    asset = AssetFactory()
    WatcherRouteFactory(watcher=watcher, routing_key_pattern="*", assets=[asset])
    big = json.dumps({"blob": "x" * (20 * 1024 * 1024)}).encode()
    good = [rabbitmq.message({"n": i}, routing_key="k", message_id=f"good-{i}") for i in range(100)]
    rabbitmq.publish(
        watcher.queue,
        [
            *good[:40],
            rabbitmq.message({"n": "nul id"}, routing_key="k", message_id="bad\x00id"),
            *good[40:70],
            rabbitmq.message(big, routing_key="k", message_id="too-big"),
            *good[70:90],
            rabbitmq.message({"n": "nul key"}, routing_key="k\x00ey", message_id="nul-key"),
            *good[90:],
        ],
    )

    with caplog.at_level("WARNING", logger="assets_app.watchers.consumer"):
        assert consume(watcher, 103) == 103

    assert "reconnecting" not in caplog.text
    registered = WatcherMessage.objects.filter(state=MessageState.REGISTERED)
    assert sorted(registered.values_list("message_id", flat=True)) == sorted(
        f"good-{i}" for i in range(100)
    )
    assert AssetEvent.objects.count() == 100
    parked = {m.message_id: m for m in WatcherMessage.objects.filter(state=MessageState.PARKED)}
    nul_id = "sha256:" + hashlib.sha256(b"bad\x00id").hexdigest()
    assert {k: m.reason for k, m in parked.items()} == {
        nul_id: ParkReason.UNSTORABLE,
        "too-big": ParkReason.TOO_LARGE,
        "nul-key": ParkReason.UNSTORABLE,
    }
    assert "NUL" in parked[nul_id].detail and "bad\\x00id" in parked[nul_id].detail
    assert parked["nul-key"].routing_key == "k\\x00ey"
    assert "10485760" in parked["too-big"].detail
    assert len(bytes(parked["too-big"].body)) == 0  # the bound holds for what is stored too
    assert rabbitmq.depth(watcher.queue) == 0
    # A requeue cannot make them storable: they stay parked, with their reason.
    result = watchers.requeue_parked(ids=[m.pk for m in parked.values()])
    assert result.registered == ()
    assert dict(
        WatcherMessage.objects.filter(state=MessageState.PARKED).values_list("message_id", "reason")
    ) == {m: r.reason for m, r in parked.items()}


def test_only_a_database_that_is_away_makes_the_consumer_retry_a_message(watcher, monkeypatch):
    """A database error is an outage (raised: not acked, reconnect) only when the database is
    away or full; any other refusal parks the message so that it cannot stop the queue."""
    import psycopg
    from django.db import IntegrityError, OperationalError

    table = watchers.route_table(watcher_id=watcher.pk)
    delivery = watchers.Delivery(routing_key="k", body=b'{"n": 1}', message_id="m", headers={})
    away = OperationalError("server closed the connection")
    away.__cause__ = psycopg.OperationalError("server closed the connection")
    refused = IntegrityError("something no check foresaw")

    def raising(error):
        def handle_message(**kwargs):
            raise error

        return handle_message

    monkeypatch.setattr(watchers, "handle_message", raising(away))
    with pytest.raises(OperationalError):
        watcher_consumer.handle(table, delivery)
    assert not WatcherMessage.objects.exists()

    monkeypatch.setattr(watchers, "handle_message", raising(refused))
    outcome = watcher_consumer.handle(table, delivery)
    assert (outcome.kind, outcome.message_id) == ("parked", "m")
    row = WatcherMessage.objects.get()
    assert (row.reason, bytes(row.body)) == (ParkReason.UNSTORABLE, b'{"n": 1}')
    assert "IntegrityError: something no check foresaw" in row.detail
