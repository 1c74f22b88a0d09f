"""What tasks read and write at run time besides their state (DESIGN 2): XComs, Variables,
Connections, rendered template fields and sensor reschedules."""

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
