"""What tasks read and write at run time besides their state (DESIGN 2): XComs, Variables,
Connections, rendered template fields, sensor reschedules and state store keys."""

from django.db import models
from django.utils import timezone

from .dags import DAG_ID_MAX_LENGTH

KEY_MAX_LENGTH = 512


class XCom(models.Model):
    """A value a TI pushed, keyed like Airflow's: (dag_id, run_id, task_id, map_index, key).

    Keyed by ids, not foreign keys: a value outlives nothing it names (deleting a run deletes
    its XComs through `runs`), and the worker API addresses it by those ids."""

    dag_id = models.CharField(max_length=DAG_ID_MAX_LENGTH)
    run_id = models.CharField(max_length=DAG_ID_MAX_LENGTH)
    task_id = models.CharField(max_length=DAG_ID_MAX_LENGTH)
    map_index = models.IntegerField(default=-1)
    key = models.CharField(max_length=KEY_MAX_LENGTH)
    # The JSON the Task SDK sent (already serialized by it); null is a stored None.
    value = models.JSONField(null=True, blank=True)
    # The length the Task SDK sends with the return value of a task a mapped task expands over
    # (`?mapped_length=`, Airflow's TaskMap.length): `mapping` reads it when expanding.
    mapped_length = models.PositiveIntegerField(null=True, blank=True)
    timestamp = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "XCom"
        ordering = ["dag_id", "run_id", "task_id", "map_index", "key"]
        constraints = [
            models.UniqueConstraint(
                fields=["dag_id", "run_id", "task_id", "map_index", "key"], name="xcom_unique"
            ),
            models.CheckConstraint(condition=~models.Q(key=""), name="xcom_key_not_empty"),
        ]
        # Retention selects old XComs in (timestamp, id) order.
        indexes = [models.Index(fields=["timestamp"], name="xcom_by_time")]

    def __str__(self) -> str:
        return f"{self.dag_id}.{self.task_id}[{self.map_index}] {self.key} ({self.run_id})"


class Variable(models.Model):
    """An operator-managed setting (Airflow's Variable): a key and a text value. As Airflow's,
    the value is stored Fernet-encrypted (`is_encrypted`, `guards.encryption`; issue 38): `val`
    is then a token, read through `runtime.variables.value_of`, so nothing can sort or filter
    on the clear value. A row written before (or by hand) with `is_encrypted` false is clear."""

    key = models.CharField(max_length=250, unique=True)
    val = models.TextField(null=True, blank=True)
    is_encrypted = models.BooleanField(default=False)
    description = models.TextField(null=True, blank=True)

    class Meta:
        ordering = ["key"]
        constraints = [
            models.CheckConstraint(condition=~models.Q(key=""), name="variable_key_not_empty"),
        ]

    def __str__(self) -> str:
        return self.key


class Connection(models.Model):
    """Airflow's Connection. `password` and `extra` hold Fernet tokens (`assets_app.secrets`),
    never the clear text: read them through `connections.reveal`."""

    conn_id = models.CharField(max_length=250, unique=True)
    conn_type = models.CharField(max_length=500)
    description = models.TextField(null=True, blank=True)
    host = models.CharField(max_length=500, null=True, blank=True)
    schema = models.CharField(max_length=500, null=True, blank=True)
    login = models.TextField(null=True, blank=True)
    password = models.TextField(null=True, blank=True)
    port = models.IntegerField(null=True, blank=True)
    extra = models.TextField(null=True, blank=True)

    class Meta:
        ordering = ["conn_id"]
        constraints = [
            models.CheckConstraint(condition=~models.Q(conn_id=""), name="connection_id_not_empty"),
        ]

    def __str__(self) -> str:
        return self.conn_id


class RenderedTaskFields(models.Model):
    """The rendered template fields a TI's worker reported (`PUT .../rtif`), one row per TI."""

    ti = models.OneToOneField(
        "TaskInstance", on_delete=models.CASCADE, related_name="rendered_fields"
    )
    fields = models.JSONField(default=dict)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "rendered task fields"

    def __str__(self) -> str:
        return f"rendered fields of {self.ti_id}"


class TaskReschedule(models.Model):
    """One `up_for_reschedule` of a sensor try: when that poke started and when it runs again.
    The first row of a try is the try's start (`GET .../task-reschedules/{id}/start_date`)."""

    ti = models.ForeignKey("TaskInstance", on_delete=models.CASCADE, related_name="reschedules")
    try_number = models.PositiveIntegerField()
    start_date = models.DateTimeField()
    end_date = models.DateTimeField()
    reschedule_date = models.DateTimeField()

    class Meta:
        ordering = ["ti", "id"]
        indexes = [models.Index(fields=["ti", "try_number"], name="reschedule_by_ti_try")]

    def __str__(self) -> str:
        return f"{self.ti_id} try {self.try_number} -> {self.reschedule_date}"


class TaskStateStore(models.Model):
    """A key a task keeps across its tries (Airflow 3.3's task state store, AIP-103): scoped to
    (run, task_id, map_index) as Airflow's `task_state_store`, so every try of a TI, and a TI
    cleared and run again, reads what an earlier one wrote; another run starts empty.

    `value` is the JSON text the Task SDK sent, stored verbatim (Airflow's Text column: its
    object key order and numbers come back as written). The row belongs to its run (deleting
    the run deletes it, Airflow's `ON DELETE CASCADE`); clearing a TI keeps it. `expires_at`
    is the worker's (it resolves `retention` and `default_retention_days`); null never expires."""

    dag_run = models.ForeignKey("DagRun", on_delete=models.CASCADE, related_name="state_keys")
    dag_id = models.CharField(max_length=DAG_ID_MAX_LENGTH)
    run_id = models.CharField(max_length=DAG_ID_MAX_LENGTH)
    task_id = models.CharField(max_length=DAG_ID_MAX_LENGTH)
    map_index = models.IntegerField(default=-1)
    key = models.CharField(max_length=KEY_MAX_LENGTH)
    value = models.TextField()
    updated_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "task state key"
        ordering = ["dag_id", "run_id", "task_id", "map_index", "key"]
        constraints = [
            models.UniqueConstraint(
                fields=["dag_run", "task_id", "map_index", "key"], name="task_state_store_unique"
            ),
            models.CheckConstraint(condition=~models.Q(key=""), name="task_state_key_not_empty"),
        ]
        indexes = [
            models.Index(
                fields=["dag_id", "run_id", "task_id", "map_index"], name="task_state_by_ti"
            ),
            # Retention deletes expired keys in (expires_at) order.
            models.Index(fields=["expires_at"], name="task_state_by_expiry"),
        ]

    def __str__(self) -> str:
        return f"{self.dag_id}.{self.task_id}[{self.map_index}] {self.key} ({self.run_id})"


class AssetStateWriter(models.TextChoices):
    """Who last wrote an asset state key (Airflow's `AssetStateStoreWriterKind`)."""

    TASK = "task", "task"
    WATCHER = "watcher", "watcher"
    API = "api", "api"


class AssetStateStore(models.Model):
    """A key kept on an asset across runs (Airflow 3.3's asset state store, AIP-103), e.g. a
    watermark a producer advances and its consumers read. Lives until deleted or its asset is.

    `value` is the JSON text as sent (see `TaskStateStore`). The `last_updated_by_*` columns are
    copies, not foreign keys (Airflow's): they outlive the run that wrote them."""

    asset = models.ForeignKey("Asset", on_delete=models.CASCADE, related_name="state_keys")
    key = models.CharField(max_length=KEY_MAX_LENGTH)
    value = models.TextField()
    updated_at = models.DateTimeField(default=timezone.now)
    last_updated_by_kind = models.CharField(
        max_length=16, choices=AssetStateWriter.choices, null=True, blank=True
    )
    last_updated_by_dag_id = models.CharField(max_length=DAG_ID_MAX_LENGTH, null=True, blank=True)
    last_updated_by_run_id = models.CharField(max_length=DAG_ID_MAX_LENGTH, null=True, blank=True)
    last_updated_by_task_id = models.CharField(max_length=DAG_ID_MAX_LENGTH, null=True, blank=True)
    last_updated_by_map_index = models.IntegerField(null=True, blank=True)

    class Meta:
        verbose_name = "asset state key"
        ordering = ["asset", "key"]
        constraints = [
            models.UniqueConstraint(fields=["asset", "key"], name="asset_state_store_unique"),
            models.CheckConstraint(condition=~models.Q(key=""), name="asset_state_key_not_empty"),
            # Airflow's `validate_writer_fields`: a task write names its TI, the others none.
            models.CheckConstraint(
                condition=(
                    models.Q(last_updated_by_kind="task", last_updated_by_task_id__isnull=False)
                    | (
                        ~models.Q(last_updated_by_kind="task")
                        & models.Q(last_updated_by_task_id__isnull=True)
                    )
                    | models.Q(last_updated_by_kind__isnull=True)
                ),
                name="asset_state_writer_fields",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.asset_id} {self.key}"
