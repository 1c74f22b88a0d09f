"""Crash: SIGKILL the timers process while it delivers webhooks to a failing receiver (issues 29
and 41).

A local receiver answers 500 to its first FAILING_REQUESTS requests, then 200. 20 messages are
written (asset events registered with a subscription). A real `manage.py run_timers` delivers
them (its delivery timer, woken by the messages' NOTIFY and then at each retry's due time) with
a shortened schedule (backoff base 0.4 s, cap 2 s, 1 s timeout, so a lease of 3 s); at random
moments while it is sending (after some requests came in) it is SIGKILLed KILLS times: the
timers' child alone (its supervisor forks a new one) or the whole process group (started again
here, as a host restarting it would). Then: every message reached the receiver with a 200
(none lost), each under one webhook-id whatever the number of attempts, every request verified
by the Standard Webhooks reference verifier, and each recorded retry spaced as the backoff
specifies ([c/2, c] after the k-th failure, c = base * 2^(k-1) capped).
"""

import contextlib
import random
import time

import psutil
import pytest
from django.conf import settings
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
TIMERS_ENV = {
    "WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
    "WEBHOOK_BACKOFF_BASE_SECONDS": str(BASE),
    "WEBHOOK_BACKOFF_CAP_SECONDS": str(CAP),
    "WEBHOOK_TIMEOUT_SECONDS": str(TIMEOUT),
    "WEBHOOK_TIME_BUDGET_SECONDS": "8",
    "WEBHOOK_MAX_IN_FLIGHT": "4",
}


def _timers_child(supervisor_pid: int, group: str = "events") -> psutil.Process:
    """The supervisor's child running `group` (the delivery's: `timers-events`), waiting for
    the supervisor to fork it."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for child in psutil.Process(supervisor_pid).children():
            with contextlib.suppress(psutil.Error):
                if child.name() == f"timers-{group}":
                    return child
        time.sleep(0.02)
    raise AssertionError(f"the timers' supervisor forked no timers-{group}")


def test_killed_timers_lose_no_webhook_and_keep_ids_and_spacing(servers):
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    started = time.time()
    plan = lambda request, n: (500, {}) if n < FAILING_REQUESTS else (200, {})  # noqa: E731
    env = {
        **TIMERS_ENV,
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

        process = servers("timers", env=env)
        children = 0
        for kill in range(KILLS):
            # Kill while it sends: once this start has made some requests, at a random moment.
            wait_until(lambda k=kill: len(receiver.received) >= 12 * (k + 1), timeout=20)
            time.sleep(random.uniform(0.0, 0.6))
            if kill % 2 == 0:  # the child: its supervisor forks another at once
                child = _timers_child(process.pid)
                child.kill()
                child.wait(10)
                assert _timers_child(process.pid).pid != child.pid
                children += 1
            else:  # the whole process group, started again
                process.kill()
                process.start()
        wait_until(
            lambda: not WebhookDelivery.objects.exclude(state=DeliveryState.DELIVERED).exists(),
            timeout=25,
        )
        process.stop(timeout=10)
        assert not process.running

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
        f"webhooks: {MESSAGES} messages, {KILLS} timers kills ({children} of the child alone), "
        f"{requests} requests, "
        f"{WebhookAttempt.objects.count()} recorded attempts, all delivered in "
        f"{time.time() - started:.1f} s"
    )
