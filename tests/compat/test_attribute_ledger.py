"""The attribute ledger (`airflow_worker.ledger`, issue 39) against the pinned Airflow: every
parameter of its `DAG`, `BaseOperator` and timetables is honoured or refused, and a DAG file
that sets a refused one to anything but Airflow's default is an import error of that file,
naming the file, Dag, task and attribute (through the worker's own `parse_folder`)."""

import json
import subprocess

import pytest

from airflow_worker import ledger
from tests.compat.airflow_worker_env import ROOT, sdk_python
from tests.compat.test_dag_files import _convert

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

_SIGNATURES = """
import importlib, inspect, json, pkgutil
import airflow.sdk.definitions.timetables as sdk_timetables
import airflow.timetables as core_timetables
from airflow.sdk import DAG, BaseOperator

def parameters(function):
    return sorted(
        name for name, p in inspect.signature(function).parameters.items()
        if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    )

timetables = {}
for package in (sdk_timetables, core_timetables):
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for name, cls in vars(module).items():
            bases = {base.__name__ for base in getattr(cls, "__mro__", ())}
            if (
                inspect.isclass(cls) and cls.__module__ == module.__name__
                and not name.startswith("_") and name != "Timetable"
                and bases & {"BaseTimetable", "Timetable"}
            ):
                timetables.setdefault(name, set()).update(parameters(cls.__init__))
print(json.dumps({
    "dag": parameters(DAG.__init__),
    "task": parameters(BaseOperator.__init__),
    "timetables": {name: sorted(found) for name, found in timetables.items()},
}))
"""


@pytest.fixture(scope="module")
def signatures(tmp_path_factory):
    home = tmp_path_factory.mktemp("airflow-home")
    done = subprocess.run(
        [str(sdk_python()), "-c", _SIGNATURES],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "AIRFLOW_HOME": str(home), "PATH": "/usr/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_dag_parameter_is_honoured_or_refused(signatures):
    assert len(signatures["dag"]) > 30  # the signature was read, not an empty stand-in
    missing = sorted(set(signatures["dag"]) - set(ledger.DAG_ATTRIBUTES))
    assert missing == [], f"DAG parameters in neither list of airflow_worker/ledger.py: {missing}"
    stale = sorted(set(ledger.DAG_ATTRIBUTES) - set(signatures["dag"]))
    assert stale == [], f"not parameters of the pinned DAG: {stale}"


def test_every_operator_parameter_is_honoured_or_refused(signatures):
    assert len(signatures["task"]) > 50
    missing = sorted(set(signatures["task"]) - set(ledger.TASK_ATTRIBUTES))
    assert missing == [], f"BaseOperator parameters in neither list: {missing}"
    stale = sorted(set(ledger.TASK_ATTRIBUTES) - set(signatures["task"]))
    assert stale == [], f"not parameters of the pinned BaseOperator: {stale}"


def test_every_timetable_and_its_parameters_are_honoured_or_refused(signatures):
    timetables = signatures["timetables"]
    assert {"CronTriggerTimetable", "EventsTimetable", "AssetOrTimeSchedule"} <= set(timetables)
    missing = sorted(set(timetables) - set(ledger.TIMETABLES))
    assert missing == [], f"timetables in neither list: {missing}"
    for name, parameters in timetables.items():
        if isinstance(ledger.TIMETABLES[name], ledger.Honoured):
            unknown = sorted(set(parameters) - set(ledger.TIMETABLE_PARAMETERS))
            assert unknown == [], f"{name}: parameters in neither list: {unknown}"


# attribute -> (the DAG's keyword arguments, the task's), each a value other than Airflow's
# default; or the whole body of the `with DAG(...)` block.
START = "pendulum.datetime(2026, 1, 1, tz='UTC')"
REFUSED: dict[str, tuple[str, str]] = {
    "deadline": (
        "deadline=DeadlineAlert(reference=DeadlineReference.DAGRUN_QUEUED_AT, "
        "interval=datetime.timedelta(hours=1), callback=AsyncCallback(notify))",
        "",
    ),
    "access_control": ("access_control={'Op': {'DAGs': {'can_read'}}}", ""),
    "start_date": ("", "start_date=pendulum.datetime(2026, 6, 1, tz='UTC')"),
    "end_date": ("", "end_date=pendulum.datetime(2026, 6, 1, tz='UTC')"),
    "executor": ("", "executor='LocalExecutor'"),
    "executor_config": ("", "executor_config={'pod_override': 1}"),
    "resources": ("", "resources={'cpus': 2}"),
}

_FILE = """
import datetime
import pendulum
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, setup, task, teardown
from airflow.sdk.definitions.callback import AsyncCallback
from airflow.sdk.definitions.deadline import DeadlineAlert, DeadlineReference


async def notify(*args, **kwargs):
    pass


with DAG(dag_id={dag_id!r}, schedule=None, start_date={start}, {dag_kwargs}):
{body}
"""


def _body(task_kwargs: str) -> str:
    if task_kwargs == "SETUP":
        return "    setup(task(task_id='t')(lambda: None))()"
    if task_kwargs == "TEARDOWN":
        return "    teardown(task(task_id='t')(lambda: None))()"
    return f"    EmptyOperator(task_id='t', {task_kwargs})"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """One folder, one file per refused attribute (each one Dag `d_<attribute>`, task `t`),
    and files that set every refused attribute to Airflow's default, converted once."""
    folder = tmp_path_factory.mktemp("ledger")
    for attribute, (dag_kwargs, task_kwargs) in REFUSED.items():
        (folder / f"{attribute}.py").write_text(
            _FILE.format(
                dag_id=f"d_{attribute}", start=START, dag_kwargs=dag_kwargs, body=_body(task_kwargs)
            )
        )
    defaults = (
        "pool='default_pool', pool_slots=1, priority_weight=1, weight_rule='downstream', "
        "queue='default', depends_on_past=False, wait_for_downstream=False, "
        f"max_active_tis_per_dag=None, start_date={START}, executor_config={{}}, owner='airflow'"
    )
    (folder / "defaults.py").write_text(
        _FILE.format(
            dag_id="d_defaults",
            start=START,
            dag_kwargs="max_active_tasks=16, max_consecutive_failed_dag_runs=0, params={}, "
            "fail_fast=False, dagrun_timeout=None, on_success_callback=None, "
            "default_args={'retries': 1, 'queue': 'default', 'priority_weight': 1}",
            body=_body(defaults),
        )
    )
    (folder / "default_args.py").write_text(
        _FILE.format(
            dag_id="d_default_args",
            start=START,
            dag_kwargs="default_args={'executor': 'LocalExecutor'}",
            body=_body("") + "\n    EmptyOperator(task_id='u', executor=None)",
        )
    )
    (folder / "setup_teardown.py").write_text(
        _FILE.format(
            dag_id="d_setup_teardown",
            start=START,
            dag_kwargs="",
            body="    s = EmptyOperator(task_id='s')\n    w = EmptyOperator(task_id='w')\n"
            "    t = EmptyOperator(task_id='t')\n"
            "    s >> w >> t.as_teardown(setups=s, on_failure_fail_dagrun=True)",
        )
    )
    (folder / "past.py").write_text(
        _FILE.format(
            dag_id="d_past",
            start=START,
            dag_kwargs="dagrun_timeout=datetime.timedelta(hours=1), "
            "max_consecutive_failed_dag_runs=2",
            body=_body("depends_on_past=True, ignore_first_depends_on_past=True")
            + "\n    EmptyOperator(task_id='u', wait_for_downstream=True, "
            "wait_for_past_depends_before_skipping=True)",
        )
    )
    return _convert(folder)


def test_depends_on_past_wait_for_downstream_and_dagrun_timeout_are_carried(converted):
    """Issue 39; wait_for_downstream brings depends_on_past, as Airflow's operator sets it."""
    assert "past.py" not in converted["import_errors"]
    ((dag,),) = [converted["past.py"]]
    assert dag["dagrun_timeout_seconds"] == 3600.0
    assert dag["max_consecutive_failed_dag_runs"] == 2
    assert dag["tasks"] == [
        {
            "task_id": "t",
            "retries": 0,
            "depends_on_past": True,
            "ignore_first_depends_on_past": True,
        },
        {"task_id": "u", "retries": 0, "depends_on_past": True, "wait_for_downstream": True},
    ]


def test_setup_and_teardown_are_carried(converted):
    """Issue 39: `as_teardown(setups=s)` makes s a setup upstream of t, whose rule becomes
    all_done_setup_success, as Airflow's operator sets them."""
    assert "setup_teardown.py" not in converted["import_errors"]
    ((dag,),) = [converted["setup_teardown.py"]]
    assert dag["tasks"] == [
        {"task_id": "s", "retries": 0, "is_setup": True},
        {
            "task_id": "t",
            "retries": 0,
            "upstream": ["s", "w"],
            "trigger_rule": "all_done_setup_success",
            "is_teardown": True,
            "on_failure_fail_dagrun": True,
        },
        {"task_id": "w", "retries": 0, "upstream": ["s"]},
    ]


@pytest.mark.parametrize("attribute", sorted(REFUSED))
def test_a_refused_attribute_makes_its_file_an_import_error_naming_it(converted, attribute):
    assert f"{attribute}.py" not in converted  # the Dag is left out
    error = converted["import_errors"][f"{attribute}.py"]
    dag_kwargs, _ = REFUSED[attribute]
    if dag_kwargs:
        entry, task = ledger.DAG_ATTRIBUTES[attribute], ""
    else:
        entries = {**ledger.TASK_ATTRIBUTES, **ledger.AIRFLOW_SET_TASK_ATTRIBUTES}
        entry, task = entries[attribute], ", task 't'"
    assert isinstance(entry, ledger.Refused)
    assert (
        f"{attribute}.py: refused by the asset service (Dag 'd_{attribute}'{task}, "
        f"attribute {attribute!r}): {entry.reason}"
    ) in error, error


def test_airflows_defaults_set_explicitly_are_not_refused(converted):
    assert "defaults.py" not in converted["import_errors"]
    ((dag,),) = [converted["defaults.py"]]
    assert dag["dag_id"] == "d_defaults"
    assert dag["tasks"] == [{"task_id": "t", "retries": 1}]


def test_a_value_default_args_brings_is_refused_on_each_task_it_reaches(converted):
    error = converted["import_errors"]["default_args.py"]
    reason = ledger.TASK_ATTRIBUTES["executor"].reason  # type: ignore[union-attr]
    assert f"(Dag 'd_default_args', task 't', attribute 'executor'): {reason}" in error
    assert "task 'u'" not in error  # its own value is the default one
    assert "default_args.py" not in converted


def test_the_readme_shows_the_ledger():
    assert ledger.markdown() in (ROOT / "README.md").read_text()
