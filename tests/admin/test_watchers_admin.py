"""Issue 28: queue watchers in the admin. A watcher and its routes are saved together through
`watchers.save_watcher` (audited before and after); parked messages are filtered and
requeued through `watchers.requeue_parked`."""

import json

from django.contrib.messages import get_messages
from django.urls import reverse

from assets_app.models import AssetEvent, AuditEntry, QueueWatcher, WatcherMessage
from assets_app.watchers import messages as watchers
from tests.factories import AssetFactory, DagFactory, QueueWatcherFactory, WatcherRouteFactory

MESSAGES = reverse("admin:assets_app_watchermessage_changelist")


def route_forms(*routes, initial=0):
    data = {
        "routes-TOTAL_FORMS": str(len(routes)),
        "routes-INITIAL_FORMS": str(initial),
        "routes-MIN_NUM_FORMS": "0",
        "routes-MAX_NUM_FORMS": "1000",
    }
    for i, route in enumerate(routes):
        for key, value in route.items():
            data[f"routes-{i}-{key}"] = value
    return data


def test_a_watcher_and_its_routes_are_saved_together_and_audited(staff_client):
    orders, customers = AssetFactory(name="orders"), AssetFactory(name="customers")
    add = reverse("admin:assets_app_queuewatcher_add")
    form = {
        "name": "sales",
        "broker_url": "amqp://svc:secret@rabbit:5672/%2F",
        "queue": "sales-events",
        "enabled": "on",
        "prefetch": "10",
        **route_forms(
            {"routing_key_pattern": "sales.*", "assets": [orders.pk, customers.pk]},
            {
                "routing_key_pattern": "*",
                "body_field": "kind",
                "body_value": "x",
                "assets": [orders.pk],
            },
        ),
    }
    response = staff_client.post(add, form, follow=True)
    assert response.status_code == 200
    watcher = QueueWatcher.objects.get(name="sales")
    assert [sorted(r.assets.values_list("name", flat=True)) for r in watcher.routes.all()] == [
        ["customers", "orders"],
        ["orders"],
    ]
    entry = AuditEntry.objects.get(action="queue_watcher.create")
    assert entry.actor_name == "operator"
    assert entry.detail["before"] is None
    assert entry.detail["after"]["broker_url"] == "amqp://svc:***@rabbit:5672/%2F"
    assert len(entry.detail["after"]["routes"]) == 2

    # A bad URL scheme is refused by the form, nothing written.
    change = reverse("admin:assets_app_queuewatcher_change", args=[watcher.pk])
    staff_client.post(change, {**form, "broker_url": "http://x"}, follow=True)
    assert AuditEntry.objects.filter(action="queue_watcher.update").count() == 0


def test_parked_messages_are_filtered_and_requeued_after_a_route_is_added(staff_client):
    watcher = QueueWatcherFactory()
    asset = AssetFactory()
    table = watchers.route_table(watcher_id=watcher.pk)
    for n in range(3):
        body = json.dumps({"n": n}).encode()
        watchers.handle_message(
            table=table, delivery=watchers.Delivery(routing_key="k", body=body, message_id=f"m{n}")
        )
    listed = staff_client.get(MESSAGES, {"state": "parked"})
    assert listed.status_code == 200 and listed.content.count(b"no route matches") >= 3
    WatcherRouteFactory(watcher=watcher, assets=[asset])
    ids = list(WatcherMessage.objects.values_list("id", flat=True))
    response = staff_client.post(
        MESSAGES, {"action": "requeue", "_selected_action": ids}, follow=True
    )
    assert [str(m) for m in get_messages(response.wsgi_request)] == [
        "3 registered, 0 still parked."
    ]
    assert AssetEvent.objects.filter(asset=asset).count() == 3
    assert AuditEntry.objects.get(action="watcher_message.requeue").actor_name == "operator"
    page = staff_client.get(reverse("admin:assets_app_watchermessage_change", args=[ids[0]]))
    assert page.status_code == 200


def test_a_definitions_watcher_shows_its_declared_routes_and_keeps_its_queue(staff_client):
    """A watcher a Dag definition declared (issue 28): its page lists the declared routes with
    their Dag, read only; the form edits the operator's routes only and cannot change the
    definitions' queue (an edited queue field is not applied)."""
    orders = AssetFactory(name="orders")
    watcher = QueueWatcherFactory(name="shop", queue="shop-q", from_definitions=True)
    declared = WatcherRouteFactory(
        watcher=watcher, dag=DagFactory(dag_id="orders_report"), assets=[orders]
    )
    change = reverse("admin:assets_app_queuewatcher_change", args=[watcher.pk])
    page = staff_client.get(change).content.decode()
    assert "dag orders_report: * &rarr; orders" in page
    assert 'name="queue"' not in page  # read only

    form = {"enabled": "on", "prefetch": "7", "queue": "moved", **route_forms()}
    response = staff_client.post(change, form, follow=True)
    assert response.status_code == 200
    watcher.refresh_from_db()
    assert (watcher.queue, watcher.prefetch) == ("shop-q", 7)
    assert list(watcher.routes.values_list("pk", flat=True)) == [declared.pk]
