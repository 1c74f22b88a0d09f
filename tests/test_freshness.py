"""Freshness policies (issue 29): late and fresh again, stored and reported once per
transition, evaluated in batches with a constant number of statements."""

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from assets_app.events_out import delivery as webhook_delivery
from assets_app.events_out import freshness, webhooks
from assets_app.models import FreshnessPolicy, FreshnessState, WebhookDelivery
from assets_app.registration import outlets as registration
from tests.asset_flow import asset_outlet, payload
from tests.factories import AssetFactory
from tests.webhook_receiver import Receiver

pytestmark = pytest.mark.django_db


def policy_aged(asset, seconds_ago: float, **fields) -> FreshnessPolicy:
    policy = freshness.set_policy(asset=asset, **fields)
    FreshnessPolicy.objects.filter(id=policy.id).update(
        created_at=timezone.now() - timedelta(seconds=seconds_ago)
    )
    return FreshnessPolicy.objects.get(id=policy.id)


def test_a_one_minute_window_without_events_is_late_within_60_s_and_sends_one_webhook(settings):
    """The asset's window ends 60 s after the policy starts; the cluster's sweep evaluates at
    least every PASS_INTERVAL_SECONDS within each run, so a pass comes less than 60 s after the
    window's end. Here: evaluated right before (fresh), right after (late, within 60 s), and
    again and again (still late, no second message); then an event makes it fresh (one
    `asset.fresh` message). The late message reaches a receiver, verified by the reference
    verifier."""
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    asset = AssetFactory(name="orders")
    with Receiver() as receiver:
        saved = webhooks.create_endpoint(
            url=receiver.url,
            subscriptions=[
                webhooks.SubscriptionSpec("asset.late", "orders"),
                webhooks.SubscriptionSpec("asset.fresh", "*"),
            ],
        )
        policy = policy_aged(asset, 59.5, kind="max_interval", interval_seconds=60)
        window_end = policy.created_at + timedelta(seconds=60)
        freshness.evaluate_pass()
        policy.refresh_from_db()
        assert policy.state == FreshnessState.FRESH and policy.due_at == window_end
        deadline = timezone.now() + timedelta(seconds=5)
        while FreshnessPolicy.objects.get().state != FreshnessState.LATE:
            assert timezone.now() < deadline
            freshness.evaluate_pass()
        policy.refresh_from_db()
        assert timedelta(0) <= policy.state_since - window_end < timedelta(seconds=60)
        for _ in range(3):
            freshness.evaluate_pass()
        assert list(WebhookDelivery.objects.values_list("event_type", flat=True)) == ["asset.late"]
        webhook_delivery.deliver(time_budget=3, stop_when_idle=True)
        (request,) = receiver.received
        body = Webhook(saved.secret).verify(request.body, request.headers)
        assert body["type"] == "asset.late"
        assert body["data"]["asset"]["name"] == "orders"
        assert body["data"]["due_at"] == window_end.isoformat()

        registration.register_payload(payload=payload(outlets=[asset_outlet(asset)]))
        freshness.evaluate_pass()
        freshness.evaluate_pass()
        types = list(
            WebhookDelivery.objects.filter(event_type__startswith="asset.f").values_list(
                "event_type", flat=True
            )
        )
        assert types == ["asset.fresh"]
        assert FreshnessPolicy.objects.get().state == FreshnessState.FRESH


def test_a_cron_deadline_in_its_time_zone():
    """Daily at 09:00 Europe/Zurich: late from 09:00 (07:00 UTC in summer) until an event
    newer than the previous 09:00 arrives."""
    asset = AssetFactory()
    policy = freshness.set_policy(
        asset=asset, kind="cron_deadline", cron="0 9 * * *", tz="Europe/Zurich"
    )
    policy.created_at = datetime(2026, 7, 1, 0, 0, tzinfo=UTC)
    before = datetime(2026, 7, 2, 6, 59, tzinfo=UTC)
    after = datetime(2026, 7, 2, 7, 1, tzinfo=UTC)
    assert freshness.verdict(
        policy, latest=None, now=datetime(2026, 7, 1, 6, 0, tzinfo=UTC)
    ).state == (FreshnessState.FRESH)  # no deadline since the policy exists
    on_time = datetime(
        2026, 7, 1, 12, 0, tzinfo=UTC
    )  # after the 1st's deadline: counts for the 2nd
    assert freshness.verdict(policy, latest=on_time, now=before).state == FreshnessState.FRESH
    assert freshness.verdict(policy, latest=on_time, now=after).state == FreshnessState.FRESH
    stale = datetime(2026, 7, 1, 6, 0, tzinfo=UTC)  # before the 1st's deadline
    late = freshness.verdict(policy, latest=stale, now=after)
    assert late.state == FreshnessState.LATE
    assert late.due_at == datetime(2026, 7, 2, 7, 0, tzinfo=UTC)
    assert freshness.verdict(policy, latest=after, now=after + timedelta(minutes=1)).state == (
        FreshnessState.FRESH
    )


def count_pass_statements(n: int) -> int:
    assets = [AssetFactory(name=f"fr-{n}-{i}") for i in range(n)]
    FreshnessPolicy.objects.bulk_create(
        [
            FreshnessPolicy(
                asset=a,
                kind="max_interval",
                interval_seconds=60,
                created_at=timezone.now() - timedelta(seconds=120 if i % 2 else 0),
            )
            for i, a in enumerate(assets)
        ]
    )
    with CaptureQueriesContext(connection) as ctx:
        result = freshness.evaluate_batch(after_id=0, limit=10_000)
    FreshnessPolicy.objects.all().delete()
    assert result[0] == n
    return len(ctx.captured_queries)


def test_a_batch_costs_the_same_statements_for_2_and_400_policies():
    """Claim, newest events, the states stored, the late messages: the same four statements
    (and the test's savepoint pair) for 2 and for 400 policies, half of them late."""
    webhooks.create_endpoint(
        url="https://93.184.215.14/hook",
        subscriptions=[webhooks.SubscriptionSpec("asset.late", "*")],
    )
    assert count_pass_statements(2) == count_pass_statements(400) == 6
    assert WebhookDelivery.objects.count() == 1 + 200


def test_public_api_puts_and_reads_a_policy(admin_user):
    client = Client()
    client.force_login(admin_user)
    asset = AssetFactory()
    put = client.put(
        f"/api/v2/assets/{asset.pk}/freshness",
        {"kind": "cron_deadline", "cron": "0 9 * * 1-5", "timezone": "Europe/Zurich"},
        content_type="application/json",
    )
    assert put.status_code == 200, put.content
    got = client.get(f"/api/v2/assets/{asset.pk}/freshness").json()
    assert (got["kind"], got["state"]) == ("cron_deadline", "unknown")
    bad = client.put(
        f"/api/v2/assets/{asset.pk}/freshness",
        {"kind": "cron_deadline", "cron": "nope"},
        content_type="application/json",
    )
    assert bad.status_code == 422
    assert json.loads(bad.content)["detail"]


def test_metrics_and_dashboard_show_late_assets(admin_user):
    asset = AssetFactory(name="late-one")
    policy_aged(asset, 120, kind="max_interval", interval_seconds=60)
    freshness.evaluate_pass()
    text = Client().get("/metrics").content.decode()
    assert "asset_service_assets_late 1.0" in text
    client = Client()
    client.force_login(admin_user)
    page = client.get("/admin/dashboard/").content.decode()
    assert "1 asset late" in page
    asset_page = client.get(f"/admin/assets_app/asset/{asset.pk}/change/").content.decode()
    assert "LATE" in asset_page
