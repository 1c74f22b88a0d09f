"""Issue 42's deferral acceptance: a Dag file with a deferrable `TimeDeltaSensor` and a
`DateTimeSensorAsync`, run by the stock Task SDK worker (`bin/airflow-worker`) with a triggerer
beside it (`bin/airflow-worker --triggerer`), defers both sensors, resumes them in their
`execute_complete` when their triggers fire, and succeeds. Before, the service answered the
`deferred` state with 422 and the TIs stayed running until the heartbeat sweep failed them.

The second test SIGKILLs the triggerer while both triggers wait: a second triggerer claims them
once the first one's lease has ended (TRIGGER_LEASE_SECONDS, 3 s here) and the run succeeds."""

import os
import signal
import subprocess
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command

from assets_app.models import DagRun, TaskInstance, Trigger, XCom
from tests.compat.airflow_worker_env import start, stop, synced_dag_folder, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
# The module's one service (module_web, tests/compat/conftest.py): a triggerer's lease of 3 s, so
# a killed triggerer's triggers are claimed again soon.
SERVICE_ENV = {"TRIGGER_LEASE_SECONDS": "3"}

DAG = textwrap.dedent(
    """
    from datetime import timedelta

    from airflow.providers.standard.sensors.date_time import DateTimeSensorAsync
    from airflow.providers.standard.sensors.time_delta import TimeDeltaSensor
    from airflow.sdk import dag, task

    @dag(dag_id="deferring", schedule=None, is_paused_upon_creation=False)
    def deferring():
        delta = TimeDeltaSensor(
            task_id="wait_delta", delta=timedelta(seconds=DELTA), deferrable=True
        )
        until = DateTimeSensorAsync(
            task_id="wait_until",
            target_time="{{ (dag_run.run_after + macros.timedelta(seconds=DELTA)).isoformat() }}",
        )

        # Ended by its trigger (end_from_trigger): no worker resumes it.
        ended = DateTimeSensorAsync(
            task_id="wait_end",
            target_time="{{ (dag_run.run_after + macros.timedelta(seconds=DELTA)).isoformat() }}",
            end_from_trigger=True,
        )

        @task
        def after(ti=None):
            return "both waited"

        [delta, until, ended] >> after()

    deferring()
    """
)


def _states(run: DagRun) -> dict[str, str]:
    return dict(TaskInstance.objects.filter(dag_run=run).values_list("task_id", "state"))


def _deferred_or_early_end(run: DagRun) -> bool:
    """All three sensors deferred; a sensor that ended without deferring (it started after its
    target time: DELTA too short for this machine) fails the test at once."""
    states = _states(run)
    early = [t for t in ("wait_delta", "wait_until", "wait_end") if states.get(t) == "success"]
    assert not early, f"{early} ended without deferring (their target time passed first)"
    return list(states.values()).count("deferred") == 3


def _run_deferring_dag(web, tmp_path, *, delta: int, kill_first_triggerer: bool) -> dict:
    dag_id = f"deferring_{delta}"
    text = DAG.replace("DELTA", str(delta)).replace('"deferring"', f'"{dag_id}"')
    base, env = synced_dag_folder(
        tmp_path, web.url, {f"{dag_id}.py": text}, worker_key=settings.WORKER_API_KEY
    )
    logs = [tmp_path / "worker.log", tmp_path / "triggerer-1.log", tmp_path / "triggerer-2.log"]
    # Concurrency 3: the three sensors start together, well before their target time.
    worker = start([*base, "--no-sync", "--concurrency", "3"], env, logs[0])
    triggerer = start([*base, "--triggerer"], env, logs[1])
    processes = [worker, triggerer]
    try:
        # Trigger once the worker and the triggerer are ready to claim, so the sensors start
        # well before their target time and defer (a sensor started after it returns at once).
        wait_for(
            lambda: all("claiming" in p.read_text() for p in logs[:2]),
            seconds=300,
            what="the worker's and the triggerer's start",
            logs=logs,
        )
        call_command("trigger_dag", dag_id)
        run = DagRun.objects.get(dag_id=dag_id)
        wait_for(
            lambda: _deferred_or_early_end(run),
            seconds=300,
            what="the three sensors deferred",
            logs=logs,
        )
        deferred = {
            ti.task_id: (ti.next_method, ti.start_date)
            for ti in TaskInstance.objects.filter(dag_run=run, state="deferred")
        }
        if kill_first_triggerer:
            wait_for(
                lambda: Trigger.objects.exclude(claimed_by="").count() == 3,
                seconds=120,
                what="the three triggers claimed",
                logs=logs,
            )
            os.killpg(triggerer.pid, signal.SIGKILL)
            triggerer.wait()
            processes.append(start([*base, "--triggerer"], env, logs[2]))
        wait_for(
            lambda: _states(run).get("after") in ("success", "failed", "upstream_failed"),
            seconds=600,
            what="the run's end",
            logs=logs,
        )
        return {
            "run": run,
            "moment": run.run_after + timedelta(seconds=delta),
            "deferred": deferred,
            "states": _states(run),
            "tis": {ti.task_id: ti for ti in TaskInstance.objects.filter(dag_run=run)},
            "logs": {p.name: p.read_text() for p in logs if p.exists()},
        }
    finally:
        for process in processes:
            stop(process)


@pytest.mark.timeout(1500)
def test_deferrable_sensors_resume_and_succeed(module_web, tmp_path):
    result = _run_deferring_dag(module_web, tmp_path, delta=10, kill_first_triggerer=False)

    assert result["states"] == {
        "wait_delta": "success",
        "wait_until": "success",
        "wait_end": "success",
        "after": "success",
    }, result["logs"]
    assert result["deferred"].keys() == {"wait_delta", "wait_until", "wait_end"}
    assert {m for m, _ in result["deferred"].values()} == {"execute_complete"}
    for task_id in ("wait_delta", "wait_until"):
        ti = result["tis"][task_id]
        # Resumed in the same try, its first start kept (Airflow's ti_run on a resume).
        assert ti.try_number == 1
        assert ti.start_date == result["deferred"][task_id][1]
    # Each sensor ended after its trigger's moment, not before.
    for task_id in ("wait_delta", "wait_until", "wait_end"):
        assert result["tis"][task_id].end_date >= result["moment"], result["logs"]
    assert result["logs"]["triggerer-1.log"].count(" fired: ") == 2
    assert result["logs"]["triggerer-1.log"].count(" ended its task: ") == 1
    # The trigger ended wait_end: no worker ran it a second time.
    assert result["logs"]["worker.log"].count("deferring_10.wait_end try 1 ended") == 1
    run = result["run"]
    assert (
        XCom.objects.get(run_id=run.run_id, task_id="after", key="return_value").value
        == "both waited"
    )


@pytest.mark.timeout(1500)
def test_a_killed_triggerer_loses_no_trigger(module_web, tmp_path):
    result = _run_deferring_dag(module_web, tmp_path, delta=15, kill_first_triggerer=True)

    assert result["states"] == {
        "wait_delta": "success",
        "wait_until": "success",
        "wait_end": "success",
        "after": "success",
    }, result["logs"]
    assert " fired: " not in result["logs"]["triggerer-1.log"]
    assert result["logs"]["triggerer-2.log"].count(" fired: ") == 2
    for task_id in ("wait_delta", "wait_until", "wait_end"):
        assert result["tis"][task_id].end_date >= result["moment"], result["logs"]


SERIALIZE_KWARGS = (
    "import json, sys, pendulum\n"
    "from airflow.sdk.serde import serialize\n"
    "moment = pendulum.parse(sys.argv[1])\n"
    "print(json.dumps(serialize({'moment': moment, 'end_from_trigger': False})))\n"
)


@pytest.mark.timeout(1500)
def test_200_deferred_tis_wait_in_one_triggerer(module_web, tmp_path):
    """Issue 42's acceptance: 200 deferred TIs' triggers wait in one triggerer process (one
    event loop) and all fire; each TI is queued again with its event. The triggerer starts
    first (its start is not spent inside the triggers' wait), the 200 TIs are made beside it;
    their moment leaves 20 s for the kwargs, the 200 deferrals and the claim."""
    from django.utils import timezone

    from assets_app.task_state import deferral
    from tests.compat.airflow_worker_env import sdk_python
    from tests.factories import DagRunFactory, TaskInstanceFactory

    env = {
        **os.environ,
        "WORKER_API_KEY": settings.WORKER_API_KEY,
        "AIRFLOW_HOME": str(tmp_path / "airflow-home"),
    }
    log = tmp_path / "triggerer.log"
    dags = tmp_path / "dags"
    dags.mkdir()
    argv = [str(ROOT / "bin/airflow-worker"), "--dags", str(dags), "--url", module_web.url]
    triggerer = start([*argv, "--triggerer"], env, log)
    try:
        run = DagRunFactory()
        tis = [
            TaskInstanceFactory(dag_run=run, task_id="wait", map_index=i, running=True)
            for i in range(200)
        ]
        moment = timezone.now() + timedelta(seconds=20)
        kwargs = subprocess.run(
            [str(sdk_python()), "-c", SERIALIZE_KWARGS, moment.isoformat()],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        for ti in tis:
            deferral.defer(
                ti_id=ti.id,
                try_number=ti.try_number,
                classpath="airflow.providers.standard.triggers.temporal.DateTimeTrigger",
                trigger_kwargs=kwargs,
                trigger_timeout=None,
                queue=None,
                next_method="execute_complete",
                next_kwargs={},
            )
        wait_for(
            lambda: Trigger.objects.exclude(claimed_by="").count() == 200,
            seconds=300,
            what="200 triggers claimed",
            logs=[log],
        )
        # All 200 are held by the one process before the first fires.
        assert timezone.now() < moment, log.read_text()[-3000:]
        assert len(set(Trigger.objects.values_list("claimed_by", flat=True))) == 1
        resumed = TaskInstance.objects.filter(dag_run=run)
        wait_for(
            lambda: not resumed.exclude(state="queued").exists(),
            seconds=300,
            what="200 TIs queued again",
            logs=[log],
        )
    finally:
        stop(triggerer)

    text = log.read_text()
    assert text.count(" fired: ") == 200, text[-3000:]
    for failure in (" raised ", " could not be built", " without sending an event", " refused "):
        assert failure not in text, text[-3000:]
    assert all(ti.next_kwargs["event"] is not None for ti in resumed)
    # Each TI was queued again once its moment had come, not before.
    assert min(ti.queued_at for ti in resumed) >= moment


PARENT_AND_CHILD = textwrap.dedent(
    """
    from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
    from airflow.sdk import dag, task

    @dag(dag_id="deferring_child", schedule=None, is_paused_upon_creation=False)
    def deferring_child():
        @task
        def work():
            return "child done"

        work()

    @dag(dag_id="deferring_parent", schedule=None, is_paused_upon_creation=False)
    def deferring_parent():
        TriggerDagRunOperator(
            task_id="trigger_child",
            trigger_dag_id="deferring_child",
            wait_for_completion=True,
            deferrable=True,
            poke_interval=2,
        )

    deferring_child()
    deferring_parent()
    """
)


@pytest.mark.timeout(1500)
def test_a_trigger_reading_the_execution_api_resumes_its_task(module_web, tmp_path):
    """`TriggerDagRunOperator(wait_for_completion=True, deferrable=True)` defers on a
    `DagStateTrigger`, which polls the child run's count and state through the Task SDK's
    `RuntimeTaskInstance` (served here over HTTP with the claim's task token, as Airflow's
    triggerer supervisor serves them); the parent resumes once the child run succeeded."""
    base, env = synced_dag_folder(
        tmp_path,
        module_web.url,
        {"parent_and_child.py": PARENT_AND_CHILD},
        worker_key=settings.WORKER_API_KEY,
    )
    logs = [tmp_path / "worker.log", tmp_path / "triggerer.log"]
    processes = [
        start([*base, "--no-sync", "--concurrency", "2"], env, logs[0]),
        start([*base, "--triggerer"], env, logs[1]),
    ]
    try:
        call_command("trigger_dag", "deferring_parent")
        parent = DagRun.objects.get(dag_id="deferring_parent")
        wait_for(
            lambda: _states(parent).get("trigger_child") in ("success", "failed"),
            seconds=600,
            what="the parent's end",
            logs=logs,
        )
    finally:
        for process in processes:
            stop(process)

    text = {p.name: p.read_text() for p in logs}
    assert _states(parent) == {"trigger_child": "success"}, text
    child = DagRun.objects.get(dag_id="deferring_child")
    assert child.state == "success"
    assert "DagStateTrigger" in text["triggerer.log"] and " fired: " in text["triggerer.log"]
    ti = TaskInstance.objects.get(dag_run=parent)
    assert ti.try_number == 1


STANDARD_EXAMPLES = ROOT / (
    ".venv-airflow-worker/lib/python3.11/site-packages/airflow/providers/standard/example_dags"
)


@pytest.mark.timeout(1500)
def test_airflows_example_external_task_sensor_defers_and_succeeds(module_web, servers, tmp_path):
    """Airflow's own `example_external_task`: its deferrable `ExternalTaskSensor` defers on a
    `WorkflowTrigger`, which counts `child_dag`'s TIs through the execution API from the
    triggerer, fires once `child_dag`'s `@once` run succeeded, and the sensor resumes and
    succeeds. (Its `TriggerDagRunOperator` with `reset_dag_run=True` and the logical date of
    `child_dag`'s existing scheduled run fails here on a 404 of its clear of
    `manual__2022-01-01...`: not a deferral matter, so this test asserts the sensor only.)

    One change to the files as shipped: the sensor pokes every 2 s, not BaseSensorOperator's
    default 60 (its first poke comes before `child_task`'s 6 s of sleeps end, and the next one
    a minute later was most of this test's time). The trigger still waits: the sensor deferred
    before `child_task` succeeded and resumed after it."""
    from assets_app.models import Dag
    from assets_app.sql import wakeups

    servers("timers")
    files = {
        f"{name}.py": (STANDARD_EXAMPLES / f"{name}.py").read_text()
        for name in (f"example_external_task_{kind}_deferrable" for kind in ("parent", "child"))
    }
    parent = "example_external_task_parent_deferrable.py"
    assert files[parent].count("deferrable=True,\n") == 1
    files[parent] = files[parent].replace(
        "deferrable=True,\n", "deferrable=True, poke_interval=2,\n"
    )
    base, env = synced_dag_folder(
        tmp_path, module_web.url, files, worker_key=settings.WORKER_API_KEY
    )
    logs = [tmp_path / "worker.log", tmp_path / "triggerer.log"]
    processes = [
        start([*base, "--no-sync", "--concurrency", "4"], env, logs[0]),
        start([*base, "--triggerer"], env, logs[1]),
    ]
    try:
        Dag.objects.filter(dag_id__in=["example_external_task", "child_dag"]).update(
            is_paused=False
        )
        wakeups.wake(wakeups.TIME)
        wait_for(
            lambda: TaskInstance.objects.filter(
                dag_id="example_external_task",
                task_id="parent_task_sensor",
                state__in=["success", "failed", "upstream_failed", "skipped"],
            ).exists(),
            seconds=900,
            what="the sensor's end",
            logs=logs,
        )
    finally:
        for process in processes:
            stop(process)
    text = {p.name: p.read_text()[-4000:] for p in logs}
    sensor = TaskInstance.objects.get(dag_id="example_external_task", task_id="parent_task_sensor")
    assert (sensor.state, sensor.try_number) == ("success", 1), text
    assert "WorkflowTrigger" in text["triggerer.log"], text
    assert "fired: TriggerEvent<{'status': 'success'}>" in text["triggerer.log"], text
    assert DagRun.objects.get(dag_id="child_dag").state == "success"
    child = TaskInstance.objects.get(dag_id="child_dag", task_id="child_task")
    assert sensor.start_date < child.end_date <= sensor.end_date
