"""Dags and their tasks (DESIGN 2): schedules, trigger rules, outlets, schedule references and
import errors."""

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

from ..guards.limits import StoredJsonDecoder
from .assets import Asset, AssetAlias
from .pools import DEFAULT_POOL_NAME, POOL_NAME_MAX_LENGTH

DAG_ID_MAX_LENGTH = 250
# Airflow's `TAG_MAX_LEN` (a Dag's tag) and the length of its `DagModel.owners`.
TAG_MAX_LENGTH = 100
OWNERS_MAX_LENGTH = 2000
# Airflow's `[operators] default_owner`: a task's owner when the file names none.
DEFAULT_OWNER = "airflow"
# Airflow's default Dag bundle (`[dag_processor] dag_bundle_config_list`: one LocalDagBundle
# named "dags-folder" over `[core] dags_folder`), and the length of its `DagModel.bundle_name`.
DEFAULT_BUNDLE_NAME = "dags-folder"
BUNDLE_NAME_MAX_LENGTH = 250


class ScheduleMode(models.TextChoices):
    """How a Dag with both an asset `schedule` and a `timetable` runs (issue 24).

    `asset_or_time` is Airflow's `AssetOrTimeSchedule`: a scheduled run on each tick and an
    asset-triggered run whenever the condition is met. `asset_and_time` is the service's own
    (an open request in Airflow): a scheduled run on a tick only when the condition has been met
    by the events queued up to that tick, consuming exactly those; a tick without it creates no
    run. A Dag with only one of the two ignores the mode."""

    ASSET_OR_TIME = "asset_or_time"
    ASSET_AND_TIME = "asset_and_time"


class XComReadScope(models.TextChoices):
    RUN = "run", "its own run"
    DAG = "dag", "any run of its Dag"
    ALL = "all", "any Dag's runs"


class Dag(models.Model):
    """A DAG definition loaded by `sync_dags`. `schedule` is the normalized condition, or null."""

    dag_id = models.CharField(max_length=DAG_ID_MAX_LENGTH, primary_key=True)
    description = models.TextField(blank=True, default="")
    is_paused = models.BooleanField(default=False)
    max_active_runs = models.PositiveIntegerField(default=16)
    # Airflow's `max_active_tasks` ([core] max_active_tasks_per_dag, 16): at most this many TIs
    # of one run claimed or running at once (the claim, `sql/claims.py`).
    max_active_tasks = models.PositiveIntegerField(default=16)
    # Normalized condition (see definitions/conditions.py): {"asset": {"name", "uri"}} | {"alias":
    # name} | {"all": [...]} | {"any": [...]}; null means manual runs only.
    schedule = models.JSONField(decoder=StoredJsonDecoder, null=True, blank=True)
    fileloc = models.CharField(max_length=2000, blank=True, default="")
    # The Dag bundle it was synced from (Airflow's `DagModel.bundle_name`): the folder a stock
    # worker serves (`bin/airflow-worker --bundle`), whose workers alone claim its TIs
    # (`sql/claims.py`). Null for a JSON definition (`sync_dags`), which any worker that names
    # no bundle runs (the reference worker).
    bundle_name = models.CharField(max_length=BUNDLE_NAME_MAX_LENGTH, null=True, blank=True)
    # What the Dag says about itself (issue 39), shown as Airflow shows it: its tags (sorted,
    # unique; Airflow's DagTag rows), its owners as Airflow's `DagModel.owners` ("a, b": its
    # tasks' owners, sorted here where Airflow joins a set) and its `doc_md` ("" for none).
    tags = models.JSONField(
        default=list, db_default=models.Value([], models.JSONField()), blank=True
    )
    owners = models.CharField(
        max_length=OWNERS_MAX_LENGTH, default=DEFAULT_OWNER, db_default=DEFAULT_OWNER
    )
    doc_md = models.TextField(blank=True, default="", db_default="")
    # Why the scheduler could not evaluate this Dag on its last try ("" when it could), and
    # since when: it skips the Dag and goes on with the others (invariant 13).
    schedule_error = models.TextField(blank=True, db_default="")
    # Dag params (issue 39, `definitions/params.py`): each Param's default, description and JSON
    # Schema in declared order, as JSON text ("" for none): text, since JSONB would reorder the
    # schema's keys, which Airflow's refusal of a conf prints.
    params = models.TextField(blank=True, db_default="", default="")
    schedule_error_at = models.DateTimeField(null=True, blank=True)
    # A time schedule (issue 24): `timetables.Timetable.spec()` of the definition's timetable
    # (null: none), the Dag's IANA zone, its bounds and catchup (Airflow's names).
    timetable = models.JSONField(decoder=StoredJsonDecoder, null=True, blank=True)
    timezone = models.CharField(max_length=64, db_default="UTC", default="UTC")
    start_date = models.DateTimeField(null=True, blank=True)
    end_date = models.DateTimeField(null=True, blank=True)
    catchup = models.BooleanField(db_default=False, default=False)
    # Airflow's `dagrun_timeout` (issue 39): a running run older than this (from its start) is
    # failed and its unfinished TIs skipped (`scheduling.timeouts`); None: never.
    dagrun_timeout = models.DurationField(null=True, blank=True)
    # Airflow's `max_consecutive_failed_dag_runs` (issue 39): after a run fails, the Dag is
    # paused when its last this many runs (by run_after) all failed
    # (`dependencies.finish_run_if_done`); 0: never.
    max_consecutive_failed_dag_runs = models.PositiveIntegerField(db_default=0, default=0)
    schedule_mode = models.CharField(
        max_length=20,
        choices=ScheduleMode.choices,
        db_default=ScheduleMode.ASSET_OR_TIME,
        default=ScheduleMode.ASSET_OR_TIME,
    )
    # Whose XComs this Dag's task tokens may read (issue 26, `task_scopes`): its own run, any
    # run of this Dag, or any Dag's.
    xcom_read_scope = models.CharField(
        max_length=8,
        choices=XComReadScope.choices,
        db_default=XComReadScope.RUN,
        default=XComReadScope.RUN,
    )
    # How many queued events one asset-triggered run consumes at most (issue 28): null is
    # `batch` (every event queued when the condition is met, Airflow's behaviour), 1 is
    # `per_event` (one run per event, in event order), N is `max_events: N`.
    max_events_per_run = models.PositiveIntegerField(null=True, blank=True)
    # The run types this Dag allows (Airflow's `allowed_run_types`, sorted; null: every one):
    # `runs.check_run_type` refuses the others on every door that makes a run (issue 39).
    allowed_run_types = models.JSONField(null=True, blank=True)
    # Airflow's `fail_fast`: a TI that fails for good stops the rest of its run
    # (`dependencies.stop_remaining`, issue 39).
    fail_fast = models.BooleanField(db_default=False, default=False)
    # Airflow's `DagModel.has_on_success_callback` / `has_on_failure_callback` (issue 39): a
    # run's finish writes a `DagCallbackRequest` for `bin/airflow-worker` to run them.
    has_on_success_callback = models.BooleanField(db_default=False, default=False)
    has_on_failure_callback = models.BooleanField(db_default=False, default=False)
    # Airflow's task groups (its `task_group_dict`): group id -> the ids of its tasks, nested
    # groups' included (sorted). The worker's reads by `task_group_id` (ExternalTaskSensor)
    # look a group up here (`runtime.requests`); {}: none.
    task_groups = models.JSONField(
        default=dict, db_default=models.Value({}, models.JSONField()), blank=True
    )
    # The next run the timetable gives (Airflow's DagModel fields): its logical date, data
    # interval and the time it may be created from. Null when there is none (no timetable,
    # the end date passed). The scheduler reads only the Dags due by `next_dagrun_create_after`.
    next_dagrun = models.DateTimeField(null=True, blank=True)
    next_dagrun_data_interval_start = models.DateTimeField(null=True, blank=True)
    next_dagrun_data_interval_end = models.DateTimeField(null=True, blank=True)
    next_dagrun_create_after = models.DateTimeField(null=True, blank=True)
    # The clock instant those fields were computed at (a sync, an unpause, a pass, or the Dag
    # processor's parse the time scheduler plays: `definitions.next_runs.reparse`); null: unknown.
    next_dagrun_computed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["dag_id"]
        constraints = [
            models.CheckConstraint(condition=~models.Q(dag_id=""), name="dag_id_not_empty"),
            models.CheckConstraint(
                condition=models.Q(max_active_runs__gte=1), name="dag_max_active_runs_positive"
            ),
            models.CheckConstraint(
                condition=models.Q(schedule_mode__in=ScheduleMode.values), name="dag_schedule_mode"
            ),
            models.CheckConstraint(
                condition=models.Q(xcom_read_scope__in=XComReadScope.values),
                name="dag_xcom_read_scope_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(max_events_per_run__isnull=True)
                | models.Q(max_events_per_run__gte=1),
                name="dag_max_events_per_run_positive",
            ),
        ]
        indexes = [
            # The time scheduler's "due" read: unpaused Dags with a next run, by its time.
            models.Index(
                fields=["next_dagrun_create_after"],
                name="dag_next_run_due",
                condition=models.Q(is_paused=False, next_dagrun_create_after__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return self.dag_id


class TriggerRule(models.TextChoices):
    """Airflow's trigger rules (`airflow.utils.trigger_rule.TriggerRule`); `sql/dependencies.py`
    evaluates them (`all_done_setup_success`, a teardown's, with setup and teardown tasks:
    issue 39)."""

    ALL_SUCCESS = "all_success"
    ALL_FAILED = "all_failed"
    ALL_DONE = "all_done"
    ALL_SKIPPED = "all_skipped"
    ONE_SUCCESS = "one_success"
    ONE_FAILED = "one_failed"
    ONE_DONE = "one_done"
    NONE_FAILED = "none_failed"
    NONE_FAILED_MIN_ONE_SUCCESS = "none_failed_min_one_success"
    NONE_SKIPPED = "none_skipped"
    ALWAYS = "always"
    ALL_DONE_SETUP_SUCCESS = "all_done_setup_success"


# Airflow's default `retry_delay` (timedelta(seconds=300)).
DEFAULT_RETRY_DELAY_SECONDS = 300.0

# Airflow's `[operators] default_queue`, the queue of a task that names none and the one a worker
# claims from unless told otherwise; a queue name is at most 256 characters (Airflow's column).
DEFAULT_QUEUE = "default"
TASK_QUEUE_MAX_LENGTH = 256

# Airflow's `db_safe_priority` bounds (`airflow/sdk/bases/operator.py`): a 32-bit integer.
PRIORITY_WEIGHT_MIN = -2147483648
PRIORITY_WEIGHT_MAX = 2147483647


class MapCombine(models.TextChoices):
    """How a task mapped over several upstream outputs (`Task.map_sources`) combines them
    (issue 39), as Airflow 3.3.2's `get_task_map_length` counts them: `XComArg.zip` (the
    shortest's length), `zip(..., fillvalue=...)` (the longest's), `concat` (their sum)."""

    ONE = "", "one source"
    ZIP = "zip"
    ZIP_LONGEST = "zip_longest"
    CONCAT = "concat"


class WeightRule(models.TextChoices):
    """Airflow's `WeightRule` (`airflow/task/weight_rule.py`): how a task's effective priority
    weight is totalled from its own and its relatives' `priority_weight`
    (`airflow/task/priority_strategy.py`)."""

    DOWNSTREAM = "downstream"
    UPSTREAM = "upstream"
    ABSOLUTE = "absolute"


class Task(models.Model):
    """A task of a Dag: its declared outlets (assets and aliases), its upstream tasks (through
    `TaskUpstream`) and trigger rule, and its retry policy (Airflow's `retries`, `retry_delay`,
    `retry_exponential_backoff` (a multiplier, 0 = constant delay), `max_retry_delay`), and
    its priority (Airflow's `priority_weight` and `weight_rule`; `priority_weight_total` is the
    effective weight the sync computes from them as Airflow's strategy does, which orders
    claims)."""

    dag = models.ForeignKey(Dag, on_delete=models.CASCADE, related_name="tasks")
    task_id = models.CharField(max_length=DAG_ID_MAX_LENGTH)
    retries = models.PositiveIntegerField(default=0)
    trigger_rule = models.CharField(
        max_length=40, choices=TriggerRule.choices, default=TriggerRule.ALL_SUCCESS
    )
    retry_delay_seconds = models.FloatField(default=DEFAULT_RETRY_DELAY_SECONDS)
    retry_exponential_backoff = models.FloatField(default=0.0)
    max_retry_delay_seconds = models.FloatField(null=True, blank=True)
    # Shown only (issue 39): Airflow's task `owner` (its Dag's owners are made of them) and
    # `doc_md` ("" for none).
    owner = models.CharField(
        max_length=OWNERS_MAX_LENGTH, default=DEFAULT_OWNER, db_default=DEFAULT_OWNER
    )
    doc_md = models.TextField(blank=True, default="", db_default="")
    priority_weight = models.IntegerField(default=1)
    weight_rule = models.CharField(
        max_length=20, choices=WeightRule.choices, default=WeightRule.DOWNSTREAM
    )
    priority_weight_total = models.IntegerField(default=1)
    # Airflow's `pool` (a Pool's name; one that names no pool is stored as it is and its TIs
    # are never claimed, as Airflow's scheduler never queues them) and `pool_slots`.
    pool = models.CharField(max_length=POOL_NAME_MAX_LENGTH, default=DEFAULT_POOL_NAME)
    pool_slots = models.PositiveIntegerField(default=1)
    # Airflow's `queue` (`[operators] default_queue`: "default"): only a worker claiming from
    # it takes the task's TIs.
    queue = models.CharField(max_length=TASK_QUEUE_MAX_LENGTH, default=DEFAULT_QUEUE)
    # Airflow's `max_active_tis_per_dag` (this task's TIs of every run) and
    # `max_active_tis_per_dagrun` (of one run) claimed or running at once; None: no limit.
    max_active_tis_per_dag = models.PositiveIntegerField(null=True, blank=True)
    max_active_tis_per_dagrun = models.PositiveIntegerField(null=True, blank=True)
    # Dynamic task mapping (issue 25): a mapped task runs once per value of what it expands
    # over, each TI a map index: a literal list (its length, known when a run is created) or the
    # return value of one of its upstream tasks (its task_id; the length is known when that
    # task succeeds, `mapping`). Neither: not mapped.
    map_length = models.PositiveIntegerField(null=True, blank=True)
    map_upstream = models.CharField(max_length=DAG_ID_MAX_LENGTH, blank=True, default="")
    # A task of a mapped task group (Airflow's `@task_group ... .expand(...)`): the group's id,
    # its source in `map_length` / `map_upstream` as every task of the group has it. Map index
    # i of the task runs after map index i of its upstream tasks of the same group only
    # (`sql/dependencies`), and a group mapped over a return value expands all its tasks when
    # its roots expand (`mapping`). "": not in a mapped group.
    map_group = models.CharField(max_length=DAG_ID_MAX_LENGTH, blank=True, default="")
    # Over several upstream outputs (issue 39: Airflow's `a.zip(b, ...)`, `a.concat(b, ...)`):
    # how they combine, and their task ids in order (a task may come twice: `a.concat(a)`), the
    # first of them also in `map_upstream` (so "mapped over a return value" stays
    # `map_upstream <> ''`). [] and "" over one source. The values are the worker's.
    map_combine = models.CharField(
        max_length=16, choices=MapCombine.choices, blank=True, default="", db_default=""
    )
    map_sources = models.JSONField(
        default=list, db_default=models.Value([], models.JSONField()), blank=True
    )
    # Airflow's `depends_on_past` (issue 39): a TI waits until the task's TIs in the Dag's
    # previous run (by logical date) are success or skipped; `wait_for_downstream` also waits
    # for their direct downstream TIs there (and sets `depends_on_past`, as Airflow's operator
    # does); `ignore_first_depends_on_past` lets the task's first TI ever run
    # (`sql/dependencies._past_sql`, Airflow 3.3.2's `PrevDagrunDep`).
    depends_on_past = models.BooleanField(db_default=False, default=False)
    ignore_first_depends_on_past = models.BooleanField(db_default=False, default=False)
    wait_for_downstream = models.BooleanField(db_default=False, default=False)
    # Airflow's setup and teardown tasks (issue 39: `@setup`, `@teardown`, `.as_setup()`,
    # `.as_teardown(setups=..., on_failure_fail_dagrun=...)`): a task's relevant setups that are
    # not its direct upstream hold it back (`TaskSetupLink`, kind `setup`), a teardown waits for
    # the tasks between its setups and itself (kind `scope`), and the run's state ignores a
    # teardown unless `on_failure_fail_dagrun` (`run_state_leaf`, which the sync computes as
    # Airflow's `DagRun._tis_for_dagrun_state`: a task whose failure fails the run).
    is_setup = models.BooleanField(db_default=False, default=False)
    is_teardown = models.BooleanField(db_default=False, default=False)
    on_failure_fail_dagrun = models.BooleanField(db_default=False, default=False)
    run_state_leaf = models.BooleanField(db_default=True, default=True)
    upstream = models.ManyToManyField(
        "self",
        through="TaskUpstream",
        through_fields=("task", "upstream"),
        symmetrical=False,
        related_name="downstream",
        blank=True,
    )
    outlet_assets = models.ManyToManyField(
        Asset, through="TaskOutletAssetReference", related_name="producing_tasks", blank=True
    )
    # Airflow's `inlets` (its `Asset`s only, as its execution API's inlet check reads them):
    # `[[name, uri], ...]` as declared. Kept as declared, not as Asset rows: an inlet whose name
    # or uri another asset holds is Airflow's inactive asset, which fails the task
    # (`catalog.asset_activity`), and must not refuse the Dag's sync.
    inlets = models.JSONField(
        default=list, db_default=models.Value([], models.JSONField()), blank=True
    )
    outlet_aliases = models.ManyToManyField(
        AssetAlias, through="TaskOutletAliasReference", related_name="producing_tasks", blank=True
    )

    class Meta:
        ordering = ["dag_id", "task_id"]
        constraints = [
            models.UniqueConstraint(fields=["dag", "task_id"], name="task_unique_per_dag"),
            models.CheckConstraint(condition=~models.Q(task_id=""), name="task_id_not_empty"),
            models.CheckConstraint(
                condition=models.Q(trigger_rule__in=TriggerRule.values), name="task_trigger_rule"
            ),
            models.CheckConstraint(
                condition=models.Q(retry_delay_seconds__gte=0)
                & models.Q(retry_exponential_backoff__gte=0)
                & (
                    models.Q(max_retry_delay_seconds__isnull=True)
                    | models.Q(max_retry_delay_seconds__gte=0)
                ),
                name="task_retry_delays_not_negative",
            ),
            models.CheckConstraint(
                condition=models.Q(map_length__isnull=True) | models.Q(map_upstream=""),
                name="task_maps_over_one_source",
            ),
            models.CheckConstraint(
                condition=models.Q(map_combine__in=MapCombine.values), name="task_map_combine"
            ),
            models.CheckConstraint(
                condition=models.Q(map_combine="") | ~models.Q(map_upstream=""),
                name="task_map_combine_over_outputs",
            ),
            # A mapped group's task is mapped over the group's source.
            models.CheckConstraint(
                condition=models.Q(map_group="")
                | models.Q(map_length__isnull=False)
                | ~models.Q(map_upstream=""),
                name="task_map_group_is_mapped",
            ),
            models.CheckConstraint(
                condition=models.Q(weight_rule__in=WeightRule.values), name="task_weight_rule"
            ),
            models.CheckConstraint(condition=models.Q(pool_slots__gte=1), name="task_pool_slots"),
            # Airflow's `on_failure_fail_dagrun` setter refuses it on a task not a teardown.
            models.CheckConstraint(
                condition=models.Q(on_failure_fail_dagrun=False) | models.Q(is_teardown=True),
                name="task_fail_dagrun_is_teardown",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.dag_id}.{self.task_id}"

    @property
    def is_mapped(self) -> bool:
        return self.map_length is not None or bool(self.map_upstream)


class TaskUpstream(models.Model):
    """ "`task` runs after `upstream`" (Airflow's `upstream >> task`), both tasks of one Dag
    (`sync_dags` checks it, and that the links have no cycle)."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="upstream_links")
    upstream = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="downstream_links")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "upstream"], name="task_upstream_unique"),
            models.CheckConstraint(
                condition=~models.Q(task=models.F("upstream")), name="task_upstream_not_self"
            ),
        ]
        # Downstream evaluation starts from the task that finished.
        indexes = [models.Index(fields=["upstream", "task"], name="task_upstream_by_upstream")]

    def __str__(self) -> str:
        return f"{self.upstream_id} >> {self.task_id}"


class SetupLinkKind(models.TextChoices):
    """What a `TaskSetupLink` makes its task wait for (Airflow 3.3.2's `TriggerRuleDep`)."""

    # A relevant setup of the task that is not its direct upstream
    # (`_evaluate_setup_constraint`'s indirect setups): it must succeed.
    SETUP = "setup"
    # A task between a teardown's setups and itself that is not its direct upstream
    # (`_evaluate_teardown_scope`): it must be finished.
    SCOPE = "scope"


class TaskSetupLink(models.Model):
    """ "`task` waits for `other`" beyond its direct upstream (issue 39), as `kind` says;
    derived by the sync from the upstream links and the setup/teardown flags
    (`definitions.setup_teardown`), never written otherwise."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="setup_links")
    other = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="setup_link_targets")
    kind = models.CharField(max_length=10, choices=SetupLinkKind.choices)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["task", "other", "kind"], name="task_setup_link_unique"
            ),
            models.CheckConstraint(
                condition=models.Q(kind__in=SetupLinkKind.values), name="task_setup_link_kind"
            ),
        ]
        # The evaluation finds a finished task's waiting tasks through it.
        indexes = [models.Index(fields=["other", "task"], name="task_setup_link_by_other")]

    def __str__(self) -> str:
        return f"{self.task_id} waits for {self.other_id} ({self.kind})"


class TaskOutletAssetReference(models.Model):
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="outlet_asset_refs")
    asset = models.ForeignKey(Asset, on_delete=models.CASCADE, related_name="task_outlet_refs")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "asset"], name="task_outlet_asset_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.task_id} -> {self.asset_id}"


class TaskOutletAliasReference(models.Model):
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="outlet_alias_refs")
    alias = models.ForeignKey(AssetAlias, on_delete=models.CASCADE, related_name="task_outlet_refs")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "alias"], name="task_outlet_alias_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.task_id} -> {self.alias_id}"


class DagScheduleAssetReference(models.Model):
    """ "Dag is scheduled on this asset": derived from `Dag.schedule` by sync_dags."""

    dag = models.ForeignKey(Dag, on_delete=models.CASCADE, related_name="schedule_asset_refs")
    asset = models.ForeignKey(Asset, on_delete=models.CASCADE, related_name="schedule_dag_refs")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["dag", "asset"], name="dag_schedule_asset_unique"),
        ]
        # The drain looks up "which Dags are scheduled on these assets".
        indexes = [models.Index(fields=["asset", "dag"], name="dag_sched_asset_by_asset")]

    def __str__(self) -> str:
        return f"{self.dag_id} -> {self.asset_id}"


class DagScheduleAliasReference(models.Model):
    """ "Dag is scheduled on this alias": derived from `Dag.schedule` by sync_dags."""

    dag = models.ForeignKey(Dag, on_delete=models.CASCADE, related_name="schedule_alias_refs")
    alias = models.ForeignKey(
        AssetAlias, on_delete=models.CASCADE, related_name="schedule_dag_refs"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["dag", "alias"], name="dag_schedule_alias_unique"),
        ]
        indexes = [models.Index(fields=["alias", "dag"], name="dag_sched_alias_by_alias")]

    def __str__(self) -> str:
        return f"{self.dag_id} -> {self.alias_id}"


class DagImportError(models.Model):
    """A Dag file that did not import, or holds a Dag the service cannot run, as the last sync
    of its folder reported it (Airflow's `ParseImportError`, `/api/v2/importErrors`). Written
    only by `definitions.record_import_errors` under the sync lock: each sync that reports them
    replaces the set of its own bundle (a file that imports again loses its row; another
    bundle's errors stay, as Airflow's dag processor keeps them per bundle). The file's Dags
    keep what they were last synced as; `filename` is relative to the Dag folder, like
    `Dag.fileloc`."""

    filename = models.CharField(max_length=2000)
    bundle_name = models.CharField(max_length=BUNDLE_NAME_MAX_LENGTH, default=DEFAULT_BUNDLE_NAME)
    timestamp = models.DateTimeField()
    stack_trace = models.TextField()

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["filename"], name="import_error_by_filename")]

    def __str__(self) -> str:
        return f"import error in {self.filename}"


# A DAG file's source is stored up to this many bytes of UTF-8 (512 KiB; a request body's string
# may hold at most `limits.MAX_JSON_STRING` characters): a longer file keeps its first bytes and
# says so (`DagCode.source_size` is the whole file's).
DAG_SOURCE_MAX_BYTES = 512 * 1024


class DagCode(models.Model):
    """A DAG file's source as the worker synced it (Airflow's `dag_code`), one row per file:
    `fileloc` as `Dag.fileloc`, looked up by its md5 (`fileloc_hash`: a 2,000-character path is
    too long for an index, as Airflow notes), the source and its md5 (Airflow's
    `source_code_hash`: a sync replaces the row only when it changed). Written only by
    `definitions.sources` under the sync lock; a file no longer in the synced folder loses its
    row. Only the current source is kept: one row per file, not one per Dag version."""

    fileloc_hash = models.CharField(max_length=32, unique=True)
    fileloc = models.TextField()
    source_code = models.TextField()
    source_code_hash = models.CharField(max_length=32)
    # The whole file's size in bytes; larger than the stored source's when it was truncated.
    source_size = models.PositiveIntegerField()
    truncated = models.BooleanField(default=False)
    last_updated = models.DateTimeField()

    class Meta:
        ordering = ["fileloc"]

    def __str__(self) -> str:
        return f"source of {self.fileloc}"


class DagFavorite(models.Model):
    """A user's favorite Dag (Airflow's `dag_favorite` table: `POST /dags/{dag_id}/favorite`,
    `/unfavorite`, the `is_favorite` filter of `GET /dags`). Goes with the Dag and with the
    user."""

    dag = models.ForeignKey(Dag, on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "dag"], name="dag_favorite_once_per_user"),
        ]

    def __str__(self) -> str:
        return f"{self.user_id} likes {self.dag_id}"


class DagVersion(models.Model):
    """One version of a Dag's definition (Airflow's `dag_version`): a sync that creates the Dag
    or changes any of its fields, tasks or references writes the next `version_number`
    (`definitions.sync`); an unchanged sync writes none. Goes with the Dag."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    dag = models.ForeignKey(Dag, on_delete=models.CASCADE, related_name="versions")
    version_number = models.PositiveIntegerField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["dag", "version_number"], name="dag_version_number_unique"
            ),
        ]
        indexes = [models.Index(fields=["dag", "created_at"], name="dag_version_by_time")]

    def __str__(self) -> str:
        return f"{self.dag_id} v{self.version_number}"


class WorkerBundle(models.Model):
    """A Dag bundle some worker serves, and when a worker serving it last asked for work (the
    claim request's `bundles`, `task_state.claims`; written at most once per
    `operations.bundles.SEEN_EVERY` per bundle). A Dag whose bundle no worker claimed for within
    `SERVED_WITHIN` is shown as unserved (the Dag page, `/healthz`)."""

    bundle_name = models.CharField(max_length=BUNDLE_NAME_MAX_LENGTH, primary_key=True)
    last_claim_at = models.DateTimeField()
    last_hostname = models.CharField(max_length=255)

    def __str__(self) -> str:
        return f"bundle {self.bundle_name} (last claim {self.last_claim_at:%Y-%m-%d %H:%M})"
