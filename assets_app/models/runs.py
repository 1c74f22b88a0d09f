"""Dag runs, their task instances and the asset events each run consumed (DESIGN 2)."""

import uuid
from datetime import datetime
from typing import Any

from django.db import models
from django.utils import timezone

from ..guards.limits import StoredJsonDecoder
from .dags import DAG_ID_MAX_LENGTH, Dag
from .triggers import Trigger


class DagRunType(models.TextChoices):
    MANUAL = "manual"
    # A run of a time schedule, created by `time_scheduling` (issue 24).
    SCHEDULED = "scheduled"
    ASSET_TRIGGERED = "asset_triggered"
    # A run of the Dag producing an asset, asked for by `POST /api/v2/assets/{id}/materialize`.
    ASSET_MATERIALIZATION = "asset_materialization"
    # A run a task asked for (TriggerDagRunOperator, `POST /execution/dag-runs/...`).
    OPERATOR_TRIGGERED = "operator_triggered"
    # A run of a backfill (`backfills`, issue 24), Airflow's `backfill`.
    BACKFILL = "backfill"


class DagRunTriggeredBy(models.TextChoices):
    """Who asked for a run (Airflow's `DagRunTriggeredByType`, the values this service uses)."""

    CLI = "cli"
    REST_API = "rest_api"
    UI = "ui"
    ASSET = "asset"
    OPERATOR = "operator"
    TIMETABLE = "timetable"
    BACKFILL = "backfill"


class DagRunState(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"


class TIState(models.TextChoices):
    # Waiting for its upstream tasks' trigger rule: not claimable (Airflow's "no state" /
    # `scheduled` before the scheduler queues it). `scheduling/dependencies.py` queues it, or marks
    # it upstream_failed / skipped.
    SCHEDULED = "scheduled"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"
    UP_FOR_RETRY = "up_for_retry"
    SKIPPED = "skipped"
    REMOVED = "removed"
    UPSTREAM_FAILED = "upstream_failed"
    # Waiting for its trigger (issue 42): Airflow's `deferred`, resumed (queued again with its
    # `next_method`) by the trigger's event, failure or timeout (`task_state.deferral`).
    DEFERRED = "deferred"
    # Waiting for a person (issue 42, Airflow 3.3's `awaiting_input`): a Human-in-the-loop task
    # parked with its `next_method`, no trigger; a response or its timeout queues it again
    # (`task_state.hitl`).
    AWAITING_INPUT = "awaiting_input"


TI_FINISHED_STATES = frozenset(
    {TIState.SUCCESS, TIState.FAILED, TIState.SKIPPED, TIState.REMOVED, TIState.UPSTREAM_FAILED}
)
# The others, listed (not "not finished") so that a query can use the `ti_unfinished` index.
TI_UNFINISHED_STATES = tuple(sorted(set(TIState.values) - TI_FINISHED_STATES))


def first_try_number(state: str) -> int:
    """The try a new TI starts at in `state`. Airflow 3.3.2 counts a try when its scheduler
    queues a TI (`DagRun.schedule_tis` sets try_number + 1), so 1 for one created queued, else 0
    (waiting for its upstream, or skipped at once: a mapped task over an empty literal); the
    waiting one gets its first try when it is queued (`sql/dependencies`, `mapping.expand`:
    at least 1, so a cleared TI, already at its next try, keeps it)."""
    return 1 if state == TIState.QUEUED else 0


def fresh_try_values(*, queued_at: datetime, retry_at: datetime | None) -> dict[str, Any]:
    """The columns a TI's reset for a fresh try sets (a retry, a reschedule's next poke, a
    clear), written once: queued at `queued_at`, claimable from `retry_at` (None: at once), and
    no claim, host, process, start, end or heartbeat left from the try before. The state and
    the try number are the caller's."""
    return {
        "queued_at": queued_at,
        "retry_at": retry_at,
        "claimed_by": "",
        "claimed_at": None,
        "hostname": "",
        "unixname": "",
        "pid": None,
        "start_date": None,
        "end_date": None,
        "last_heartbeat_at": None,
        # A fresh try starts the task again, not in a deferred task's next_method (Airflow
        # clears them on every state but deferred).
        "next_method": None,
        "next_kwargs": None,
        "trigger_timeout": None,
        "trigger": None,
    }


class DagRun(models.Model):
    """A run of a Dag. Asset-triggered runs consume events through `DagRunAssetEvent`."""

    dag = models.ForeignKey(Dag, on_delete=models.CASCADE, related_name="runs")
    run_id = models.CharField(max_length=DAG_ID_MAX_LENGTH)
    run_type = models.CharField(max_length=30, choices=DagRunType.choices)
    triggered_by = models.CharField(
        max_length=20, choices=DagRunTriggeredBy.choices, null=True, blank=True
    )
    state = models.CharField(max_length=20, choices=DagRunState.choices, default=DagRunState.QUEUED)
    run_after = models.DateTimeField(default=timezone.now)
    logical_date = models.DateTimeField(null=True, blank=True)
    data_interval_start = models.DateTimeField(null=True, blank=True)
    data_interval_end = models.DateTimeField(null=True, blank=True)
    start_date = models.DateTimeField(null=True, blank=True)
    end_date = models.DateTimeField(null=True, blank=True)
    # When a running run times out (issue 39): its start plus its Dag's `dagrun_timeout`, set
    # when it starts running (and again when a sync changes the timeout); the timeout timer
    # reads the earliest through `dag_run_timeout_due`. None: no timeout.
    timeout_at = models.DateTimeField(null=True, blank=True)
    clear_number = models.PositiveIntegerField(default=0)
    # When the run was last queued: its creation, or its last clear (Airflow's `queued_at`).
    queued_at = models.DateTimeField(default=timezone.now)
    conf = models.JSONField(decoder=StoredJsonDecoder, default=dict, blank=True)
    triggering_user_name = models.CharField(max_length=150, null=True, blank=True)
    note = models.TextField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    consumed_events: models.ManyToManyField = models.ManyToManyField(
        "AssetEvent", through="DagRunAssetEvent", related_name="consuming_runs", blank=True
    )

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(fields=["dag", "run_id"], name="dag_run_id_unique"),
            # One run per (Dag, logical date), as Airflow; runs without one (asset-triggered,
            # manual without a date) are not concerned (issue 24: exactly once per tick).
            models.UniqueConstraint(
                fields=["dag", "logical_date"],
                name="dag_run_logical_date_unique",
                condition=models.Q(logical_date__isnull=False),
            ),
            models.CheckConstraint(
                condition=models.Q(run_type__in=DagRunType.values), name="dag_run_type_valid"
            ),
            models.CheckConstraint(
                condition=models.Q(state__in=DagRunState.values), name="dag_run_state_valid"
            ),
        ]
        indexes = [
            # max_active_runs counts a Dag's queued/running runs.
            models.Index(fields=["dag", "state"], name="dag_run_by_dag_state"),
            # A Dag's newest runs (retention keeps the last N: one probe per candidate run).
            models.Index(fields=["dag", "id"], name="dag_run_by_dag_id"),
            # A Dag's last runs by run_after (max_consecutive_failed_dag_runs, issue 39).
            models.Index(fields=["dag", "run_after", "id"], name="dag_run_by_dag_run_after"),
            # All Dags' runs by run_after (the console's run-after column, issue 48).
            models.Index(fields=["run_after", "id"], name="dag_run_by_run_after"),
            # The running runs with a timeout, by when (`scheduling.timeouts`).
            models.Index(
                fields=["timeout_at"],
                name="dag_run_timeout_due",
                condition=models.Q(state="running", timeout_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.dag_id} / {self.run_id}"


class DagRunAssetEvent(models.Model):
    """run -> consumed event. `dag` is copied from the run so the database itself refuses a
    second consumption of one event by one Dag (invariant 8)."""

    dag_run = models.ForeignKey(DagRun, on_delete=models.CASCADE, related_name="consumed_links")
    dag = models.ForeignKey(Dag, on_delete=models.CASCADE, related_name="+")
    asset_event = models.ForeignKey(
        "AssetEvent", on_delete=models.CASCADE, related_name="consumed_links"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["dag", "asset_event"], name="event_consumed_once_per_dag"
            ),
        ]
        indexes = [models.Index(fields=["dag_run", "asset_event"], name="consumed_by_run")]

    def __str__(self) -> str:
        return f"run {self.dag_run_id} consumed event {self.asset_event_id}"


class TaskInstance(models.Model):
    """One task in one run. Its row lock is owned by `task_state` (see sql/locks.py)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    dag_run = models.ForeignKey(DagRun, on_delete=models.CASCADE, related_name="task_instances")
    dag_id = models.CharField(max_length=DAG_ID_MAX_LENGTH)
    run_id = models.CharField(max_length=DAG_ID_MAX_LENGTH)
    task_id = models.CharField(max_length=DAG_ID_MAX_LENGTH)
    map_index = models.IntegerField(default=-1)
    # Airflow's: 0 until the TI is first queued (`first_try_number`), + 1 at each retry and
    # clear. A worker's token is bound to the try it claimed (always 1 or more).
    try_number = models.PositiveIntegerField(default=1)
    max_tries = models.PositiveIntegerField(default=0)
    state = models.CharField(max_length=20, choices=TIState.choices, default=TIState.QUEUED)
    # An operator's note (Airflow's TaskInstanceNote content; `PATCH .../taskInstances/...`).
    note = models.TextField(null=True, blank=True)
    hostname = models.CharField(max_length=1000, blank=True, default="")
    unixname = models.CharField(max_length=1000, blank=True, default="")
    pid = models.IntegerField(null=True, blank=True)
    queued_at = models.DateTimeField(default=timezone.now)
    start_date = models.DateTimeField(null=True, blank=True)
    end_date = models.DateTimeField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    # Work claiming (POST /execution/workloads/claim): who took this queued TI and when.
    claimed_by = models.CharField(max_length=1000, blank=True, default="")
    claimed_at = models.DateTimeField(null=True, blank=True)
    # A retried TI is queued again but may not be claimed before this time.
    retry_at = models.DateTimeField(null=True, blank=True)
    # Deferral (issue 42), Airflow's TI columns: the trigger the TI waits for while deferred,
    # the method (and its kwargs, serialized by the Task SDK's serde) a worker resumes it in,
    # and when its trigger times out.
    trigger = models.ForeignKey(
        Trigger, on_delete=models.SET_NULL, null=True, blank=True, related_name="task_instances"
    )
    next_method = models.CharField(max_length=1000, null=True, blank=True)
    next_kwargs = models.JSONField(null=True, blank=True, decoder=StoredJsonDecoder)
    trigger_timeout = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["dag_run_id", "task_id", "map_index"]
        constraints = [
            models.UniqueConstraint(
                fields=["dag_run", "task_id", "map_index"], name="ti_unique_per_run"
            ),
            models.CheckConstraint(
                condition=models.Q(state__in=TIState.values), name="ti_state_valid"
            ),
            # Airflow 3.3.2 counts a try when its scheduler queues a TI (`DagRun.schedule_tis`:
            # try_number + 1): a TI waiting for its upstream, or skipped / upstream_failed
            # before it was ever queued, is at try 0. Queued, running or retrying it has one.
            models.CheckConstraint(
                condition=models.Q(try_number__gte=1)
                | ~models.Q(state__in=["queued", "running", "up_for_retry"]),
                name="ti_try_counted_once_queued",
            ),
            models.CheckConstraint(
                condition=models.Q(pid__isnull=True) | models.Q(pid__gt=0), name="ti_pid_positive"
            ),
        ]
        indexes = [
            # Claiming queued work in FIFO order.
            models.Index(
                fields=["queued_at"],
                name="ti_queued_claim",
                condition=models.Q(state="queued"),
            ),
            models.Index(fields=["dag_id", "run_id"], name="ti_by_dag_run_ids"),
            # The public API's cross-run TI list in its default order (map_index, id), and the
            # console's TI list by start date (issue 48): without them each page sorts every TI.
            models.Index(fields=["map_index", "id"], name="ti_by_map_index"),
            models.Index(fields=["start_date", "id"], name="ti_by_start_date"),
            # "Is every TI of this run finished?" after each finish, and the sweep's runs with
            # TIs waiting for their upstream: both read only a run's unfinished TIs. The
            # states are spelled out as in TI_UNFINISHED_STATES (a new state belongs here too).
            models.Index(
                fields=["dag_run", "state"],
                name="ti_unfinished",
                condition=models.Q(
                    state__in=[
                        "awaiting_input",
                        "deferred",
                        "queued",
                        "running",
                        "scheduled",
                        "up_for_retry",
                    ]
                ),
            ),
            models.Index(
                fields=["last_heartbeat_at"],
                name="ti_running_heartbeat",
                condition=models.Q(state="running"),
            ),
            # A claim's count of the slots and limits held (`sql/claims.py`): the queued TIs
            # claimed by a claim that has not expired, next to ti_running_heartbeat's running
            # ones, without reading the backlog of queued TIs nobody claimed.
            models.Index(
                fields=["claimed_at"],
                name="ti_queued_claimed",
                condition=models.Q(state="queued", claimed_at__isnull=False),
            ),
            # The trigger timeout timer's next due time and due TIs.
            models.Index(
                fields=["trigger_timeout"],
                name="ti_deferred_timeout",
                condition=models.Q(state="deferred"),
            ),
            # The Human-in-the-loop timeout sweep's due TIs (`task_state.hitl`).
            models.Index(
                fields=["trigger_timeout"],
                name="ti_awaiting_input_timeout",
                condition=models.Q(state="awaiting_input"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.dag_id}.{self.task_id} [{self.run_id}] try {self.try_number}"
