"""Queue watchers (issue 28): a consumer of one RabbitMQ queue, its routes (a match rule -> one
or more assets) and one row per message it took (the dedup guard, and the parked messages an
operator looks at)."""

from django.db import models
from django.utils import timezone as django_timezone

from .assets import Asset
from .dags import Dag
from .fields import PasswordEncryptedURLField

WATCHER_NAME_MAX_LENGTH = 200
QUEUE_NAME_MAX_LENGTH = 255  # AMQP 0-9-1: a queue name is a short string (255 bytes)
MESSAGE_ID_MAX_LENGTH = 255  # AMQP message-id is a short string too
ROUTING_KEY_MAX_LENGTH = 255
PATTERN_MAX_LENGTH = 255
BODY_FIELD_MAX_LENGTH = 255
BODY_VALUE_MAX_LENGTH = 1000
BROKER_URL_MAX_LENGTH = 1000


class QueueWatcher(models.Model):
    """One queue to consume. `broker_url` empty means `ASSET_WATCHER_BROKER_URL`, read when the
    consumer connects. `queue_depth` / `depth_checked_at` are written by the consumer at each
    periodic check (a passive queue_declare): the lag an operator sees, not configuration."""

    name = models.SlugField(max_length=WATCHER_NAME_MAX_LENGTH, unique=True)
    # Its password is stored encrypted (issue 38), read back clear: `PasswordEncryptedURLField`.
    broker_url = PasswordEncryptedURLField(
        max_length=BROKER_URL_MAX_LENGTH,
        blank=True,
        default="",
        help_text="amqp:// or amqps:// URL; empty: the ASSET_WATCHER_BROKER_URL setting.",
    )
    queue = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH)
    enabled = models.BooleanField(default=True)
    # Made by a Dag definition's `watchers` (an Airflow AssetWatcher on a queue): the sync owns
    # its queue and broker and the routes it declared (WatcherRoute.dag); one made in the
    # admin is the operator's, and no definition may take its name.
    from_definitions = models.BooleanField(default=False, editable=False)
    prefetch = models.PositiveIntegerField(
        default=50, help_text="Unacknowledged messages a consumer holds at most (basic_qos)."
    )
    queue_depth = models.PositiveIntegerField(null=True, blank=True, editable=False)
    depth_checked_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(default=django_timezone.now, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(prefetch__gte=1, prefetch__lte=65535),
                name="queue_watcher_prefetch_range",
            ),
            models.CheckConstraint(
                condition=models.Q(broker_url="")
                | models.Q(broker_url__startswith="amqp://")
                | models.Q(broker_url__startswith="amqps://"),
                name="queue_watcher_broker_url_amqp",
            ),
            models.CheckConstraint(condition=~models.Q(queue=""), name="queue_watcher_has_queue"),
        ]

    def __str__(self) -> str:
        return self.name


class WatcherRoute(models.Model):
    """A match rule and the assets a matching message produces an event of. A message matches
    when its routing key matches `routing_key_pattern` (a glob: `*`, `?`, `[...]`; `*` matches
    any key) and, when `body_field` is set, the JSON body's value at that dotted path equals
    `body_value` (a string compares as it is; a number, boolean or null as its JSON text, e.g.
    `42`, `true`). A message produces one event per asset of the union of its matching routes."""

    watcher = models.ForeignKey(QueueWatcher, on_delete=models.CASCADE, related_name="routes")
    routing_key_pattern = models.CharField(max_length=PATTERN_MAX_LENGTH, default="*")
    body_field = models.CharField(max_length=BODY_FIELD_MAX_LENGTH, blank=True, default="")
    body_value = models.CharField(max_length=BODY_VALUE_MAX_LENGTH, blank=True, default="")
    assets = models.ManyToManyField(Asset, related_name="watcher_routes")
    # The Dag whose definition declared this route (its `watchers`); null: made in the admin.
    # A sync of that Dag makes its routes exactly what the definition says.
    dag = models.ForeignKey(
        Dag,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        editable=False,
        related_name="watcher_routes",
    )

    class Meta:
        ordering = ["watcher", "id"]
        constraints = [
            models.CheckConstraint(
                condition=~models.Q(routing_key_pattern=""), name="watcher_route_has_pattern"
            ),
            models.CheckConstraint(
                condition=~models.Q(body_field="") | models.Q(body_value=""),
                name="watcher_route_value_needs_field",
            ),
        ]

    def __str__(self) -> str:
        rule = self.routing_key_pattern
        if self.body_field:
            rule += f" and {self.body_field} = {self.body_value}"
        return rule


class MessageState(models.TextChoices):
    REGISTERED = "registered"  # its events committed with this row
    PARKED = "parked"  # could not be parsed or routed: kept (body included) for an operator


class ParkReason(models.TextChoices):
    NOT_UTF8 = "not_utf8", "body is not UTF-8"
    NOT_JSON = "not_json", "body is not JSON"
    INVALID_BODY = "invalid_body", "body passes a JSON limit"
    UNROUTABLE = "unroutable", "no route matches"
    # Issue 38: what the database cannot store (a NUL byte in the id or the routing key), and a
    # body over MAX_REQUEST_BODY_BYTES (the HTTP door's bound; its body is not kept). A requeue
    # leaves these parked: the same message cannot become storable.
    UNSTORABLE = "unstorable", "message id or routing key cannot be stored"
    TOO_LARGE = "too_large", "body is larger than MAX_REQUEST_BODY_BYTES"


class WatcherMessage(models.Model):
    """One message a watcher took, keyed (watcher, message_id): the unique constraint is the
    dedup guard (a redelivery inserts nothing, so registers nothing). A registered message
    keeps the ids of its events and no body; a parked one keeps its body, routing key and
    headers so that a requeue can route it again under the rules of then."""

    watcher = models.ForeignKey(QueueWatcher, on_delete=models.CASCADE, related_name="messages")
    message_id = models.CharField(max_length=MESSAGE_ID_MAX_LENGTH)
    # True when the message carried no message_id: sha256 of routing key + body.
    message_id_derived = models.BooleanField(default=False)
    state = models.CharField(max_length=20, choices=MessageState.choices)
    reason = models.CharField(max_length=20, choices=ParkReason.choices, blank=True, default="")
    detail = models.TextField(blank=True, default="")
    routing_key = models.CharField(max_length=ROUTING_KEY_MAX_LENGTH, blank=True, default="")
    headers = models.JSONField(default=dict, blank=True)
    body = models.BinaryField(null=True, blank=True)
    event_ids = models.JSONField(default=list, blank=True)
    received_at = models.DateTimeField(default=django_timezone.now)
    registered_at = models.DateTimeField(null=True, blank=True)
    requeues = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-received_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["watcher", "message_id"], name="watcher_message_once"),
            models.CheckConstraint(
                condition=(
                    models.Q(
                        state=MessageState.REGISTERED,
                        reason="",
                        body__isnull=True,
                        registered_at__isnull=False,
                    )
                    | (
                        models.Q(state=MessageState.PARKED, body__isnull=False)
                        & ~models.Q(reason="")
                    )
                ),
                name="watcher_message_state_fields",
            ),
        ]
        indexes = [
            models.Index(
                fields=["watcher", "received_at"],
                condition=models.Q(state=MessageState.PARKED),
                name="watcher_message_parked",
            ),
            # The dashboard's messages per second (registered over the last minute).
            models.Index(fields=["watcher", "registered_at"], name="watcher_message_registered"),
        ]

    def __str__(self) -> str:
        return f"{self.watcher_id}:{self.message_id}"
