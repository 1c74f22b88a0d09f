"""Asset events (append-only, DESIGN 2) and the alias each one was emitted through."""

from django.db import models
from django.utils import timezone

from ..guards.limits import StoredJsonDecoder
from .assets import Asset, AssetAlias
from .dags import DAG_ID_MAX_LENGTH


class AssetEvent(models.Model):
    """One production of an asset. Written only by `registration`; append-only.

    The idempotency key of an event from a task is (source TI, try, asset, ordinal) under a unique
    constraint; an event posted to the public API may carry `external_key` (Idempotency-Key),
    unique per caller (`external_key_scope`: `token:<id>` or `user:<id>`) and bound to the
    sha256 of the request body that created it (`request_hash`), so the same key with another body
    is refused instead of answered with this event.
    """

    asset = models.ForeignKey(Asset, on_delete=models.CASCADE, related_name="events")
    extra = models.JSONField(decoder=StoredJsonDecoder, default=dict, blank=True)
    timestamp = models.DateTimeField(default=timezone.now)
    source_dag_id = models.CharField(max_length=DAG_ID_MAX_LENGTH, null=True, blank=True)
    source_run_id = models.CharField(max_length=DAG_ID_MAX_LENGTH, null=True, blank=True)
    source_task_id = models.CharField(max_length=DAG_ID_MAX_LENGTH, null=True, blank=True)
    source_map_index = models.IntegerField(default=-1)
    # No foreign key: the TI may be deleted while its events live on.
    source_ti_id = models.UUIDField(null=True, blank=True)
    source_try_number = models.PositiveIntegerField(null=True, blank=True)
    source_ordinal = models.PositiveIntegerField(default=0)
    external_key = models.CharField(max_length=300, null=True, blank=True)
    # Database defaults: the drain inserts events in plain SQL without naming these columns.
    external_key_scope = models.CharField(max_length=80, blank=True, db_default="")
    request_hash = models.CharField(max_length=64, blank=True, db_default="")
    source_aliases = models.ManyToManyField(
        AssetAlias, through="AssetAliasEvent", related_name="events", blank=True
    )

    class Meta:
        ordering = ["-timestamp", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["source_ti_id", "source_try_number", "asset", "source_ordinal"],
                condition=models.Q(source_ti_id__isnull=False),
                name="asset_event_idempotency_key",
            ),
            models.UniqueConstraint(
                fields=["external_key_scope", "external_key"],
                condition=models.Q(external_key__isnull=False),
                name="asset_event_external_key_per_caller",
            ),
            models.CheckConstraint(
                condition=models.Q(source_ti_id__isnull=True)
                | models.Q(source_try_number__isnull=False),
                name="asset_event_ti_has_try",
            ),
        ]
        indexes = [
            models.Index(fields=["asset", "timestamp"], name="asset_event_by_asset_time"),
            # The console's and the API's default orders (-timestamp, -id / timestamp, id), and
            # retention's old events (issue 48: one index for both, the tie broken inside it).
            models.Index(fields=["timestamp", "id"], name="asset_event_by_time_id"),
            # The console's source-Dag filter.
            models.Index(fields=["source_dag_id"], name="asset_event_by_source_dag"),
        ]

    def __str__(self) -> str:
        return f"event {self.pk} of asset {self.asset_id}"


class AssetAliasEvent(models.Model):
    """alias -> event link: the event was emitted through this alias. Append-only."""

    alias = models.ForeignKey(AssetAlias, on_delete=models.CASCADE, related_name="event_links")
    asset_event = models.ForeignKey(
        AssetEvent, on_delete=models.CASCADE, related_name="alias_links"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["alias", "asset_event"], name="alias_event_unique"),
        ]
        indexes = [models.Index(fields=["asset_event", "alias"], name="alias_event_by_event")]

    def __str__(self) -> str:
        return f"event {self.asset_event_id} via alias {self.alias_id}"
