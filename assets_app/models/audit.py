"""The audit trail (DESIGN 2): one entry per operator or API action, with the rows it touched."""

from django.conf import settings
from django.db import models
from django.utils import timezone


class AuditVia(models.TextChoices):
    ADMIN = "admin"
    COMMAND = "command"
    API = "api"
    # A running task through the worker API (its task token): the actor names the TI.
    TASK = "task"
    SYSTEM = "system"


class AuditEntry(models.Model):
    """One operator action: who (`actor_name`, the user when there is one), through which door
    (`via`), what (`action`), on which rows (`targets`), when. Written by `audit.record` in the
    same transaction as the action, so an entry exists exactly when the action committed.
    Append-only."""

    at = models.DateTimeField(default=timezone.now)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The username, or "os:<login>" for a management command; kept when the user is deleted.
    actor_name = models.CharField(max_length=200)
    via = models.CharField(max_length=20, choices=AuditVia.choices)
    action = models.CharField(max_length=100)
    summary = models.TextField()
    dag_id = models.CharField(max_length=250, blank=True, default="")
    row_count = models.PositiveIntegerField(default=0)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit entries"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(via__in=AuditVia.values), name="audit_via_valid"
            ),
        ]
        indexes = [
            models.Index(fields=["at"], name="audit_by_time"),
            models.Index(fields=["action", "at"], name="audit_by_action"),
        ]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_name} {self.action}"


class AuditTarget(models.Model):
    """A row an audited action touched: `kind` ("outbox_row", "task_instance", "dag_run",
    "queued_event", "asset", ...) and its id; `ti_id` when the row belongs to a task instance,
    so a run page can say "its outbox row was deleted by X"."""

    entry = models.ForeignKey(AuditEntry, on_delete=models.CASCADE, related_name="targets")
    kind = models.CharField(max_length=50)
    object_id = models.CharField(max_length=300)
    ti_id = models.UUIDField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["kind", "object_id"], name="audit_target_by_object"),
            models.Index(
                fields=["ti_id"], name="audit_target_by_ti", condition=models.Q(ti_id__isnull=False)
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.object_id}"
