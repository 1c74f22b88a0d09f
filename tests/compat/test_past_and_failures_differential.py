"""depends_on_past against Airflow 3.3.2's own `PrevDagrunDep` (issue 39), and
max_consecutive_failed_dag_runs against its `DagRun._check_last_n_dagruns_failed`: the same
scenarios (a Dag's flags, its runs by logical date and type, its TIs' states) played by
Airflow's code on its own database (`airflow_prev_dagrun_driver.py`, the Airflow virtualenv's
python) and by the service's evaluation; per scenario, whether the asked TI's past lets it run
must agree.

The asked TI is a root (no upstream: its trigger rule is met), so on the service's side it is
queued exactly when its past passes. Airflow's "absent" TI (deleted) is a task its run did not
have, as after a Dag gained the task. A "consecutive" scenario's runs have a run_after and a
state; the question is whether the Dag is paused after its last run failed. A "timeout" scenario
(dagrun_timeout) is one run running since some time ago with its TIs' states; the answer is the
run's state and its skipped TIs after Airflow's scheduler (`_schedule_dag_run`) or the
service's run-timeouts pass looked at it, both at the real clock."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path

import pytest
from django.db.models import F
from django.db.models.functions import Greatest
from django.utils import timezone

from assets_app.definitions import sync as definitions
from assets_app.models import Dag, DagRun, TaskInstance, TIState
from assets_app.scheduling import dependencies, runs, timeouts
from assets_app.sql import dependencies as dependencies_sql
from assets_app.sql import timeouts as timeouts_sql
from tests.compat.airflow_worker_env import sdk_python

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

DRIVER = Path(__file__).with_name("airflow_prev_dagrun_driver.py")
START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

PAST = [{"task_id": "a", "depends_on_past": True}]
WAIT = [{"task_id": "a", "wait_for_downstream": True}, {"task_id": "b", "upstream": ["a"]}]
WAIT += [{"task_id": "c", "upstream": ["b"]}]
FIRST = [{"task_id": "a", "depends_on_past": True, "ignore_first_depends_on_past": True}]
TWO = [{"day": 0}, {"day": 1}]


def scenario(tasks, run_list, states, ask="1.a", **dag) -> dict:
    return {"tasks": tasks, "runs": run_list, "states": states, "ask": ask, **dag}


SCENARIOS: dict[str, dict] = {
    "prev_success": scenario(PAST, TWO, {"0.a": "success"}),
    "prev_skipped": scenario(PAST, TWO, {"0.a": "skipped"}),
    "prev_failed": scenario(PAST, TWO, {"0.a": "failed"}),
    "prev_running": scenario(PAST, TWO, {"0.a": "running"}),
    "prev_upstream_failed": scenario(PAST, TWO, {"0.a": "upstream_failed"}),
    "prev_none": scenario(PAST, TWO, {}),
    "first_run": scenario(PAST, [{"day": 0}], {}, ask="0.a"),
    "prev_by_logical_date": scenario(
        PAST, [{"day": 5}, {"day": 1}, {"day": 3}], {"0.a": "failed", "1.a": "success"}, "2.a"
    ),
    "later_run_failed_does_not_count": scenario(
        PAST, [{"day": 5}, {"day": 1}], {"0.a": "failed"}, "1.a"
    ),
    "no_logical_date": scenario(PAST, [{"day": 0}, {"day": None}], {"0.a": "failed"}),
    "wait_downstream_running": scenario(WAIT, TWO, {"0.a": "success", "0.b": "running"}),
    "wait_downstream_done": scenario(
        WAIT, TWO, {"0.a": "success", "0.b": "success", "0.c": "failed"}
    ),
    "wait_downstream_skipped": scenario(WAIT, TWO, {"0.a": "success", "0.b": "skipped"}),
    "catchup_skips_manual_prev": scenario(
        PAST,
        [{"day": 0, "run_type": "scheduled"}, {"day": 1}, {"day": 2, "run_type": "scheduled"}],
        {"0.a": "failed", "1.a": "success"},
        "2.a",
        catchup=True,
    ),
    "no_catchup_manual_prev_counts": scenario(
        PAST,
        [{"day": 0, "run_type": "scheduled"}, {"day": 1}, {"day": 2, "run_type": "scheduled"}],
        {"0.a": "failed", "1.a": "success"},
        "2.a",
    ),
    "prev_without_the_task": scenario(PAST, TWO, {"0.a": "absent"}),
    "ignore_first_prev_without_the_task": scenario(FIRST, TWO, {"0.a": "absent"}),
    "ignore_first_an_earlier_ti": scenario(
        FIRST, [{"day": 0}, {"day": 1}, {"day": 2}], {"0.a": "success", "1.a": "absent"}, "2.a"
    ),
}


def consecutive(limit: int, *runs: tuple[int, str]) -> dict:
    """Runs (minute of run_after, state) in creation order; the last one just failed."""
    return {
        "kind": "consecutive",
        "tasks": [{"task_id": "a"}],
        "limit": limit,
        "runs": [{"minute": minute, "state": state} for minute, state in runs],
    }


SCENARIOS.update(
    {
        "three_failed": consecutive(3, (0, "failed"), (1, "failed"), (2, "failed")),
        "two_of_three": consecutive(3, (0, "failed"), (1, "failed")),
        "success_between": consecutive(2, (0, "failed"), (1, "success"), (2, "failed")),
        "older_success_outside": consecutive(2, (0, "success"), (1, "failed"), (2, "failed")),
        "by_run_after": consecutive(2, (5, "success"), (0, "failed"), (1, "failed")),
        "a_newer_running_run": consecutive(2, (0, "failed"), (9, "running"), (1, "failed")),
        "same_run_after_by_id": consecutive(2, (0, "success"), (1, "failed"), (1, "failed")),
    }
)


TIMEOUT_TASKS = [
    {"task_id": "a"},
    {"task_id": "b"},
    {"task_id": "c", "upstream": ["a"]},
    {"task_id": "d"},
    {"task_id": "e"},
]
TIMEOUT_STATES = {"a": "running", "b": "success", "d": "up_for_retry", "e": "failed"}


def timeout(seconds: float | None, started_ago: float) -> dict:
    return {
        "kind": "timeout",
        "tasks": TIMEOUT_TASKS,
        "timeout_seconds": seconds,
        "started_ago": started_ago,
        "states": TIMEOUT_STATES,
    }


SCENARIOS.update(
    {
        "timed_out": timeout(3600, 7200),
        "in_time": timeout(3600, 600),
        "no_timeout": timeout(None, 10 * 86400),
    }
)


@pytest.fixture(scope="module")
def airflow_answers(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("prev_dagrun")
    scenarios, out = folder / "scenarios.json", folder / "airflow.json"
    scenarios.write_text(json.dumps(SCENARIOS))
    done = subprocess.run(
        [str(sdk_python()), str(DRIVER), str(scenarios), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    return json.loads(out.read_text())


def _service_consecutive(name: str, doc: dict) -> bool:
    dag = {"dag_id": name, "is_paused": False, "tasks": doc["tasks"]}
    dag["max_consecutive_failed_dag_runs"] = doc["limit"]
    definitions.sync_definitions(dags=definitions.parse_text(json.dumps(dag), file=name))
    for run in doc["runs"]:
        made = runs.trigger_dag(dag_id=name, run_after=START + dt.timedelta(minutes=run["minute"]))
        DagRun.objects.filter(pk=made.pk).update(state=run["state"])
    dependencies_sql.pause_after_consecutive_failures(dag_id=name, now=START)
    return Dag.objects.get(dag_id=name).is_paused


def _service_timeout(name: str, doc: dict) -> dict:
    dag = {"dag_id": name, "is_paused": False, "tasks": doc["tasks"]}
    if doc["timeout_seconds"] is not None:
        dag["dagrun_timeout_seconds"] = doc["timeout_seconds"]
    definitions.sync_definitions(dags=definitions.parse_text(json.dumps(dag), file=name))
    run = runs.trigger_dag(dag_id=name)
    for task_id, state in doc["states"].items():
        # A TI that ran is at try 1 or more (ti_try_counted_once_queued): one created waiting
        # is at try 0 until it is queued.
        TaskInstance.objects.filter(dag_run=run, task_id=task_id).update(
            state=state, try_number=Greatest(F("try_number"), 1)
        )
    now = timezone.now()
    started = now - dt.timedelta(seconds=doc["started_ago"])
    timeouts_sql.mark_run_running(dag_run_id=run.pk, now=started)
    timeouts.time_out_due_runs(now=now)
    run.refresh_from_db()
    skipped = TaskInstance.objects.filter(dag_run=run, state=TIState.SKIPPED)
    return {"run": run.state, "skipped": sorted(skipped.values_list("task_id", flat=True))}


def _service_answer(name: str, doc: dict):
    if doc.get("kind") == "consecutive":
        return _service_consecutive(name, doc)
    if doc.get("kind") == "timeout":
        return _service_timeout(name, doc)
    dag = {"dag_id": name, "is_paused": False, "tasks": doc["tasks"]}
    dag["catchup"] = doc.get("catchup", False)
    definitions.sync_definitions(dags=definitions.parse_text(json.dumps(dag), file=name))
    made: list[DagRun] = []
    for run in doc["runs"]:
        day = run["day"]
        made.append(
            runs.trigger_dag(
                dag_id=name,
                logical_date=None if day is None else START + dt.timedelta(days=day),
                run_type=run.get("run_type", "manual"),
            )
        )
    for key, state in doc["states"].items():
        index, task_id = key.split(".")
        tis = TaskInstance.objects.filter(dag_run=made[int(index)], task_id=task_id)
        if state == "absent":
            tis.delete()
        else:
            tis.update(state=state, try_number=Greatest(F("try_number"), 1))
    index, task_id = doc["ask"].split(".")
    asked = TaskInstance.objects.filter(dag_run=made[int(index)], task_id=task_id)
    asked.update(state=TIState.SCHEDULED)
    dependencies.evaluate(dag_run_id=made[int(index)].pk, finished_task_ids=None)
    return asked.get().state == TIState.QUEUED


@pytest.mark.django_db
def test_the_service_decides_depends_on_past_as_airflow(airflow_answers):
    assert set(airflow_answers) == set(SCENARIOS)
    service = {name: _service_answer(name, doc) for name, doc in SCENARIOS.items()}
    differences = {
        name: {"airflow": airflow_answers[name], "service": service[name]}
        for name in SCENARIOS
        if airflow_answers[name] != service[name]
    }
    assert differences == {}
    # The scenarios cover both answers, and a run that timed out.
    assert {airflow_answers[name] for name in SCENARIOS if "kind" not in SCENARIOS[name]} == {
        True,
        False,
    }
    assert airflow_answers["timed_out"] == {"run": "failed", "skipped": ["a", "c", "d"]}
