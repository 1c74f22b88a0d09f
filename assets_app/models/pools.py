"""Pools (Airflow's `slot_pool`, `airflow/models/pool.py`): a named number of slots that caps
how many slots the claimed and running TIs of its tasks hold together."""

from django.db import models

# Airflow's `Pool.DEFAULT_POOL_NAME`: the pool of a task that names none; it cannot be deleted.
DEFAULT_POOL_NAME = "default_pool"
# Airflow's `[core] default_pool_task_slot_count` default: the slots `default_pool` is created
# with (the migration that adds pools creates it).
DEFAULT_POOL_SLOTS = 128
# Airflow's `PoolBody.pool` max_length.
POOL_NAME_MAX_LENGTH = 256


class Pool(models.Model):
    """A pool: `slots` (-1: unlimited, as Airflow's), `description`, `include_deferred`
    (Airflow's: deferred TIs count as occupying the pool's slots, issue 42).

    Occupied, as Airflow's `Pool.slots_stats` counts it: the `pool_slots` of the TIs of the
    pool's tasks that are running, or queued and claimed by a worker whose claim has not
    expired (Airflow's `queued`: handed to an executor). A claim never hands out more slots
    than are open (`sql/claims.py`)."""

    MAX_SLOTS = 2**31 - 1  # the column is a 32-bit integer

    name = models.CharField(max_length=POOL_NAME_MAX_LENGTH, unique=True)
    slots = models.IntegerField(default=0)
    description = models.TextField(null=True, blank=True)
    include_deferred = models.BooleanField(default=False)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(condition=models.Q(slots__gte=-1), name="pool_slots_valid"),
            models.CheckConstraint(condition=~models.Q(name=""), name="pool_name_not_empty"),
        ]

    def __str__(self) -> str:
        return self.name
