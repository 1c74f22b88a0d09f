"""Crash: SIGKILL the django-q2 cluster while it delivers webhooks to a failing receiver (issue 29).

A local receiver answers 500 to its first FAILING_REQUESTS requests, then 200. 20 messages are
written (asset events registered with a subscription). A real `manage.py qcluster` runs the delivery
task (`assets_app.tasks.deliver_webhooks`, enqueued as the sweep would) with a shortened
schedule (backoff base 0.4 s, cap 2 s, 1 s timeout, so a lease of 3 s); it is SIGKILLed at
random moments while it is sending (after some requests came in) KILLS times, and
restarted. Then: every message reached the receiver with a 200
(none lost), each under one webhook-id whatever the number of attempts, every request verified
by the Standard Webhooks reference verifier, and each recorded retry spaced as the backoff
specifies ([c/2, c] after the k-th failure, c = base * 2^(k-1) capped).
"""

import random
import time

import pytest
from django.conf import settings
from django_q.tasks import async_task
from standardwebhooks.webhooks import Webhook

from assets_app.events_out import webhooks
from assets_app.models import DeliveryState, WebhookAttempt, WebhookDelivery
from assets_app.registration import outlets as registration
from tests.asset_flow import asset_outlet, payload
from tests.factories import AssetFactory
from tests.webhook_receiver import Receiver

from .conftest import figure, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

MESSAGES = 20
KILLS = 5
FAILING_REQUESTS = 70
BASE, CAP, TIMEOUT = 0.4, 2.0, 1.0
CLUSTER_ENV = {
    "Q_CLUSTER_WORKERS": "2",
    "Q_CLUSTER_TIMEOUT": "12",
    "Q_CLUSTER_RETRY": "15",
    "ASSET_DRAIN_TIME_BUDGET_SECONDS": "5",
    "WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
    "WEBHOOK_BACKOFF_BASE_SECONDS": str(BASE),
    "WEBHOOK_BACKOFF_CAP_SECONDS": str(CAP),
    "WEBHOOK_TIMEOUT_SECONDS": str(TIMEOUT),
    "WEBHOOK_TIME_BUDGET_SECONDS": "8",
    "WEBHOOK_MAX_IN_FLIGHT": "4",
}


def test_a_killed_cluster_loses_no_webhook_and_keeps_ids_and_spacing(servers):
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    started = time.time()
    plan = lambda request, n: (500, {}) if n < FAILING_REQUESTS else (200, {})  # noqa: E731
    env = {
        **CLUSTER_ENV,
        "FERNET_KEY": settings.FERNET_KEY,
        "FERNET_KEY_FILE": str(settings.FERNET_KEY_FILE),
    }
    with Receiver(plan=plan) as receiver:
        saved = webhooks.create_endpoint(
            url=receiver.url, subscriptions=[webhooks.SubscriptionSpec("asset.event.registered")]
        )
        assets = [AssetFactory(name=f"kill-{i}") for i in range(MESSAGES)]
        registration.register_payload(payload=payload(outlets=[asset_outlet(a) for a in assets]))
        assert WebhookDelivery.objects.count() == MESSAGES

        cluster = servers("qcluster", env=env)
        for kill in range(KILLS):
            async_task("assets_app.tasks.deliver_webhooks")
            # Kill while it sends: once this start has made some requests, at a random moment.
            wait_until(lambda k=kill: len(receiver.received) >= 12 * (k + 1), timeout=20)
            time.sleep(random.uniform(0.0, 0.6))
            cluster.kill()
            cluster.start()
        async_task("assets_app.tasks.deliver_webhooks")
        wait_until(
            lambda: not WebhookDelivery.objects.exclude(state=DeliveryState.DELIVERED).exists(),
            timeout=25,
        )
        cluster.kill()

    ids = set(WebhookDelivery.objects.values_list("message_id", flat=True))
    assert {r.message_id for r in receiver.received} == ids  # nothing unknown, nothing lost
    verifier = Webhook(saved.secret)
    for request in receiver.received:
        verifier.verify(request.body, request.headers)
    delivered_ids = {r.message_id for r in receiver.received[FAILING_REQUESTS:]}
    assert delivered_ids == ids  # every message got through once the receiver healed
    # Recorded retries are spaced as specified (an attempt lost with its process is not
    # recorded: its lease expires and the next attempt comes later still).
    for attempt in WebhookAttempt.objects.exclude(next_attempt_at=None).select_related("delivery"):
        k = WebhookAttempt.objects.filter(delivery=attempt.delivery, id__lte=attempt.id).count()
        ceiling = min(CAP, BASE * 2 ** (k - 1))
        gap = (attempt.next_attempt_at - attempt.attempted_at).total_seconds()
        assert ceiling / 2 - 0.01 <= gap <= ceiling + 0.01, (k, gap)
    requests = len(receiver.received)
    assert requests > FAILING_REQUESTS
    figure(
        f"webhooks: {MESSAGES} messages, {KILLS} cluster kills, {requests} requests, "
        f"{WebhookAttempt.objects.count()} recorded attempts, all delivered in "
        f"{time.time() - started:.1f} s"
    )
