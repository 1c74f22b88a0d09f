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
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command

from assets_app.models import DagRun, TaskInstance, Trigger, XCom

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]

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


def _start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    # Its own process group: stopping it stops the task processes it forked too.
    return subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        start_new_session=True,
    )


def _wait_for(predicate, *, seconds: float, what: str, logs: list[Path]) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in logs if p.exists())
            raise AssertionError(f"{what} not within {seconds} s\n{tails}")
        time.sleep(0.5)


def _stop(process: subprocess.Popen) -> None:
    for signum in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=20)
            break
        except subprocess.TimeoutExpired:
            continue


def _states(run: DagRun) -> dict[str, str]:
    return dict(TaskInstance.objects.filter(dag_run=run).values_list("task_id", "state"))


def _run_deferring_dag(servers, tmp_path, *, delta: int, kill_first_triggerer: bool) -> dict:
    web = servers("gunicorn", env={"TRIGGER_LEASE_SECONDS": "3"})
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "deferring.py").write_text(DAG.replace("DELTA", str(delta)))
    env = {
        **os.environ,
        "WORKER_API_KEY": settings.WORKER_API_KEY,
        "AIRFLOW_HOME": str(tmp_path / "airflow-home"),
    }
    base = [str(ROOT / "bin/airflow-worker"), "--dags", str(dags), "--url", web.url]
    base += ["--logs", str(tmp_path / "logs")]
    synced = subprocess.run([*base, "--sync-only"], env=env, capture_output=True, text=True)
    assert synced.returncode == 0, synced.stderr[-3000:]

    logs = [tmp_path / "worker.log", tmp_path / "triggerer-1.log", tmp_path / "triggerer-2.log"]
    worker = _start([*base, "--no-sync", "--concurrency", "2"], env, logs[0])
    triggerer = _start([*base, "--triggerer"], env, logs[1])
    processes = [worker, triggerer]
    try:
        # Trigger once the worker is ready to claim, so the sensors start well before their
        # target time and defer (a sensor started after it returns at once).
        _wait_for(
            lambda: "claiming as" in logs[0].read_text(),
            seconds=300,
            what="the worker's start",
            logs=logs,
        )
        call_command("trigger_dag", "deferring")
        run = DagRun.objects.get(dag_id="deferring")
        _wait_for(
            lambda: list(_states(run).values()).count("deferred") == 3,
            seconds=300,
            what="the three sensors deferred",
            logs=logs,
        )
        deferred = {
            ti.task_id: (ti.next_method, ti.start_date)
            for ti in TaskInstance.objects.filter(dag_run=run, state="deferred")
        }
        if kill_first_triggerer:
            _wait_for(
                lambda: Trigger.objects.exclude(claimed_by="").count() == 3,
                seconds=120,
                what="the three triggers claimed",
                logs=logs,
            )
            os.killpg(triggerer.pid, signal.SIGKILL)
            triggerer.wait()
            processes.append(_start([*base, "--triggerer"], env, logs[2]))
        _wait_for(
            lambda: _states(run).get("after") in ("success", "failed", "upstream_failed"),
            seconds=600,
            what="the run's end",
            logs=logs,
        )
        return {
            "run": run,
            "deferred": deferred,
            "states": _states(run),
            "tis": {ti.task_id: ti for ti in TaskInstance.objects.filter(dag_run=run)},
            "logs": {p.name: p.read_text() for p in logs if p.exists()},
        }
    finally:
        for process in processes:
            _stop(process)


@pytest.mark.timeout(1500)
def test_deferrable_sensors_resume_and_succeed(servers, tmp_path):
    result = _run_deferring_dag(servers, tmp_path, delta=25, kill_first_triggerer=False)

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
    assert result["logs"]["triggerer-1.log"].count(" fired: ") == 2
    assert result["logs"]["triggerer-1.log"].count(" ended its task: ") == 1
    # The trigger ended wait_end: no worker ran it a second time.
    assert result["logs"]["worker.log"].count("deferring.wait_end try 1 exited") == 1
    run = result["run"]
    assert (
        XCom.objects.get(run_id=run.run_id, task_id="after", key="return_value").value
        == "both waited"
    )


@pytest.mark.timeout(1500)
def test_a_killed_triggerer_loses_no_trigger(servers, tmp_path):
    result = _run_deferring_dag(servers, tmp_path, delta=40, kill_first_triggerer=True)

    assert result["states"] == {
        "wait_delta": "success",
        "wait_until": "success",
        "wait_end": "success",
        "after": "success",
    }, result["logs"]
    assert " fired: " not in result["logs"]["triggerer-1.log"]
    assert result["logs"]["triggerer-2.log"].count(" fired: ") == 2


SERIALIZE_KWARGS = (
    "import json, sys, pendulum\n"
    "from airflow.sdk.serde import serialize\n"
    "moment = pendulum.parse(sys.argv[1])\n"
    "print(json.dumps(serialize({'moment': moment, 'end_from_trigger': False})))\n"
)


@pytest.mark.timeout(1500)
def test_200_deferred_tis_wait_in_one_triggerer(servers, tmp_path):
    """Issue 42's acceptance: 200 deferred TIs' triggers wait in one triggerer process (one
    event loop) and all fire; each TI is queued again with its event."""
    from django.utils import timezone

    from assets_app.task_state import deferral
    from tests.compat.airflow_worker_env import sdk_python
    from tests.factories import DagRunFactory, TaskInstanceFactory

    web = servers("gunicorn")
    moment = timezone.now() + timedelta(seconds=40)
    kwargs = subprocess.run(
        [str(sdk_python()), "-c", SERIALIZE_KWARGS, moment.isoformat()],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    run = DagRunFactory()
    tis = [
        TaskInstanceFactory(dag_run=run, task_id="wait", map_index=i, running=True)
        for i in range(200)
    ]
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
    env = {
        **os.environ,
        "WORKER_API_KEY": settings.WORKER_API_KEY,
        "AIRFLOW_HOME": str(tmp_path / "airflow-home"),
    }
    log = tmp_path / "triggerer.log"
    dags = tmp_path / "dags"
    dags.mkdir()
    argv = [str(ROOT / "bin/airflow-worker"), "--dags", str(dags), "--url", web.url]
    triggerer = _start([*argv, "--triggerer", "--idle-exit", "5"], env, log)
    try:
        _wait_for(
            lambda: Trigger.objects.exclude(claimed_by="").count() == 200,
            seconds=300,
            what="200 triggers claimed",
            logs=[log],
        )
        # All 200 are held by the one process before the first fires.
        assert timezone.now() < moment, log.read_text()[-3000:]
        assert len(set(Trigger.objects.values_list("claimed_by", flat=True))) == 1
        triggerer.wait(timeout=600)
    finally:
        _stop(triggerer)

    text = log.read_text()
    assert "200 triggers fired, 0 failed" in text, text[-3000:]
    resumed = TaskInstance.objects.filter(dag_run=run)
    assert set(resumed.values_list("state", flat=True)) == {"queued"}
    assert all(ti.next_kwargs["event"] is not None for ti in resumed)


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
def test_a_trigger_reading_the_execution_api_resumes_its_task(servers, tmp_path):
    """`TriggerDagRunOperator(wait_for_completion=True, deferrable=True)` defers on a
    `DagStateTrigger`, which polls the child run's count and state through the Task SDK's
    `RuntimeTaskInstance` (served here over HTTP with the claim's task token, as Airflow's
    triggerer supervisor serves them); the parent resumes once the child run succeeded."""
    web = servers("gunicorn")
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "parent_and_child.py").write_text(PARENT_AND_CHILD)
    env = {
        **os.environ,
        "WORKER_API_KEY": settings.WORKER_API_KEY,
        "AIRFLOW_HOME": str(tmp_path / "airflow-home"),
    }
    base = [str(ROOT / "bin/airflow-worker"), "--dags", str(dags), "--url", web.url]
    base += ["--logs", str(tmp_path / "logs")]
    synced = subprocess.run([*base, "--sync-only"], env=env, capture_output=True, text=True)
    assert synced.returncode == 0, synced.stderr[-3000:]
    logs = [tmp_path / "worker.log", tmp_path / "triggerer.log"]
    processes = [
        _start([*base, "--no-sync", "--concurrency", "2"], env, logs[0]),
        _start([*base, "--triggerer"], env, logs[1]),
    ]
    try:
        call_command("trigger_dag", "deferring_parent")
        parent = DagRun.objects.get(dag_id="deferring_parent")
        _wait_for(
            lambda: _states(parent).get("trigger_child") in ("success", "failed"),
            seconds=600,
            what="the parent's end",
            logs=logs,
        )
    finally:
        for process in processes:
            _stop(process)

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
def test_airflows_example_external_task_sensor_defers_and_succeeds(servers, tmp_path):
    """Airflow's own `example_external_task`: its deferrable `ExternalTaskSensor` defers on a
    `WorkflowTrigger`, which counts `child_dag`'s TIs through the execution API from the
    triggerer, fires once `child_dag`'s `@once` run succeeded, and the sensor resumes and
    succeeds. (Its `TriggerDagRunOperator` with `reset_dag_run=True` and the logical date of
    `child_dag`'s existing scheduled run fails here on a 404 of its clear of
    `manual__2022-01-01...`: not a deferral matter, so this test asserts the sensor only.)"""
    from assets_app.models import Dag
    from assets_app.sql import wakeups

    web = servers("gunicorn")
    servers("timers")
    dags = tmp_path / "dags"
    dags.mkdir()
    for kind in ("parent", "child"):
        name = f"example_external_task_{kind}_deferrable"
        (dags / f"{name}.py").write_text((STANDARD_EXAMPLES / f"{name}.py").read_text())
    env = {
        **os.environ,
        "WORKER_API_KEY": settings.WORKER_API_KEY,
        "AIRFLOW_HOME": str(tmp_path / "airflow-home"),
    }
    base = [str(ROOT / "bin/airflow-worker"), "--dags", str(dags), "--url", web.url]
    base += ["--logs", str(tmp_path / "logs")]
    synced = subprocess.run([*base, "--sync-only"], env=env, capture_output=True, text=True)
    assert synced.returncode == 0, synced.stderr[-3000:]
    logs = [tmp_path / "worker.log", tmp_path / "triggerer.log"]
    processes = [
        _start([*base, "--no-sync", "--concurrency", "4"], env, logs[0]),
        _start([*base, "--triggerer"], env, logs[1]),
    ]
    try:
        Dag.objects.filter(dag_id__in=["example_external_task", "child_dag"]).update(
            is_paused=False
        )
        wakeups.wake(wakeups.TIME)
        _wait_for(
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
            _stop(process)
    text = {p.name: p.read_text()[-4000:] for p in logs}
    sensor = TaskInstance.objects.get(dag_id="example_external_task", task_id="parent_task_sensor")
    assert (sensor.state, sensor.try_number) == ("success", 1), text
    assert "WorkflowTrigger" in text["triggerer.log"], text
    assert "fired: TriggerEvent<{'status': 'success'}>" in text["triggerer.log"], text
    assert DagRun.objects.get(dag_id="child_dag").state == "success"
