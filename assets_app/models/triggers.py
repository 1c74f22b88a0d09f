"""Triggers of deferred TIs (issue 42): Airflow's `trigger` table (`airflow/models/trigger.py`,
3.3.2) and what a triggerer's lease on one is.

A TI that defers (`PATCH .../state` with Airflow's `TIDeferredStatePayload`) gets one Trigger
row, pointed at by `TaskInstance.trigger` as Airflow's `task_instance.trigger_id` is. A trigger
is live while a TI in `deferred` points at it; once its event, failure or timeout resumed the
TI (which clears the pointer), the row is unused and the next timeout pass deletes it, as
Airflow's `Trigger.clean_unused` does.
"""

from django.db import models
from django.utils import timezone

# Airflow's `Trigger.classpath` is a String(1000); `queue` a String(256).
TRIGGER_CLASSPATH_MAX_LENGTH = 1000
TRIGGER_QUEUE_MAX_LENGTH = 256


class Trigger(models.Model):
    """A trigger: its class path and kwargs as the worker sent them (`kwargs`: the JSON text
    of the dict, or the client's encrypted string, Airflow's `encrypted_kwargs`: the server
    handles neither), the triggerer queue it asked for, and which triggerer holds it until
    when (`claimed_by`, `lease_until`: another triggerer claims it once the lease has ended)."""

    id = models.BigAutoField(primary_key=True)
    classpath = models.CharField(max_length=TRIGGER_CLASSPATH_MAX_LENGTH)
    kwargs = models.TextField()
    queue = models.CharField(max_length=TRIGGER_QUEUE_MAX_LENGTH, null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    claimed_by = models.CharField(max_length=1000, blank=True, default="")
    lease_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"trigger {self.id} ({self.classpath})"
