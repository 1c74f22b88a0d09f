"""The two queues (DESIGN 2): queued events per Dag (ADRQ) and the asset event outbox."""

from django.db import models
from django.utils import timezone

from .assets import Asset
from .dags import DAG_ID_MAX_LENGTH, Dag
from .events import AssetEvent


class AssetDagRunQueue(models.Model):
    """ADRQ: "target Dag owes a look at this event". Written by `registration`, consumed (deleted)
    by `scheduling`. Rows are always inserted sorted by (target_dag_id, asset_event_id)."""

    target_dag = models.ForeignKey(Dag, on_delete=models.CASCADE, related_name="queued_events")
    asset_event = models.ForeignKey(AssetEvent, on_delete=models.CASCADE, related_name="queued_for")
    # Copied from the event so the scheduler evaluates conditions without joining events. No
    # database constraint: the event's own foreign key already guarantees the asset, and the
    # drain inserts four or more ADRQ rows per event, each checked per foreign key (dropping
    # this one cut the ADRQ insert by about a third); the ORM still cascades on delete.
    asset = models.ForeignKey(
        Asset, on_delete=models.CASCADE, related_name="queued_for", db_constraint=False
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "queued asset event"
        constraints = [
            models.UniqueConstraint(
                fields=["target_dag", "asset_event"], name="adrq_unique_dag_event"
            ),
        ]
        indexes = [models.Index(fields=["asset", "target_dag"], name="adrq_by_asset")]

    def __str__(self) -> str:
        return f"{self.target_dag_id} <- event {self.asset_event_id}"


class FailureKind(models.TextChoices):
    """How the drain treats a failed row: a transient error backs off and retries, a permanent
    one (the payload itself cannot be registered) parks at once."""

    TRANSIENT = "transient"
    PERMANENT = "permanent"


class AssetEventQueue(models.Model):
    """The outbox: one row per successful TI try whose outlets are not registered yet.

    `payload` holds everything registration needs, so a row outlives its TI:
    {"outlets": [{"name", "uri", "type"}], "outlet_events": [...], "source": {...}}.
    """

    ti_id = models.UUIDField()
    try_number = models.PositiveIntegerField()
    source_dag_id = models.CharField(max_length=DAG_ID_MAX_LENGTH)
    source_run_id = models.CharField(max_length=DAG_ID_MAX_LENGTH)
    source_task_id = models.CharField(max_length=DAG_ID_MAX_LENGTH)
    source_map_index = models.IntegerField(default=-1)
    payload = models.JSONField()
    # Outlets + outlet events in the payload: the drain's measure of a row's work. Batches are
    # sized by it (ASSET_QUEUE_BATCH_OUTLETS), and a row above that is registered in chunks.
    outlet_count = models.PositiveIntegerField(default=0)
    # How many of the payload's events (in registration order) are registered: a row
    # registered in chunks keeps its place here, committed with each chunk's events.
    registered_count = models.PositiveIntegerField(default=0)
    # Set (and committed) by a drain before it registers the row, cleared when that attempt
    # ends. Found set on a row no drain holds, it says the attempt died with its drain (a
    # timeout, a kill, a lost connection): the drain counts that attempt (`_record_failure`).
    claimed_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    last_error = models.TextField(blank=True, default="")
    last_error_type = models.CharField(max_length=200, blank=True, default="")
    last_error_kind = models.CharField(
        max_length=20, choices=FailureKind.choices, blank=True, default=""
    )
    # What an operator can do about a parked row, and what it refers to ({"asset_ids": [...]}).
    park_reason = models.TextField(blank=True, default="")
    error_detail = models.JSONField(default=dict, blank=True)
    # One entry per failed attempt, newest last: {"at", "kind", "error_type", "error"} (first
    # line only), capped at outbox.ATTEMPT_HISTORY_KEPT entries.
    attempt_history = models.JSONField(default=list, blank=True)
    parked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "asset event outbox row"
        constraints = [
            models.UniqueConstraint(fields=["ti_id", "try_number"], name="outbox_unique_ti_try"),
        ]
        indexes = [
            # The drain claims due, unparked rows oldest first.
            models.Index(
                fields=["next_attempt_at", "id"],
                name="outbox_due",
                condition=models.Q(parked_at__isnull=True),
            ),
            models.Index(
                fields=["parked_at"],
                name="outbox_parked",
                condition=models.Q(parked_at__isnull=False),
            ),
            models.Index(fields=["source_dag_id", "source_task_id"], name="outbox_by_source"),
            # Rows whose drain may have died (see `claimed_at`): few, looked up every batch.
            models.Index(
                fields=["claimed_at"],
                name="outbox_claimed",
                condition=models.Q(claimed_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"outbox {self.pk}: {self.source_dag_id}.{self.source_task_id} try {self.try_number}"
