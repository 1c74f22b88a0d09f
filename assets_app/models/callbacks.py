"""Dag callback requests (issue 39): Airflow 3.3.2's `DagCallbackRequest`
(`airflow/callbacks/callback_requests.py`), which its `DagRun.update_state` and scheduler
produce when a run of a Dag with `on_success_callback` / `on_failure_callback` finishes, kept
as a durable row: written in the transaction that finishes the run (one per finish of a run:
the unique key is the run and its `clear_number`), claimed by `bin/airflow-worker` with a lease
(a worker that dies mid-callback leaves it due again once the lease ends), and ended by the
worker's report. A callback that raised ends its row `failed` with the traceback; the run's
state is never changed by it, as in Airflow.
"""

from django.db import models
from django.utils import timezone


class CallbackState(models.TextChoices):
    PENDING = "pending"  # due when its lease is unset or ended
    SUCCESS = "success"  # every callback ran without raising
    FAILED = "failed"  # a callback raised (or the Dag could not be loaded): last_error says
    PARKED = "parked"  # claimed DAG_CALLBACK_MAX_ATTEMPTS times without a report


class DagCallbackRequest(models.Model):
    """One run's finish for its Dag's callbacks: `is_failure_callback` picks
    `on_failure_callback` or `on_success_callback`, `reason` is Airflow's `msg` (the context's
    `reason`: "success", "task_failure", "timed_out"), `last_ti_id` the TI whose template
    context Airflow builds (None: the minimal context)."""

    dag_run = models.ForeignKey(
        "assets_app.DagRun", on_delete=models.CASCADE, related_name="callback_requests"
    )
    # Copied from the run, for the claim and the admin without a join.
    dag = models.ForeignKey("assets_app.Dag", on_delete=models.CASCADE, related_name="+")
    clear_number = models.PositiveIntegerField()
    is_failure_callback = models.BooleanField()
    reason = models.CharField(max_length=40)
    # Not a foreign key: retention deletes TIs with raw statements; the id is only looked up.
    last_ti_id = models.UUIDField(null=True, blank=True)
    state = models.CharField(
        max_length=10, choices=CallbackState.choices, default=CallbackState.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    claimed_by = models.CharField(max_length=250, blank=True, default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        constraints = [
            # Once per finish: a replayed or racing finish of the same run writes nothing more.
            models.UniqueConstraint(
                fields=["dag_run", "clear_number"], name="dag_callback_once_per_finish"
            ),
            models.CheckConstraint(
                condition=models.Q(state__in=CallbackState.values),
                name="dag_callback_state_valid",
            ),
        ]
        indexes = [
            models.Index(
                fields=["lease_until", "id"],
                name="dag_callback_due",
                condition=models.Q(state="pending"),
            ),
            models.Index(fields=["state", "id"], name="dag_callback_by_state"),
        ]

    def __str__(self) -> str:
        kind = "on_failure_callback" if self.is_failure_callback else "on_success_callback"
        return f"{kind} of run {self.dag_run_id} ({self.reason}, {self.state})"
