"""Backfills (issue 24): Airflow's `Backfill` and `BackfillDagRun`.

A backfill plans its runs when it is created: one `BackfillDagRun` per logical date of the
Dag's timetable between `from_date` and `to_date`, in the order they run (`sort_ordinal`).
Unlike Airflow, whose queued runs wait for its scheduler to start them, a run here is claimable
by workers as soon as it exists, so the runs themselves are created by the backfill pass
(`backfills.start_runs`) as earlier ones finish, at most `max_active_runs` at a time: the plan
rows are the state a crash leaves behind and the pass resumes from.
"""

from django.db import models

from ..guards.limits import StoredJsonDecoder
from .dags import Dag
from .runs import DagRun


class ReprocessBehavior(models.TextChoices):
    """What to do with a logical date that already has a finished run (Airflow's names)."""

    FAILED = "failed"
    COMPLETED = "completed"
    NONE = "none"


class BackfillDagRunExceptionReason(models.TextChoices):
    """Why a planned logical date got no run of the backfill (Airflow's values)."""

    IN_FLIGHT = "in flight"
    ALREADY_EXISTS = "already exists"
    UNKNOWN = "unknown"


class Backfill(models.Model):
    dag = models.ForeignKey(Dag, on_delete=models.CASCADE, related_name="backfills")
    from_date = models.DateTimeField()
    to_date = models.DateTimeField()
    # Null when the backfill was created without one, as Airflow stores it (`_create_backfill`
    # passes `dag_run_conf=None` through); its runs then get an empty conf.
    dag_run_conf = models.JSONField(decoder=StoredJsonDecoder, null=True, blank=True)
    # Whether new runs are created (runs already created go on).
    is_paused = models.BooleanField(default=False)
    reprocess_behavior = models.CharField(
        max_length=20, choices=ReprocessBehavior.choices, default=ReprocessBehavior.NONE
    )
    max_active_runs = models.PositiveIntegerField(default=10)
    run_backwards = models.BooleanField(default=False)
    triggering_user_name = models.CharField(max_length=512, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            # Airflow: "There can be only one running backfill per Dag" (its code checks; here
            # the database refuses a second one, whatever the race).
            models.UniqueConstraint(
                fields=["dag"],
                condition=models.Q(completed_at__isnull=True),
                name="backfill_one_active_per_dag",
            ),
            models.CheckConstraint(
                condition=models.Q(max_active_runs__gte=1), name="backfill_max_active_runs_positive"
            ),
            models.CheckConstraint(
                condition=models.Q(reprocess_behavior__in=ReprocessBehavior.values),
                name="backfill_reprocess_behavior_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"backfill {self.pk} of {self.dag_id}"


class BackfillDagRun(models.Model):
    """One planned logical date of a backfill. Pending while `started_at` and
    `exception_reason` are null; `dag_run` is the run it created (or, to reprocess, the existing
    run it clears when its turn comes)."""

    backfill = models.ForeignKey(Backfill, on_delete=models.CASCADE, related_name="planned_runs")
    dag_run = models.ForeignKey(
        DagRun, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    exception_reason = models.CharField(
        max_length=20, choices=BackfillDagRunExceptionReason.choices, null=True, blank=True
    )
    logical_date = models.DateTimeField()
    data_interval_start = models.DateTimeField()
    data_interval_end = models.DateTimeField()
    run_after = models.DateTimeField()
    sort_ordinal = models.PositiveIntegerField()
    started_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["backfill", "sort_ordinal"]
        constraints = [
            models.UniqueConstraint(
                fields=["backfill", "sort_ordinal"], name="bdr_backfill_sort_ordinal_unique"
            ),
            models.UniqueConstraint(
                fields=["backfill", "dag_run"],
                condition=models.Q(dag_run__isnull=False),
                name="ix_bdr_backfill_id_dag_run_id",
            ),
            models.CheckConstraint(
                condition=models.Q(sort_ordinal__gte=1), name="bdr_sort_ordinal_positive"
            ),
        ]
        indexes = [
            # The pass's read: a backfill's next pending dates in order.
            models.Index(
                fields=["backfill", "sort_ordinal"],
                name="bdr_pending",
                condition=models.Q(started_at__isnull=True, exception_reason__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"backfill {self.backfill_id} #{self.sort_ordinal} {self.logical_date.isoformat()}"
