"""The attribute ledger (issue 39): every parameter of Airflow 3.3.2's `DAG`, `BaseOperator`
(which `@task`, task groups and setup/teardown reach) and timetables is either honoured (the
conversion carries it to the service, or the stock Task SDK in `bin/airflow-worker` applies it
as Airflow does, or it only names or describes things) or refused: a Dag that sets a refused
attribute to anything but Airflow's default is left out, its file an import error naming the
file, Dag, task and attribute, because a Dag that runs differently without a word is worse than
a refusal. Defaults are read from Airflow itself (a plain `DAG` and `BaseOperator` built in the
same interpreter, so `[operators] default_queue`, `default_pool` and the like count), and a
value `default_args` brings counts as the operator's own.

The JSON door (`assets_app.definitions.schema`) refuses a definition key that is a refused
attribute with the same reason, naming it.

`tests/compat/test_attribute_ledger.py` reads the pinned Airflow's signatures and fails when a
parameter is in neither list; the README's "Attribute ledger" table is this module's.
"""

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Honoured:
    """Carried or applied as Airflow does; `where` says by what."""

    where: str


@dataclass(frozen=True)
class Refused:
    """Not run as Airflow runs it: a value other than Airflow's default refuses the Dag.
    `differs(obj, reference)` says whether `obj` (a Dag or task) departs from the default
    (`reference`: a plain Dag or operator); None compares the attribute itself."""

    reason: str
    differs: Callable[[Any, Any], bool] | None = None


CONVERSION = "the conversion (`airflow_worker/dag_files.py`)"
WORKER = "the worker: the stock Task SDK task runner in `bin/airflow-worker` applies it"
DISPLAY = "names or describes only: nothing runs differently"
TEMPLATES = WORKER + " (templates are rendered there, from the DAG file)"
STRUCTURE = "structure: read through the tasks and their attributes"
IGNORED_BY_AIRFLOW = "ignored, as Airflow 3 ignores it (SLAs were removed in Airflow 3.0)"


def _truthy(name: str) -> Callable[[Any, Any], bool]:
    """Set at all (a callback, a list): any value but None or empty departs."""
    return lambda obj, _reference: bool(getattr(obj, name))


def _own_date(name: str) -> Callable[[Any, Any], bool]:
    """A task's own start or end date: the Dag's (or none) is Airflow's default."""

    def differs(task: Any, _reference: Any) -> bool:
        value = getattr(task, name)
        return value is not None and value != getattr(task.dag, name, None)

    return differs


DAG_ATTRIBUTES: dict[str, Honoured | Refused] = {
    "dag_id": Honoured(CONVERSION + ": the Dag's `dag_id`"),
    "description": Honoured(CONVERSION + ": `description`, shown in the API and admin"),
    "default_args": Honoured(STRUCTURE + " (each value is checked on the operators it reaches)"),
    "start_date": Honoured(
        CONVERSION + ": `start_date`, of a time schedule's runs; shown for every Dag"
    ),
    "end_date": Honoured(
        CONVERSION + ": `end_date`, of a time schedule's runs; shown for every Dag"
    ),
    "schedule": Honoured(CONVERSION + ": `schedule` / `timetable` (see the timetables)"),
    "catchup": Honoured(CONVERSION + ": `catchup`, of a time schedule's runs; shown for every Dag"),
    "template_searchpath": Honoured(TEMPLATES),
    "template_undefined": Honoured(TEMPLATES),
    "user_defined_macros": Honoured(TEMPLATES),
    "user_defined_filters": Honoured(TEMPLATES),
    "jinja_environment_kwargs": Honoured(TEMPLATES),
    "render_template_as_native_obj": Honoured(TEMPLATES),
    "max_active_runs": Honoured(CONVERSION + ": `max_active_runs`, the scheduler's run limit"),
    "is_paused_upon_creation": Honoured(CONVERSION + ": `is_paused`, the pause of a new Dag"),
    "tags": Honoured(
        CONVERSION + ": `tags`, every one shown in the API (and its `tags` filter) and admin; "
        "the `xcom_read_scope:` and `consumption:` tags also set those"
    ),
    "doc_md": Honoured(CONVERSION + ": `doc_md`, shown in the API's Dag details and the admin"),
    "owner_links": Honoured(DISPLAY),
    "dag_display_name": Honoured(DISPLAY),
    "auto_register": Honoured("the parse: Airflow's own DagBag finds the Dags"),
    "task_group": Honoured(
        STRUCTURE + " (a group prefixes its tasks' ids; the definition's `task_groups` lists "
        "each group's tasks for the reads by `task_group_id`)"
    ),
    "disable_bundle_versioning": Honoured(
        "the service runs the file as it stands, as Airflow's local Dag bundle (no versions)"
    ),
    "rerun_with_latest_version": Honoured(
        "the service runs the file as it stands, as Airflow's local Dag bundle (no versions)"
    ),
    "sla_miss_callback": Honoured(IGNORED_BY_AIRFLOW),
    "max_active_tasks": Honoured(
        CONVERSION + ": `max_active_tasks`, claimed and running TIs of one run at once"
    ),
    "max_consecutive_failed_dag_runs": Honoured(
        CONVERSION + ": `max_consecutive_failed_dag_runs`, the Dag pauses after that many "
        "failed runs (`scheduling.dependencies.finish_run_if_done`)"
    ),
    "dagrun_timeout": Honoured(
        CONVERSION + ": `dagrun_timeout_seconds`, the run-timeouts timer (`scheduling.timeouts`)"
    ),
    "deadline": Refused("deadline alerts are not supported", _truthy("deadline")),
    "on_success_callback": Honoured(
        CONVERSION + ": `has_on_success_callback`; a run's finish writes a callback request "
        "(`scheduling.callbacks`) that `bin/airflow-worker` runs from the file with Airflow's "
        "context (`airflow_worker/dag_callbacks.py`)"
    ),
    "on_failure_callback": Honoured(
        CONVERSION + ": `has_on_failure_callback`; as `on_success_callback`, for a run that "
        "fails (a task failure, or its dagrun_timeout)"
    ),
    "params": Honoured(
        CONVERSION + ": `params`, a manual run's conf checked against them as Airflow checks "
        "it; " + WORKER + " (the tasks' `params`)"
    ),
    "access_control": Refused(
        "Airflow's per-Dag access control is not supported (the service's roles apply)",
        _truthy("access_control"),
    ),
    "fail_fast": Honoured(
        CONVERSION + ": `fail_fast`, a task failing for good fails its run's running tasks and "
        "skips the others"
    ),
    "allowed_run_types": Honoured(
        CONVERSION + ": `allowed_run_types`, refused on every door that makes a run as Airflow "
        "refuses them (an asset-and-time Dag without `scheduled` is refused)"
    ),
}

TASK_ATTRIBUTES: dict[str, Honoured | Refused] = {
    "task_id": Honoured(CONVERSION + ": `task_id`"),
    "dag": Honoured(STRUCTURE),
    "task_group": Honoured(
        STRUCTURE + " (mapped groups: `expand` and `map_group`, over a literal, a task's output or "
        "a `zip` / `concat` of outputs; every group: `task_groups`)"
    ),
    "default_args": Honoured(STRUCTURE + " (each value is checked as the task's own)"),
    "retries": Honoured(CONVERSION + ": `retries`, the service's retry state"),
    "retry_delay": Honoured(CONVERSION + ": `retry_delay_seconds`"),
    "retry_exponential_backoff": Honoured(CONVERSION + ": `retry_exponential_backoff`"),
    "max_retry_delay": Honoured(CONVERSION + ": `max_retry_delay_seconds`"),
    "retry_policy": Honoured(
        WORKER + " (its retry decision and delay reach the service with the try's end)"
    ),
    "trigger_rule": Honoured(
        CONVERSION + ": `trigger_rule` (a rule the service does not know is refused there)"
    ),
    "outlets": Honoured(CONVERSION + ": `outlets` and `outlet_aliases`"),
    "inlets": Honoured(
        CONVERSION + ": `inlets` (its assets: an inactive one fails the task as on Airflow); inlet "
        "events through the worker API"
    ),
    "params": Honoured(WORKER + " (a task's own params)"),
    "execution_timeout": Honoured(WORKER),
    "on_execute_callback": Honoured(WORKER),
    "on_failure_callback": Honoured(WORKER),
    "on_success_callback": Honoured(WORKER),
    "on_retry_callback": Honoured(WORKER),
    "on_skipped_callback": Honoured(WORKER),
    "pre_execute": Honoured(WORKER),
    "post_execute": Honoured(WORKER),
    "email": Honoured(WORKER + " (failure e-mails, with the worker's SMTP settings)"),
    "email_on_retry": Honoured(WORKER),
    "email_on_failure": Honoured(WORKER),
    "run_as_user": Honoured(WORKER + " (sudo, on the worker's machine)"),
    "do_xcom_push": Honoured(WORKER),
    "multiple_outputs": Honoured(WORKER),
    "map_index_template": Honoured(WORKER + " (the rendered map index is stored)"),
    "render_template_as_native_obj": Honoured(TEMPLATES),
    "logger_name": Honoured(WORKER),
    "allow_nested_operators": Honoured(WORKER + " (a warning only)"),
    "owner": Honoured(
        CONVERSION + ": `owner`, shown by the API's tasks; the Dag's `owners` in the API and admin"
    ),
    "doc": Honoured(DISPLAY),
    "doc_md": Honoured(CONVERSION + ": `doc_md`, shown by the API's tasks"),
    "doc_json": Honoured(DISPLAY),
    "doc_yaml": Honoured(DISPLAY),
    "doc_rst": Honoured(DISPLAY),
    "task_display_name": Honoured(DISPLAY),
    "sla": Honoured(IGNORED_BY_AIRFLOW),
    "depends_on_past": Honoured(
        CONVERSION + ": `depends_on_past`, a TI waits for its previous run's (Airflow's "
        "`PrevDagrunDep`, in the service's dependency evaluation)"
    ),
    "ignore_first_depends_on_past": Honoured(CONVERSION + ": `ignore_first_depends_on_past`"),
    "wait_for_past_depends_before_skipping": Honoured(
        "as Airflow 3.3.2's scheduler, which never reads it (its `DagRun` evaluates "
        "dependencies with `wait_for_past_depends_before_skipping` off): no effect"
    ),
    "wait_for_downstream": Honoured(
        CONVERSION + ": `wait_for_downstream` (and `depends_on_past`, as Airflow sets it)"
    ),
    "pool": Honoured(
        CONVERSION + ": `pool`; a claim never hands out more slots than the pool has open (a "
        "pool that does not exist: its TIs are not claimed, as Airflow does not queue them)"
    ),
    "pool_slots": Honoured(CONVERSION + ": `pool_slots`, the slots each claimed TI holds"),
    "priority_weight": Honoured(
        CONVERSION + ": `priority_weight`; claims take the heaviest effective weight first"
    ),
    "weight_rule": Honoured(
        CONVERSION + ": `weight_rule` (downstream, upstream, absolute; a custom strategy is "
        "refused), totalled at sync as Airflow's priority strategy"
    ),
    "queue": Honoured(
        CONVERSION + ": `queue`; a worker claims only its queues (`bin/airflow-worker --queues`, "
        "default `[operators] default_queue`)"
    ),
    "max_active_tis_per_dag": Honoured(
        CONVERSION + ": `max_active_tis_per_dag`, the task's claimed and running TIs at once"
    ),
    "max_active_tis_per_dagrun": Honoured(
        CONVERSION + ": `max_active_tis_per_dagrun`, the task's claimed and running TIs of one "
        "run at once"
    ),
    "start_date": Refused(
        "a task's own start date is not supported (only the Dag's)", _own_date("start_date")
    ),
    "end_date": Refused(
        "a task's own end date is not supported (only the Dag's)", _own_date("end_date")
    ),
    "executor": Refused("choosing an executor is not supported (the service has one kind)"),
    "executor_config": Refused(
        "executor_config is not supported (no executor here reads it)", _truthy("executor_config")
    ),
    "resources": Refused("task resources are not supported (no executor here reads them)"),
}

# Not parameters of BaseOperator: what `@setup` / `@teardown` / `.as_setup()` /
# `.as_teardown(on_failure_fail_dagrun=...)` set on a task.
AIRFLOW_SET_TASK_ATTRIBUTES: dict[str, Honoured | Refused] = {
    "is_setup": Honoured(
        CONVERSION + ": `is_setup`; a task downstream of a setup waits for it to succeed as "
        "Airflow's setup constraint (`sql/dependencies`); a mapped setup is refused"
    ),
    "is_teardown": Honoured(
        CONVERSION + ": `is_teardown` (its rule `all_done_setup_success`); it waits for the "
        "tasks between its setups and itself, and the run's state ignores it "
        "(`Task.run_state_leaf`); a mapped teardown is refused"
    ),
    "on_failure_fail_dagrun": Honoured(
        CONVERSION + ": `on_failure_fail_dagrun`, the teardown's failure fails the run"
    ),
}

# Timetables by class name (the Task SDK's and core's alike). A refused one is refused whole by
# the conversion (`dag_files._schedule`), naming the Dag; every parameter of an honoured one is
# carried (TIMETABLE_PARAMETERS).
TIMETABLES: dict[str, Honoured | Refused] = {
    "NullTimetable": Honoured(CONVERSION + ": `schedule` null (manual runs only)"),
    "OnceTimetable": Honoured(CONVERSION + ": `timetable` `@once`"),
    "AssetTriggeredTimetable": Honoured(CONVERSION + ": the asset `schedule`"),
    "AssetOrTimeSchedule": Honoured(CONVERSION + ": `schedule_mode` `asset_or_time`"),
    "CronTriggerTimetable": Honoured(CONVERSION + ": `timetable` `cron_trigger`"),
    "CronDataIntervalTimetable": Honoured(CONVERSION + ": `timetable` `cron_data_interval`"),
    "DeltaTriggerTimetable": Honoured(CONVERSION + ": `timetable` `delta_trigger`"),
    "DeltaDataIntervalTimetable": Honoured(CONVERSION + ": `timetable` `delta_data_interval`"),
    "MultipleCronTriggerTimetable": Honoured(CONVERSION + ": `timetable` `multiple_cron_trigger`"),
    "EventsTimetable": Honoured(CONVERSION + ": `timetable` `events`"),
    "ContinuousTimetable": Refused("`@continuous` is not supported"),
    "CronPartitionTimetable": Refused("partitioned schedules are not supported"),
    "PartitionedAssetTimetable": Refused("partitioned schedules are not supported"),
    "PartitionedAtRuntime": Refused("partitioned schedules are not supported"),
}

TIMETABLE_PARAMETERS: dict[str, Honoured] = {
    "expression": Honoured(CONVERSION + ": `cron`"),
    "cron": Honoured(CONVERSION + ": `cron`"),
    "crons": Honoured(CONVERSION + ": `crons`"),
    "timezone": Honoured(CONVERSION + ": `timezone`"),
    "interval": Honoured(CONVERSION + ": `interval`"),
    "run_immediately": Honoured(CONVERSION + ": `run_immediately`"),
    "delta": Honoured(CONVERSION + ": `delta` (a timedelta; a relativedelta is refused)"),
    "event_dates": Honoured(CONVERSION + ": `event_dates`"),
    "restrict_to_events": Honoured(CONVERSION + ": `restrict_to_events`"),
    "presorted": Honoured(CONVERSION + " (the dates are carried sorted either way)"),
    "description": Honoured(CONVERSION + ": the events timetable's `description`"),
    "assets": Honoured(CONVERSION + ": the asset `schedule`"),
    "timetable": Honoured(CONVERSION + ": the time half, `timetable`"),
}


@functools.cache
def _references() -> tuple[Any, Any]:
    """A plain Dag and operator: Airflow's defaults as this interpreter's config makes them."""
    from airflow.sdk import DAG, BaseOperator

    return DAG(dag_id="__ledger_reference__", schedule=None), BaseOperator(
        task_id="__ledger_reference__"
    )


def _departs(name: str, entry: Refused, obj: Any, reference: Any) -> bool:
    if entry.differs is not None:
        return entry.differs(obj, reference)
    return bool(getattr(obj, name) != getattr(reference, name))


def refusals(dag: Any) -> Iterator[str]:
    """What of `dag` the service would run differently from Airflow, one text per attribute:
    `refused by the asset service (Dag 'd', task 't', attribute 'pool'): pools are not
    supported` (without a task for a Dag's own attribute). Empty: the Dag runs as on Airflow."""
    reference_dag, reference_task = _references()
    for name, entry in DAG_ATTRIBUTES.items():
        if isinstance(entry, Refused) and _departs(name, entry, dag, reference_dag):
            yield (
                f"refused by the asset service (Dag {dag.dag_id!r}, attribute {name!r}): "
                f"{entry.reason}"
            )
    task_entries = {**AIRFLOW_SET_TASK_ATTRIBUTES, **TASK_ATTRIBUTES}
    for task in sorted(dag.tasks, key=lambda t: t.task_id):
        for name, entry in task_entries.items():
            if isinstance(entry, Refused) and _departs(name, entry, task, reference_task):
                yield (
                    f"refused by the asset service (Dag {dag.dag_id!r}, task {task.task_id!r}, "
                    f"attribute {name!r}): {entry.reason}"
                )


def _rows(entries: dict[str, Honoured] | dict[str, Honoured | Refused]) -> list[str]:
    rows = []
    for name, entry in entries.items():
        if isinstance(entry, Honoured):
            rows.append(f"| `{name}` | honoured | {entry.where} |")
        else:
            rows.append(f"| `{name}` | refused | {entry.reason} |")
    return rows


def markdown() -> str:
    """The README's ledger tables (`tests/compat/test_attribute_ledger.py` keeps them equal)."""
    head = ["| attribute | | where it is honoured, or why it is refused |", "|---|---|---|"]
    parts: list[tuple[str, dict[str, Honoured] | dict[str, Honoured | Refused]]] = [
        ("`DAG(...)`", DAG_ATTRIBUTES),
        ("`BaseOperator(...)` (operators, `@task`, through `default_args` too)", TASK_ATTRIBUTES),
        (
            "set by Airflow on a task (`@setup`, `@teardown`, `.as_setup()`)",
            AIRFLOW_SET_TASK_ATTRIBUTES,
        ),
        ("timetables (a refused one is refused whole)", TIMETABLES),
        ("parameters of the honoured timetables", TIMETABLE_PARAMETERS),
    ]
    return "\n\n".join(
        "\n".join([f"{title}:", "", *head, *_rows(entries)]) for title, entries in parts
    )
