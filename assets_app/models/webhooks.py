"""Events out (issue 29): webhook endpoints, what they subscribe to, the messages owed to them
(written in the transaction of what they report) and each delivery attempt; freshness
policies of assets and their late / fresh state."""

from django.db import models
from django.utils import timezone as django_timezone

from ..guards.masking import masked_url
from .assets import Asset

PATTERN_MAX_LENGTH = 1500


class WebhookEventType(models.TextChoices):
    ASSET_EVENT = "asset.event.registered", "asset event registered"
    RUN_SUCCEEDED = "dag_run.succeeded", "run finished (success)"
    RUN_FAILED = "dag_run.failed", "run failed"
    OUTBOX_PARKED = "outbox.parked", "outbox row parked"
    ASSET_LATE = "asset.late", "asset late"
    ASSET_FRESH = "asset.fresh", "asset fresh again"


class EndpointState(models.TextChoices):
    ACTIVE = "active"
    PAUSED = "paused"  # an operator's pause: messages accumulate, nothing is sent
    DISABLED = "disabled"  # the receiver answered 410 Gone: nothing is sent until resumed


class WebhookEndpoint(models.Model):
    """A receiver. `secret` (and `previous_secret` during a rotation) hold Fernet tokens of the
    `whsec_...` signing secrets (`guards/encryption.py`, as Connections' passwords), never clear
    text; while `previous_secret_expires_at` is in the future every message carries two
    signatures."""

    url = models.URLField(max_length=2000)
    description = models.TextField(blank=True, default="")
    state = models.CharField(
        max_length=20, choices=EndpointState.choices, default=EndpointState.ACTIVE
    )
    state_reason = models.TextField(blank=True, default="")
    secret = models.TextField()
    previous_secret = models.TextField(null=True, blank=True)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    max_in_flight = models.PositiveIntegerField(default=4)
    created_at = models.DateTimeField(default=django_timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(max_in_flight__gte=1), name="webhook_in_flight_positive"
            ),
        ]

    def __str__(self) -> str:
        # Shown to every admin reader (titles, select boxes): the URL without its secrets.
        return masked_url(self.url)


class WebhookSubscription(models.Model):
    """One event type an endpoint wants, filtered by `pattern`: a glob (`*`, `?`) over the asset
    name (asset events, late / fresh) or the dag_id (runs, parked outbox rows). `like_pattern`
    is the same pattern as SQL LIKE (set by `webhooks.save_endpoint`), so the statement that
    writes messages matches subscriptions in the database."""

    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.CASCADE, related_name="subscriptions"
    )
    event_type = models.CharField(max_length=40, choices=WebhookEventType.choices)
    pattern = models.CharField(max_length=PATTERN_MAX_LENGTH, default="*")
    like_pattern = models.CharField(max_length=PATTERN_MAX_LENGTH * 2, default="%")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["endpoint", "event_type", "pattern"], name="webhook_subscription_unique"
            ),
        ]
        indexes = [models.Index(fields=["event_type"], name="webhook_subscription_by_type")]

    def __str__(self) -> str:
        return f"{self.event_type} {self.pattern}"


class DeliveryState(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"  # retries exhausted (about three days): kept for a replay


class WebhookDelivery(models.Model):
    """One message owed to one endpoint. `message_id` is the `webhook-id` header, the same on
    every attempt; `body` is the exact JSON text signed and sent. `claimed_until` is the lease
    of the attempt in flight (set when claimed, cleared with its outcome): a lease that expired
    is an attempt that died with its process, and the message is due again."""

    message_id = models.CharField(max_length=64, unique=True)
    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries"
    )
    event_type = models.CharField(max_length=40, choices=WebhookEventType.choices)
    body = models.TextField()
    created_at = models.DateTimeField(default=django_timezone.now)
    state = models.CharField(
        max_length=20, choices=DeliveryState.choices, default=DeliveryState.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=django_timezone.now)
    claimed_until = models.DateTimeField(null=True, blank=True)
    last_status = models.IntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "webhook deliveries"
        ordering = ["-id"]
        indexes = [
            models.Index(
                fields=["endpoint", "next_attempt_at"],
                condition=models.Q(state="pending"),
                name="webhook_delivery_due",
            ),
            models.Index(fields=["created_at"], name="webhook_delivery_by_time"),
            # The delivery timer's next look (`delivery.next_due_at`, issue 41): the first
            # message due that is not in flight, and the first lease to expire.
            models.Index(
                fields=["next_attempt_at"],
                condition=models.Q(state="pending", claimed_until__isnull=True),
                name="webhook_delivery_next",
            ),
            models.Index(
                fields=["claimed_until"],
                condition=models.Q(state="pending", claimed_until__isnull=False),
                name="webhook_delivery_leased",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.message_id} {self.event_type} -> {self.endpoint_id}"


class WebhookAttempt(models.Model):
    """One HTTP attempt of a delivery: what the receiver answered (or the error), how long it
    took, and when the next attempt is due (None: none)."""

    delivery = models.ForeignKey(
        WebhookDelivery, on_delete=models.CASCADE, related_name="attempt_history"
    )
    attempted_at = models.DateTimeField(default=django_timezone.now)
    status_code = models.IntegerField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    duration_ms = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["delivery", "id"]
        indexes = [models.Index(fields=["delivery", "id"], name="webhook_attempt_by_delivery")]

    def __str__(self) -> str:
        return f"attempt of {self.delivery_id}: {self.status_code or self.error[:40]}"


class FreshnessKind(models.TextChoices):
    MAX_INTERVAL = "max_interval", "an event at least every X seconds"
    CRON_DEADLINE = "cron_deadline", "an event by each cron deadline"


class FreshnessState(models.TextChoices):
    UNKNOWN = "unknown"  # not evaluated yet
    FRESH = "fresh"
    LATE = "late"


class FreshnessPolicy(models.Model):
    """An asset's freshness rule and its last evaluated state. `max_interval`: late once
    `interval_seconds` pass without an event (counted from the last event, or from the policy's
    creation). `cron_deadline`: at each tick of `cron` (on `timezone`'s wall clock) there must
    be an event since the tick before; late until one arrives. `state_since` is when the state
    last changed: a transition is reported once (a webhook), an evaluation that finds the same
    state changes nothing."""

    asset = models.OneToOneField(Asset, on_delete=models.CASCADE, related_name="freshness")
    kind = models.CharField(max_length=20, choices=FreshnessKind.choices)
    interval_seconds = models.PositiveIntegerField(null=True, blank=True)
    cron = models.CharField(max_length=200, blank=True, default="")
    timezone = models.CharField(max_length=100, default="UTC")
    state = models.CharField(
        max_length=20, choices=FreshnessState.choices, default=FreshnessState.UNKNOWN
    )
    state_since = models.DateTimeField(null=True, blank=True)
    # The instant the asset became (or would become) late: the window's end.
    due_at = models.DateTimeField(null=True, blank=True)
    last_evaluated_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=django_timezone.now)

    class Meta:
        verbose_name_plural = "freshness policies"
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(
                condition=(
                    models.Q(kind="max_interval", interval_seconds__gte=1)
                    | (models.Q(kind="cron_deadline") & ~models.Q(cron=""))
                ),
                name="freshness_policy_complete",
            ),
        ]
        indexes = [
            # The freshness timer (issue 41): the policies due (`freshness.next_due_at`, the
            # due claim) and the late ones (looked at again when an event of theirs comes).
            models.Index(
                fields=["due_at"], condition=~models.Q(state="late"), name="freshness_policy_due"
            ),
            models.Index(
                fields=["id"], condition=models.Q(state="late"), name="freshness_policy_late"
            ),
        ]

    def __str__(self) -> str:
        return f"freshness of {self.asset_id}: {self.state}"
