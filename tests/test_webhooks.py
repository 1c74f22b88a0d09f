"""Events out (issue 29): subscriptions, messages written with what they report, delivery by
the cluster's function to a real local receiver, verified by the Standard Webhooks project's
own verifier (`standardwebhooks`, requirements-dev), and the SSRF guard."""

import base64
import json
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from assets_app.api import public_auth
from assets_app.events_out import delivery as webhook_delivery
from assets_app.events_out import egress, webhooks
from assets_app.guards import encryption
from assets_app.models import (
    AuditEntry,
    AuditTarget,
    DeliveryState,
    EndpointState,
    TIState,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
)
from assets_app.outbox import rows as outbox
from assets_app.registration import outlets as registration
from assets_app.scheduling import runs
from assets_app.task_state import finishing, starting
from tests.asset_flow import asset_outlet, outbox_row, payload
from tests.factories import AssetFactory
from tests.webhook_receiver import Receiver, always

pytestmark = pytest.mark.django_db

ASSET_EVENT = "asset.event.registered"


@pytest.fixture
def local(settings):
    """The local receiver's address is allowed (the SSRF guard refuses it otherwise)."""
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1/32"]
    settings.WEBHOOK_BACKOFF_BASE_SECONDS = 0.2
    settings.WEBHOOK_BACKOFF_CAP_SECONDS = 2.0
    settings.WEBHOOK_TIMEOUT_SECONDS = 2.0
    return settings


def endpoint(url: str, *subscriptions: tuple[str, str], **fields) -> webhooks.SavedEndpoint:
    specs = [webhooks.SubscriptionSpec(t, p) for t, p in subscriptions] or [
        webhooks.SubscriptionSpec(ASSET_EVENT, "*")
    ]
    return webhooks.create_endpoint(url=url, subscriptions=specs, **fields)


def verify(secret: str, request) -> dict:
    return Webhook(secret).verify(request.body, request.headers)


# --- subscriptions and secrets -----------------------------------------------------------------


def test_the_secret_is_whsec_base64_stored_encrypted_and_rotation_signs_twice(local):
    saved = endpoint("http://127.0.0.1:9/hook")
    assert saved.secret.startswith("whsec_") and len(base64.b64decode(saved.secret[6:])) == 32
    stored = WebhookEndpoint.objects.get()
    assert saved.secret not in stored.secret
    assert encryption.decrypt(stored.secret) == saved.secret

    rotated = webhooks.rotate_secret(endpoint_id=stored.pk)
    stored.refresh_from_db()
    now = timezone.now()
    message = WebhookDelivery(message_id="msg_x", body='{"a":1}')
    headers = webhooks.headers(endpoint=stored, delivery=message, now=now)
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (saved.secret, rotated.secret):  # either secret verifies, during the overlap
        Webhook(secret).verify(message.body, headers)
    # After the overlap only the new secret signs.
    later = now + timedelta(days=2)
    headers = webhooks.headers(endpoint=stored, delivery=message, now=later)
    assert len(headers["webhook-signature"].split(" ")) == 1
    assert headers["webhook-signature"] == webhooks.sign(
        secret=rotated.secret, message_id="msg_x", timestamp=int(later.timestamp()), body='{"a":1}'
    )


def test_the_ssrf_guard_refuses_internal_addresses_unless_allowed(settings):
    settings.WEBHOOK_ALLOWED_HOSTS = []
    for url in (
        "http://127.0.0.1/hook",
        "http://localhost:8000/hook",
        "http://10.1.2.3/",
        "http://192.168.0.1/",
        "http://172.16.0.1/",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]/",
        "http://[fe80::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://0.0.0.0/",
        "ftp://example.com/",
    ):
        with pytest.raises(egress.EgressRefused):
            egress.check_url(url)
    with pytest.raises(egress.EgressRefused):
        endpoint("http://127.0.0.1:9/hook")
    assert not WebhookEndpoint.objects.exists()
    assert egress.check_url("http://93.184.215.14/hook").address == "93.184.215.14"
    settings.WEBHOOK_ALLOWED_HOSTS = ["10.0.0.0/8", "localhost"]
    assert egress.check_url("http://10.1.2.3/").address == "10.1.2.3"
    egress.check_url("http://localhost/")
    # The metadata address needs its own entry, a wide range does not open it.
    settings.WEBHOOK_ALLOWED_HOSTS = ["169.254.0.0/16"]
    egress.check_url("http://169.254.1.1/")


@pytest.mark.parametrize(
    "url",
    [
        "http://[::127.0.0.1]/",  # IPv4-compatible
        "http://[::10.0.0.1]/",
        "http://[64:ff9b::127.0.0.1]/",  # NAT64, well-known prefix
        "http://[64:ff9b::a9fe:a9fe]/",  # NAT64 of the metadata address
        "http://[64:ff9b:1::a00:1]/",  # NAT64, local-use prefix
        "http://[2002:7f00:1::]/",  # 6to4 of 127.0.0.1
        "http://[2002:c0a8:1::1]/",  # 6to4 of 192.168.0.1
        "http://[2001:0:4136:e378:8000:63bf:f5ff:fffe]/",  # Teredo, client 10.0.0.1
    ],
)
def test_an_ipv6_address_that_embeds_an_ipv4_is_judged_by_it(settings, url):
    """Issue 38: the forms of a private IPv4 inside an IPv6 address passed the guard."""
    settings.WEBHOOK_ALLOWED_HOSTS = []
    with pytest.raises(egress.EgressRefused):
        egress.check_url(url)


def test_an_ipv6_address_that_embeds_a_public_ipv4_passes(settings):
    settings.WEBHOOK_ALLOWED_HOSTS = []
    assert egress.check_url("http://[64:ff9b::5db8:d70e]/").address == "64:ff9b::5db8:d70e"
    assert egress.check_url("http://[2002:5db8:d70e::1]/").address == "2002:5db8:d70e::1"


def test_the_guard_runs_again_at_delivery(local):
    """An endpoint saved while allowed, then the address refused (as a DNS rebinding would make
    a public name resolve to 127.0.0.1): the attempt is refused before any connection."""
    with Receiver() as receiver:
        endpoint(receiver.url)
        registration.register_payload(payload=payload(outlets=[asset_outlet(AssetFactory())]))
        local.WEBHOOK_ALLOWED_HOSTS = []
        webhook_delivery.deliver(time_budget=5, stop_when_idle=True)
        assert receiver.received == []
        attempt = WebhookAttempt.objects.get()
        assert "EgressRefused" in attempt.error and attempt.status_code is None


# --- messages written with what they report ---------------------------------------------------


def test_asset_events_write_messages_for_matching_subscriptions_in_the_same_statement(local):
    orders, other = AssetFactory(name="orders.daily"), AssetFactory(name="customers")
    a = endpoint("http://127.0.0.1:9/a", (ASSET_EVENT, "orders.*")).endpoint
    b = endpoint("http://127.0.0.1:9/b", (ASSET_EVENT, "*"), (ASSET_EVENT, "orders.*")).endpoint
    result = registration.register_payload(
        payload=payload(outlets=[asset_outlet(orders), asset_outlet(other)])
    )
    messages = list(WebhookDelivery.objects.order_by("endpoint_id", "id"))
    assert [(m.endpoint_id, m.event_type) for m in messages] == [
        (a.pk, ASSET_EVENT),
        (b.pk, ASSET_EVENT),
        (b.pk, ASSET_EVENT),
    ]  # b matches orders twice (two subscriptions) and gets one message per event
    body = json.loads(messages[0].body)
    assert body["type"] == ASSET_EVENT
    assert body["data"]["asset"]["name"] == "orders.daily"
    assert body["data"]["id"] in result.event_ids
    assert len({m.message_id for m in messages}) == 3
    # A replayed registration writes no event, hence no message.
    registration.register_payload(payload=payload(outlets=[asset_outlet(orders)]))


def test_registration_costs_no_statement_more_with_subscriptions(local):
    """The pin of tests/test_registration.py (8 statements) holds with subscriptions: the
    messages are a CTE of the events' INSERT."""
    assets = [AssetFactory(name=f"w-{i}") for i in range(5)]
    endpoint("http://127.0.0.1:9/a", (ASSET_EVENT, "w-*"))
    bodies = [payload(outlets=[asset_outlet(a) for a in assets]) for _ in range(20)]
    with CaptureQueriesContext(connection) as ctx:
        registration.register_payloads(payloads=bodies)
    writes = [q for q in ctx.captured_queries if "webhook" in q["sql"]]
    assert len(writes) == 1  # the events' statement itself
    assert WebhookDelivery.objects.count() == 100


def test_a_rolled_back_registration_leaves_no_message(local):
    endpoint("http://127.0.0.1:9/a")
    asset = AssetFactory()
    with pytest.raises(RuntimeError), transaction.atomic():
        registration.register_payload(payload=payload(outlets=[asset_outlet(asset)]))
        assert WebhookDelivery.objects.count() == 1
        raise RuntimeError("crash before commit")
    assert WebhookDelivery.objects.count() == 0


def test_an_external_event_writes_its_message(local):
    endpoint("http://127.0.0.1:9/a")
    event, _ = registration.register_external_event(asset=AssetFactory(name="ext"), extra={})
    (message,) = WebhookDelivery.objects.all()
    assert json.loads(message.body)["data"]["id"] == event.pk


def test_a_finished_run_and_a_parked_row_write_their_messages(local):
    from tests.test_dependencies import sync, ti

    saved = endpoint(
        "http://127.0.0.1:9/a",
        ("dag_run.succeeded", "etl*"),
        ("dag_run.failed", "*"),
        ("outbox.parked", "*"),
    )
    sync({"dag_id": "etl1", "tasks": [{"task_id": "only"}]})
    run = runs.trigger_dag(dag_id="etl1")
    only = ti(run, "only")
    starting.start(
        ti_id=only.id,
        try_number=only.try_number,
        hostname="h",
        unixname="u",
        pid=1,
        start_date=timezone.now(),
    )
    finishing.finish(
        ti_id=only.id, try_number=only.try_number, state=TIState.FAILED, end_date=timezone.now()
    )
    (finished,) = WebhookDelivery.objects.filter(event_type="dag_run.failed")
    data = json.loads(finished.body)["data"]
    assert (data["dag_id"], data["dag_run_id"], data["state"]) == ("etl1", run.run_id, "failed")
    row = outbox_row(payload(outlets=[], dag_id="etl1"))
    outbox.park(row_ids=[row.id])
    types = sorted(WebhookDelivery.objects.values_list("event_type", flat=True))
    assert "outbox.parked" in types
    parked = json.loads(WebhookDelivery.objects.get(event_type="outbox.parked").body)
    assert parked["data"]["outbox_row_id"] == row.id
    assert all(m.endpoint_id == saved.endpoint.pk for m in WebhookDelivery.objects.all())


# --- delivery ----------------------------------------------------------------------------------


def test_every_delivery_passes_the_reference_verifier_and_retries_keep_the_id(local):
    """500, 500, then 200: three attempts of one message, the same webhook-id each time, each
    verified by `standardwebhooks`; the attempts are spaced by the backoff's lower bound."""
    with Receiver(plan=lambda request, n: (500, {}) if n < 2 else (200, {})) as receiver:
        saved = endpoint(receiver.url)
        registration.register_payload(payload=payload(outlets=[asset_outlet(AssetFactory())]))
        deadline = timezone.now() + timedelta(seconds=10)
        while WebhookDelivery.objects.get().state != DeliveryState.DELIVERED:
            assert timezone.now() < deadline
            webhook_delivery.deliver(time_budget=1)
        assert len(receiver.received) == 3
        assert len({r.message_id for r in receiver.received}) == 1
        for request in receiver.received:
            assert verify(saved.secret, request)["type"] == ASSET_EVENT
        with pytest.raises(WebhookVerificationError):
            Webhook(webhooks.generate_secret()).verify(
                receiver.received[0].body, receiver.received[0].headers
            )
        gaps = [b.at - a.at for a, b in zip(receiver.received, receiver.received[1:], strict=False)]
        base = local.WEBHOOK_BACKOFF_BASE_SECONDS
        assert gaps[0] >= base / 2 and gaps[1] >= base  # [c/2, c] for c = base, 2 * base
        delivery = WebhookDelivery.objects.get()
        assert delivery.attempts == 3
        assert list(delivery.attempt_history.values_list("status_code", flat=True)) == [
            500,
            500,
            200,
        ]


def test_retry_after_is_honoured_and_410_disables_the_endpoint(local):
    with Receiver(plan=always(429)) as receiver:
        receiver.plan = lambda request, n: (429, {"Retry-After": "1"}) if n == 0 else (410, {})
        saved = endpoint(receiver.url)
        registration.register_payload(payload=payload(outlets=[asset_outlet(AssetFactory())]))
        (claimed,) = webhook_delivery.claim()
        assert webhook_delivery.record(claimed, webhook_delivery._send(claimed)) == "pending"
        delivery = WebhookDelivery.objects.get()
        wait = delivery.next_attempt_at - delivery.attempt_history.get().attempted_at
        assert wait.total_seconds() >= 1.0  # the backoff alone would be 0.1 to 0.2 s
        assert webhook_delivery.claim() == []  # not due yet
        deadline = timezone.now() + timedelta(seconds=5)
        while not receiver.received[1:]:
            assert timezone.now() < deadline
            webhook_delivery.deliver(time_budget=0.5)
        saved.endpoint.refresh_from_db()
        assert saved.endpoint.state == EndpointState.DISABLED
        assert WebhookDelivery.objects.get().state == DeliveryState.PENDING  # kept, not sent
        registration.register_payload(payload=payload(outlets=[asset_outlet(AssetFactory())]))
        webhook_delivery.deliver(time_budget=0.5)
        assert len(receiver.received) == 2  # nothing goes to a disabled endpoint
        receiver.plan = always(200)
        webhook_delivery.resume(endpoint_ids=[saved.endpoint.pk])
        webhook_delivery.deliver(time_budget=2, stop_when_idle=True)
        assert set(WebhookDelivery.objects.values_list("state", flat=True)) == {"delivered"}


def test_at_most_max_in_flight_per_endpoint(local):
    """A slow receiver and 12 messages to an endpoint with max_in_flight 3: never more than 3
    requests at once, and a second claimer gets nothing while 3 are leased."""
    with Receiver(delay=0.3) as receiver:
        endpoint(receiver.url, max_in_flight=3)
        asset = AssetFactory()
        registration.register_payload(
            payload=payload(
                outlets=[asset_outlet(asset)] * 1,
                outlet_events=[
                    {"dest_asset_key": {"name": asset.name, "uri": asset.uri}, "extra": {"i": i}}
                    for i in range(12)
                ],
            )
        )
        assert WebhookDelivery.objects.count() == 12
        first = webhook_delivery.claim()
        assert len(first) == 3
        assert webhook_delivery.claim() == []  # the bound counts leased attempts
        for d in first:
            webhook_delivery.record(d, webhook_delivery._send(d))
        webhook_delivery.deliver(time_budget=6, stop_when_idle=True)
        assert WebhookDelivery.objects.filter(state="delivered").count() == 12
        starts = sorted(r.at for r in receiver.received)
        overlapping = max(sum(1 for s in starts if t <= s < t + 0.29) for t in starts)
        assert overlapping <= 3


def test_a_claim_leases_its_messages_for_twice_the_timeout_and_a_second(local):
    """A deliverer that dies mid-attempt leaves its lease: the message is due again, and frees
    its endpoint's in-flight slot, 2 * WEBHOOK_TIMEOUT_SECONDS + 1 seconds after the claim.
    Time-controlled: the claims are made at chosen instants (`claim(now=...)`)."""
    local.WEBHOOK_TIMEOUT_SECONDS = 10.0
    endpoint("http://127.0.0.1:9/a", max_in_flight=1)
    registration.register_payload(payload=payload(outlets=[asset_outlet(AssetFactory())]))
    registration.register_payload(payload=payload(outlets=[asset_outlet(AssetFactory())]))
    first, second = WebhookDelivery.objects.order_by("id")
    claimed_at = max(first.next_attempt_at, second.next_attempt_at) + timedelta(seconds=1)

    assert [d.id for d in webhook_delivery.claim(now=claimed_at)] == [first.id]
    first.refresh_from_db()
    assert first.claimed_until == claimed_at + timedelta(seconds=21)
    # Its deliverer died: nothing more is sent to the endpoint until the lease ends ...
    assert webhook_delivery.claim(now=claimed_at + timedelta(seconds=20)) == []
    # ... and then the same message is due again (the oldest first), holding the one slot.
    again = webhook_delivery.claim(now=claimed_at + timedelta(seconds=22))
    assert [d.id for d in again] == [first.id]


def test_a_message_too_old_fails_and_replay_sends_it_again_with_its_id(local):
    local.WEBHOOK_MAX_AGE_SECONDS = 0.0
    with Receiver(plan=always(503)) as receiver:
        endpoint(receiver.url)
        registration.register_payload(payload=payload(outlets=[asset_outlet(AssetFactory())]))
        webhook_delivery.deliver(time_budget=2, stop_when_idle=True)
        delivery = WebhookDelivery.objects.get()
        assert (delivery.state, delivery.attempts) == (DeliveryState.FAILED, 1)
        receiver.plan = always(200)
        assert (
            webhook_delivery.replay_range(
                endpoint_id=None,
                since=delivery.created_at - timedelta(seconds=1),
                until=timezone.now(),
            )
            == 1
        )
        webhook_delivery.deliver(time_budget=2, stop_when_idle=True)
        assert WebhookDelivery.objects.get().state == DeliveryState.DELIVERED
        assert {r.message_id for r in receiver.received} == {delivery.message_id}


def test_registration_never_waits_for_a_claim_in_progress(local):
    """While a deliverer holds an endpoint's lock (its claim transaction), a registration that
    writes messages to that endpoint commits at once (FOR KEY SHARE vs FOR NO KEY UPDATE)."""
    from assets_app.sql import locks

    saved = endpoint("http://127.0.0.1:9/a")
    with transaction.atomic():
        assert locks.claim_webhook_endpoints([saved.endpoint.pk]) == [saved.endpoint.pk]
        registration.register_payload(payload=payload(outlets=[asset_outlet(AssetFactory())]))
    assert WebhookDelivery.objects.count() == 1


# --- public API --------------------------------------------------------------------------------


def test_public_api_creates_lists_rotates_and_pauses(local):
    user = get_user_model().objects.create_superuser("hooks", password="pw-hooks-1")
    _, key = public_auth.create_api_token(username=user.username, name="hooks")
    client = Client()
    auth = {"Authorization": f"Bearer {key}"}
    body = {
        "url": "http://127.0.0.1:9/hook",
        "subscriptions": [{"event_type": "asset.late", "pattern": "orders*"}],
    }
    created = client.post(
        "/api/v2/webhooks/endpoints", body, content_type="application/json", headers=auth
    )
    assert created.status_code == 201, created.content
    answer = created.json()
    assert answer["secret"].startswith("whsec_")
    listed = client.get("/api/v2/webhooks/endpoints", headers=auth).json()
    assert listed["total_entries"] == 1 and listed["endpoints"][0]["secret"] is None
    rotated = client.post(
        f"/api/v2/webhooks/endpoints/{answer['id']}/rotateSecret", headers=auth
    ).json()
    assert rotated["secret"] != answer["secret"] and rotated["rotation_overlap_until"]
    paused = client.patch(
        f"/api/v2/webhooks/endpoints/{answer['id']}",
        {"state": "paused"},
        content_type="application/json",
        headers=auth,
    )
    assert paused.json()["state"] == "paused"
    local.WEBHOOK_ALLOWED_HOSTS = []
    refused = client.post(
        "/api/v2/webhooks/endpoints", body, content_type="application/json", headers=auth
    )
    assert refused.status_code == 422
    assert refused.json()["detail"][0]["type"] == "webhook_url_refused"
    unknown = client.post(
        "/api/v2/webhooks/endpoints",
        {**body, "url": "http://93.184.215.14/", "subscriptions": [{"event_type": "nope"}]},
        content_type="application/json",
        headers=auth,
    )
    assert unknown.status_code == 422


# --- audit -------------------------------------------------------------------------------------


def test_every_endpoint_and_replay_write_is_audited_with_its_actor_and_no_secret(local):
    """Issue 29 beside issue 26's rule (every write through every door is audited): create,
    change, pause, resume, rotate, replay and delete, through the public API, name the token's
    user; the trail keeps the endpoint's host, never its path, query or secret."""
    user = get_user_model().objects.create_superuser("hooks", password="pw-hooks-1")
    _, key = public_auth.create_api_token(username=user.username, name="hooks")
    client = Client(headers={"Authorization": f"Bearer {key}"})
    url = "http://127.0.0.1:9/hook/T0KEN-IN-PATH?sig=s3cr3t"
    body = {"url": url, "subscriptions": [{"event_type": ASSET_EVENT}]}
    created = client.post("/api/v2/webhooks/endpoints", body, content_type="application/json")
    endpoint_id, secret = created.json()["id"], created.json()["secret"]
    path = f"/api/v2/webhooks/endpoints/{endpoint_id}"
    client.patch(path, {"description": "orders"}, content_type="application/json")
    client.patch(path, {"state": "paused"}, content_type="application/json")
    client.patch(path, {"state": "paused"}, content_type="application/json")  # no change
    rotated = client.post(f"{path}/rotateSecret").json()["secret"]
    webhook_delivery.resume(endpoint_ids=[endpoint_id])  # code without an actor: "system"
    registration.register_payload(payload=payload(outlets=[asset_outlet(AssetFactory())]))
    assert webhook_delivery.replay(delivery_ids=[WebhookDelivery.objects.get().pk]) == 1
    assert client.delete(path).status_code == 204
    entries = list(
        AuditEntry.objects.exclude(action="api_token.create")
        .order_by("id")
        .values_list("action", "actor_name")
    )
    assert entries == [
        ("webhook_endpoint.create", "hooks"),
        ("webhook_endpoint.change", "hooks"),  # the description; a state-only PATCH: none
        ("webhook_endpoint.paused", "hooks"),  # once: the second pause changed nothing
        ("webhook_endpoint.rotate_secret", "hooks"),
        ("webhook_endpoint.active", "system"),
        ("webhook.replay", "system"),
        ("webhook_endpoint.delete", "hooks"),
    ]
    trail = json.dumps(
        list(AuditEntry.objects.values("summary", "detail")), default=str
    ) + json.dumps(list(AuditTarget.objects.values("object_id")), default=str)
    assert "127.0.0.1" in trail
    for leaked in ("T0KEN-IN-PATH", "s3cr3t", secret, rotated):
        assert leaked not in trail


def test_the_410_disable_is_audited_as_the_system(local):
    with Receiver(plan=always(410)) as receiver:
        saved = endpoint(receiver.url)
        registration.register_payload(payload=payload(outlets=[asset_outlet(AssetFactory())]))
        webhook_delivery.deliver(time_budget=2, stop_when_idle=True)
    entry = AuditEntry.objects.get(action="webhook_endpoint.disabled")
    assert entry.actor_name == "system" and "410" in entry.summary
    assert list(entry.targets.values_list("object_id", flat=True)) == [str(saved.endpoint.pk)]
