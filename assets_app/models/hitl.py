"""Human-in-the-loop details (issue 42): Airflow 3.3.2's `hitl_detail` table
(`airflow/models/hitl.py`), one row per TI: the request a `HITLOperator` wrote (`POST
/execution/hitlDetails/{ti_id}`) and the one response a person gave to it (`PATCH
/api/v2/.../hitlDetails`) or the timeout sweep applied (the defaults).

A cleared or retried TI keeps its row; its next try's request clears the response part, as
Airflow's upsert does, so a TI has at most one request and one response at a time.
"""

from typing import Any

from django.db import models
from django.utils import timezone


class HITLDetail(models.Model):
    """A TI's Human-in-the-loop request (`options`, `subject`, `body`, `defaults`,
    `multiple`, `params`, `assignees` as `[{"id", "name"}]`) and its response
    (`responded_at`, `responded_by` `{"id", "name"}` or null for the timeout's defaults,
    `chosen_options`, `params_input`). A response was received when `responded_at` is set."""

    ti = models.OneToOneField(
        "assets_app.TaskInstance",
        primary_key=True,
        on_delete=models.CASCADE,
        related_name="hitl_detail",
    )
    options = models.JSONField()
    subject = models.TextField()
    body = models.TextField(null=True, blank=True)
    defaults = models.JSONField(null=True, blank=True)
    multiple = models.BooleanField(null=True, default=False)
    params = models.JSONField(default=dict)
    assignees = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    responded_at = models.DateTimeField(null=True, blank=True)
    responded_by = models.JSONField(null=True, blank=True)
    chosen_options = models.JSONField(null=True, blank=True)
    params_input = models.JSONField(default=dict)

    class Meta:
        indexes = [
            # The public list's default order and its `response_received` filter.
            models.Index(fields=["created_at"], name="hitl_created_at"),
        ]

    def __str__(self) -> str:
        return f"{self.subject} ({'answered' if self.response_received else 'waiting'})"

    @property
    def response_received(self) -> bool:
        return self.responded_at is not None

    @property
    def assigned_users(self) -> list[dict[str, Any]]:
        return [{"id": u["id"], "name": u["name"]} for u in self.assignees or []]
