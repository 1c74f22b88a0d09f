"""Airflow 3.3.2's own `PrevDagrunDep` on scripted scenarios, for the differential test of
depends_on_past (issue 39, `test_depends_on_past_differential.py`).

Run with the Airflow virtualenv's python (never imported by the service or by pytest):
`python airflow_prev_dagrun_driver.py SCENARIOS.json OUT.json`. Airflow runs on its own metadata
database (SQLite, `airflow db migrate` in a temporary AIRFLOW_HOME). Per scenario: the Dag
processor's parse of its Dag (`update_dag_parsing_results_in_db`), its runs created with
Airflow's `create_dagrun` (logical date, run type), its TIs set to the scenario's states (an
"absent" TI deleted: a task its run did not have), and then for the asked TI whether
`PrevDagrunDep` (as the scheduler's `DagRun._get_ready_tis` asks it: a plain `DepContext`)
passes. A scenario of kind "consecutive" (max_consecutive_failed_dag_runs) has runs with a
`run_after` and a state instead, and asks whether Airflow's `DagRun._check_last_n_dagruns_failed`
(called on the last run, as `update_state` calls it when that run fails) pauses the Dag.
A scenario of kind "timeout" (dagrun_timeout) has one run, running since `started_ago`
seconds before now, with its TIs' states; the scheduler's `_schedule_dag_run` looks at it
(`SchedulerJobRunner`, the real clock) and the run's state and its TIs' are the answer.
Out: {scenario: answer}.
"""

from __future__ import annotations

import atexit
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile

HOME = tempfile.mkdtemp(prefix="airflow-prev-dagrun-")
atexit.register(shutil.rmtree, HOME, ignore_errors=True)
os.environ.update(
    AIRFLOW_HOME=HOME,
    AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{HOME}/airflow.db",
    AIRFLOW__CORE__LOAD_EXAMPLES="False",
    AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False",
    AIRFLOW__LOGGING__LOGGING_LEVEL="ERROR",
)
subprocess.run(
    [sys.executable, "-m", "airflow", "db", "migrate"], check=True, capture_output=True, text=True
)

from airflow.dag_processing.collection import update_dag_parsing_results_in_db  # noqa: E402
from airflow.models.dag import DagModel  # noqa: E402
from airflow.models.dagbundle import DagBundleModel  # noqa: E402
from airflow.models.dagrun import DagRun  # noqa: E402
from airflow.models.serialized_dag import SerializedDagModel  # noqa: E402
from airflow.models.taskinstance import TaskInstance  # noqa: E402
from airflow.providers.standard.operators.empty import EmptyOperator  # noqa: E402
from airflow.sdk import DAG  # noqa: E402
from airflow.serialization.serialized_objects import LazyDeserializedDAG  # noqa: E402
from airflow.ti_deps.dep_context import DepContext  # noqa: E402
from airflow.ti_deps.deps.prev_dagrun_dep import PrevDagrunDep  # noqa: E402
from airflow.utils.session import create_session  # noqa: E402
from airflow.utils.state import DagRunState  # noqa: E402
from airflow.utils.types import DagRunTriggeredByType, DagRunType  # noqa: E402
from sqlalchemy import delete, select, update  # noqa: E402

BUNDLE = "differential"
START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def dag_of(name: str, doc: dict) -> DAG:
    timeout = doc.get("timeout_seconds")
    with DAG(
        name,
        schedule=None,
        start_date=START,
        catchup=doc.get("catchup", False),
        dagrun_timeout=None if timeout is None else dt.timedelta(seconds=timeout),
    ) as dag:
        tasks = {
            task["task_id"]: EmptyOperator(
                task_id=task["task_id"],
                depends_on_past=task.get("depends_on_past", False),
                ignore_first_depends_on_past=task.get("ignore_first_depends_on_past", False),
                wait_for_downstream=task.get("wait_for_downstream", False),
            )
            for task in doc["tasks"]
        }
        for task in doc["tasks"]:
            for upstream in task.get("upstream", []):
                tasks[upstream] >> tasks[task["task_id"]]
    dag.relative_fileloc = f"{name}.py"  # a Dag callback request names its file
    return dag


def parse(name: str, doc: dict) -> None:
    with create_session() as session:
        if session.get(DagBundleModel, BUNDLE) is None:
            session.add(DagBundleModel(name=BUNDLE))
            session.flush()
        update_dag_parsing_results_in_db(
            BUNDLE,
            None,
            [LazyDeserializedDAG.from_dag(dag_of(name, doc))],
            {},
            None,
            set(),
            session=session,
        )


def consecutive(name: str, doc: dict) -> bool:
    parse(name, doc)
    with create_session() as session:
        dag = SerializedDagModel.get_dag(name, session=session)
        runs = [
            dag.create_dagrun(
                run_id=f"r{i}",
                run_after=START + dt.timedelta(minutes=run["minute"]),
                run_type=DagRunType.MANUAL,
                triggered_by=DagRunTriggeredByType.TEST,
                state=DagRunState(run["state"]),
                session=session,
            )
            for i, run in enumerate(doc["runs"])
        ]
        session.flush()
        runs[-1]._check_last_n_dagruns_failed(name, doc["limit"], session)
        session.flush()
        return bool(session.scalar(select(DagModel.is_paused).where(DagModel.dag_id == name)))


def timeout(name: str, doc: dict) -> dict:
    from airflow.jobs.job import Job
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner

    parse(name, doc)
    started = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=doc["started_ago"])
    with create_session() as session:
        dag = SerializedDagModel.get_dag(name, session=session)
        run = dag.create_dagrun(
            run_id="r0",
            run_after=START,
            run_type=DagRunType.MANUAL,
            triggered_by=DagRunTriggeredByType.TEST,
            state=DagRunState.RUNNING,
            start_date=started,
            session=session,
        )
        session.flush()
        for task_id, state in doc["states"].items():
            session.execute(
                update(TaskInstance)
                .where(TaskInstance.dag_id == name, TaskInstance.task_id == task_id)
                .values(state=state, start_date=started, end_date=started)
            )
        session.flush()
        run.start_date = started
        session.merge(run)
        session.flush()
    with create_session() as session:
        run = session.scalar(select(DagRun).where(DagRun.dag_id == name))
        SchedulerJobRunner(job=Job())._schedule_dag_run(run, session=session)
        session.flush()
        states = dict(
            session.execute(
                select(TaskInstance.task_id, TaskInstance.state).where(TaskInstance.dag_id == name)
            ).all()
        )
        skipped = sorted(task_id for task_id, state in states.items() if state == "skipped")
        return {"run": str(getattr(run.state, "value", run.state)), "skipped": skipped}


def play(name: str, doc: dict):
    if doc.get("kind") == "consecutive":
        return consecutive(name, doc)
    if doc.get("kind") == "timeout":
        return timeout(name, doc)
    parse(name, doc)
    with create_session() as session:
        dag = SerializedDagModel.get_dag(name, session=session)
        runs = []
        for i, run in enumerate(doc["runs"]):
            day = run["day"]
            logical = None if day is None else START + dt.timedelta(days=day)
            runs.append(
                dag.create_dagrun(
                    run_id=f"r{i}",
                    logical_date=logical,
                    data_interval=None if logical is None else (logical, logical),
                    run_after=logical or START + dt.timedelta(days=100 + i),
                    run_type=DagRunType(run.get("run_type", "manual")),
                    triggered_by=DagRunTriggeredByType.TEST,
                    state=DagRunState.RUNNING,
                    session=session,
                )
            )
        session.flush()
        for key, state in doc["states"].items():
            index, task_id = key.split(".")
            where = (TaskInstance.run_id == f"r{index}", TaskInstance.task_id == task_id)
            where += (TaskInstance.dag_id == name,)
            if state == "absent":
                session.execute(delete(TaskInstance).where(*where))
            else:
                session.execute(update(TaskInstance).where(*where).values(state=state))
        session.flush()
        index, task_id = doc["ask"].split(".")
        ti = session.scalar(
            select(TaskInstance).where(
                TaskInstance.dag_id == name,
                TaskInstance.run_id == f"r{index}",
                TaskInstance.task_id == task_id,
            )
        )
        ti.task = dag.get_task(task_id)
        return PrevDagrunDep().is_met(ti=ti, session=session, dep_context=DepContext())


def main() -> None:
    with open(sys.argv[1]) as f:
        scenarios = json.load(f)
    out = {name: play(name, doc) for name, doc in scenarios.items()}
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
