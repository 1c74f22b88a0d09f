"""Counters shared by every process, and the heartbeats of background components."""

from django.db import models


class MetricCounter(models.Model):
    """A monotonically increasing counter, sharded so concurrent processes do not contend on one
    row. The value of a counter is the sum over its shards. Incremented after commit only."""

    name = models.CharField(max_length=100)
    shard = models.PositiveSmallIntegerField(default=0)
    value = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["name", "shard"], name="metric_counter_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.name}[{self.shard}] = {self.value}"


class ComponentHeartbeat(models.Model):
    """Last run of a background component ("drain", "scheduler"), for /healthz and the dashboard."""

    component = models.CharField(max_length=50, primary_key=True)
    last_run_at = models.DateTimeField()
    last_ok_at = models.DateTimeField(null=True, blank=True)
    detail = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return f"{self.component} @ {self.last_run_at:%Y-%m-%d %H:%M:%S}"
