"""Events out (issue 29): a freshness pass over 10,000 policies, and webhook deliveries per second
to a local receiver.

Freshness: 10,000 assets with a `max_interval` policy each (half of them late, half with a
recent event), evaluated by `freshness.evaluate_pass` with FRESHNESS_BATCH_SIZE 1,000: the
statements per batch (constant) and the pass's wall time, first pass (every late asset a
transition, its message written) and a second (nothing changes). Target: under 5 s.

Deliveries: --messages (2,000) asset-event messages to one endpoint on a local receiver
(ThreadingHTTPServer answering 200 at once), sent by `webhook_delivery.deliver` in this process
with max_in_flight 8: messages per second.
"""

from __future__ import annotations

import time
from datetime import timedelta

import _harness as h

NAME = "events_out"
POLICIES = 10_000
TARGET_PASS_SECONDS = 5.0


def main() -> None:
    args = h.parse_args(__doc__, lambda p: p.add_argument("--messages", type=int, default=2_000))
    url = h.fresh_database(NAME)
    h.setup_django(url, WEBHOOK_ALLOWED_HOSTS="127.0.0.1", WEBHOOK_MAX_IN_FLIGHT="8")
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from assets_app.events_out import delivery as webhook_delivery
    from assets_app.events_out import freshness, webhooks
    from assets_app.models import Asset, AssetEvent, FreshnessPolicy, WebhookDelivery
    from tests.webhook_receiver import Receiver

    now = timezone.now()
    assets = Asset.objects.bulk_create(
        [Asset(name=f"fresh-{i}", uri=f"s3://fresh/{i}") for i in range(POLICIES)],
        batch_size=2000,
    )
    AssetEvent.objects.bulk_create(
        [AssetEvent(asset=a, timestamp=now) for a in assets[::2]], batch_size=2000
    )
    FreshnessPolicy.objects.bulk_create(
        [
            FreshnessPolicy(
                asset=a,
                kind="max_interval",
                interval_seconds=3600,
                created_at=now - timedelta(hours=2),
            )
            for a in assets
        ],
        batch_size=2000,
    )
    with connection.cursor() as cursor:  # as autovacuum would have, after the bulk seed
        cursor.execute("ANALYZE")
    webhooks.create_endpoint(
        url="https://93.184.215.14/late",
        subscriptions=[webhooks.SubscriptionSpec("asset.late", "*")],
    )
    rows = []
    for label in ("first pass (5,000 transitions)", "second pass (none)"):
        with CaptureQueriesContext(connection) as ctx:
            started = time.perf_counter()
            result = freshness.evaluate_pass(batch_size=1000)
            seconds = time.perf_counter() - started
        per_batch = len(ctx.captured_queries) / max(result.batches, 1)
        rows.append([label, result.evaluated, result.batches, per_batch, seconds])
    h.print_table(
        "Freshness pass, 10,000 policies",
        ["pass", "policies", "batches", "statements/batch", "seconds"],
        rows,
    )
    late_messages = WebhookDelivery.objects.count()
    WebhookDelivery.objects.all().delete()

    with Receiver() as receiver:
        endpoint = webhooks.create_endpoint(
            url=receiver.url,
            subscriptions=[webhooks.SubscriptionSpec("asset.event.registered")],
            max_in_flight=8,
        ).endpoint
        WebhookDelivery.objects.bulk_create(
            [
                WebhookDelivery(
                    message_id=f"msg_bench_{i}",
                    endpoint=endpoint,
                    event_type="asset.event.registered",
                    body='{"type":"x","data":{}}',
                )
                for i in range(args.messages)
            ],
            batch_size=2000,
        )
        started = time.perf_counter()
        delivered = webhook_delivery.deliver(time_budget=120, stop_when_idle=True)
        seconds = time.perf_counter() - started
    rate = delivered.delivered / seconds
    h.print_table(
        "Webhook deliveries to a local receiver (one process, max_in_flight 8)",
        ["messages", "delivered", "seconds", "per second"],
        [[args.messages, delivered.delivered, seconds, rate]],
    )
    ok = all(r[4] < TARGET_PASS_SECONDS for r in rows)
    verdict = "MET" if ok else "MISSED"
    print(f"target: a pass of 10,000 policies < {TARGET_PASS_SECONDS} s -> {verdict}")
    h.write_results(
        NAME,
        {
            "freshness": [
                {
                    "pass": r[0],
                    "policies": r[1],
                    "batches": r[2],
                    "statements_per_batch": r[3],
                    "seconds": round(r[4], 3),
                }
                for r in rows
            ],
            "late_messages_written": late_messages,
            "deliveries": {
                "messages": args.messages,
                "delivered": delivered.delivered,
                "seconds": round(seconds, 2),
                "per_second": round(rate, 1),
            },
            "target": {"pass_seconds_max": TARGET_PASS_SECONDS, "met": ok},
        },
        args,
    )
    if not args.keep_db:
        h.drop_database(NAME)


if __name__ == "__main__":
    main()
