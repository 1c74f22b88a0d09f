"""Dag params (issue 39) against the pinned Airflow: the same DAG file's params, converted by the
worker and synced, accept or refuse each manual run's conf exactly as Airflow 3.3.2 does, with
its words (`SerializedDAG.params.deep_merge(conf).validate()`, what its `create_dagrun` runs
on every trigger), and a scheduled Dag whose params need a conf is refused as Airflow refuses
it."""

import json
import subprocess

import pytest

from assets_app.definitions import sync as definitions
from assets_app.guards import exceptions
from assets_app.models import Dag, DagRun
from assets_app.scheduling import runs
from tests.compat.airflow_worker_env import ROOT, sdk_python
from tests.compat.test_dag_files import _convert

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

_FILE = """
import pendulum
from airflow.sdk import DAG, Param
from airflow.providers.standard.operators.empty import EmptyOperator

with DAG(
    dag_id="with_params",
    schedule=None,
    params={
        "day": Param(type="string", format="date", description="which day"),
        "count": Param(5, type="integer", minimum=3, maximum=9),
        "mode": Param("fast", enum=["fast", "slow"]),
        "plain": 7,
        "maybe": Param(None, type=["null", "string"]),
        "items": Param([1], type="array", items={"type": "integer"}, minItems=1),
    },
):
    EmptyOperator(task_id="t")
"""

# Each conf a manual run might bring: accepted or refused, Airflow decides.
CONFS = [
    None,
    {},
    {"day": "2026-12-07"},
    {"day": "07/12/2026"},
    {"day": 20261207},
    {"day": "2026-12-07", "count": 2},
    {"day": "2026-12-07", "count": 10},
    {"day": "2026-12-07", "count": "5"},
    {"day": "2026-12-07", "mode": "medium"},
    {"day": "2026-12-07", "plain": {"any": "thing"}},
    {"day": "2026-12-07", "maybe": 3},
    {"day": "2026-12-07", "maybe": "x", "extra": [1, 2]},
    {"day": "2026-12-07", "items": []},
    {"day": "2026-12-07", "items": [1, "2"]},
]

_AIRFLOW = """
import json, sys
from pathlib import Path
from airflow.dag_processing.dagbag import DagBag
from airflow.serialization.serialized_objects import DagSerialization

bag = DagBag(dag_folder=sys.argv[1], bundle_path=Path(sys.argv[1]))
dag = DagSerialization.from_dict(DagSerialization.to_dict(bag.dags["with_params"]))
verdicts = []
for conf in json.loads(sys.argv[2]):
    try:
        dag.params.deep_merge(conf).validate()
        verdicts.append(None)
    except ValueError as exc:
        verdicts.append(str(exc))
print(json.dumps(verdicts))
"""


def _airflow_verdicts(folder) -> list[str | None]:
    done = subprocess.run(
        [str(sdk_python()), "-c", _AIRFLOW, str(folder), json.dumps(CONFS)],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "AIRFLOW_HOME": str(folder / ".airflow"), "PATH": "/usr/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def synced_file(tmp_path):
    (tmp_path / "with_params.py").write_text(_FILE)
    converted = _convert(tmp_path)
    assert converted.pop("import_errors") == {}
    definitions.sync_documents(documents=[("with_params.py", converted["with_params.py"])])
    Dag.objects.filter(dag_id="with_params").update(is_paused=False)
    return tmp_path


@pytest.mark.django_db(transaction=True)
def test_a_manual_runs_conf_is_accepted_or_refused_as_airflow_does(synced_file):
    airflow = _airflow_verdicts(synced_file)
    assert airflow.count(None) >= 3 and len(set(airflow)) > 8  # Airflow judged, and differently
    ours = []
    for conf in CONFS:
        try:
            run = runs.trigger_dag(dag_id="with_params", conf=conf)
        except exceptions.BadRequest as exc:
            assert exc.reason == "value_error"
            ours.append(exc.message)
        else:
            assert run.conf == (conf or {})  # stored as given, defaults not merged in
            ours.append(None)
    assert ours == airflow
    # Nothing written for a refused conf: one run per accepted one.
    assert DagRun.objects.filter(dag_id="with_params").count() == airflow.count(None)


_SCHEDULED = """
import pendulum
from airflow.sdk import DAG, Param
from airflow.providers.standard.operators.empty import EmptyOperator

with DAG(dag_id="{dag_id}", schedule={schedule}, start_date=pendulum.datetime(2026, 1, 1),
         params={{"day": Param({default}type="string")}}):
    EmptyOperator(task_id="t")
"""


def test_a_scheduled_dag_needing_a_conf_is_refused_on_both_doors(tmp_path):
    for dag_id, schedule, default in [
        ("daily_needs_day", "'@daily'", ""),
        ("daily_has_day", "'@daily'", "'monday', "),
        ("manual_needs_day", "None", ""),
    ]:
        (tmp_path / f"{dag_id}.py").write_text(
            _SCHEDULED.format(dag_id=dag_id, schedule=schedule, default=default)
        )
    converted = _convert(tmp_path)
    errors = converted.pop("import_errors")
    # Airflow's own Dag refuses it while the file is parsed: the file's import error.
    assert list(errors) == ["daily_needs_day.py"]
    assert (
        "Dag 'daily_needs_day' is not allowed to define a Schedule, as there are required "
        "params without default values, or the default values are not valid."
    ) in errors["daily_needs_day.py"]
    # The JSON door says the same of the same definition with the default taken out.
    has_day = converted["daily_has_day.py"][0]
    del has_day["params"]["day"]["default"]
    with pytest.raises(definitions.DefinitionError) as refused:
        definitions.parse_document(has_day, file="daily.json")
    assert "is not allowed to define a Schedule" in refused.value.message
    manual = definitions.parse_document(converted["manual_needs_day.py"], file="m.json")
    assert [d.dag_id for d in manual] == ["manual_needs_day"]
