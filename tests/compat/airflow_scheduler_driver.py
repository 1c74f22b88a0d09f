"""Airflow 3.3.2's own scheduler logic on scripted scenarios, for the differential test (issue 40).

Run by `test_scheduler_differential.py` with the Airflow virtualenv's python (never imported by
the service or by pytest): `python airflow_scheduler_driver.py SCENARIOS.json OUT.json`.

Airflow runs on its own metadata database (SQLite, `airflow db migrate` in a temporary
AIRFLOW_HOME), with its clock frozen at each step's instant: `timezone.utcnow` (and the names
the timetables imported from it), `time.time` of the multiple-cron timetable, and SQL's `now()`
(SQLite's `CURRENT_TIMESTAMP` compiled to a function of the frozen clock). What each step does,
all with Airflow's own code:

- `sync`: the Dag processor's parse of the scenario's Dags (`update_dag_parsing_results_in_db`,
  which stores each Dag's next run with `calculate_dagrun_date_fields`);
- `pass`: the scheduler loop's run creation (`SchedulerJobRunner._create_dagruns_for_dags`:
  `DagModel.dags_needing_dagruns`, `_create_dag_runs`), loop after loop until a loop creates
  nothing (Airflow makes one run per Dag per loop);
- `pause` / `unpause`: the API's `is_paused`; after an unpause the processor's parse of the Dag
  (it re-parses every file every 30 s, paused or not: the next run an unpaused Dag has);
- `finish`: the Dag's queued runs set to success, then `_set_exceeds_max_active_runs` and
  `_mark_backfills_complete`, as the scheduler loop does when runs finish;
- `backfill`: `models.backfill._create_backfill`, as `POST /api/v2/backfills` calls it.

Between the steps, the Dag processor's periodic parses: a deployed Airflow parses each file again
`[dag_processor] min_file_process_interval` (Airflow's own setting, 30 s by default) after its
last parse (`DagFileProcessorManager.prepare_file_queue` queues a file once that long has passed
since its `last_finish_time`), paused Dags too, and each parse stores the Dag's next run again
(`DagModelOperation.update_dags`: `calculate_dagrun_date_fields` from the latest automated run,
at the parse's clock). Before each step the driver parses each synced Dag at the last instant of
its series (its sync or unpause, then every interval) earlier than the step, with the clock
frozen there: a parse falling on a step's instant comes after that step. Only that last parse
matters: the runs do not change between two steps, and a parse's result depends on them and
its clock only (never on the next run stored before it).

After each step the scenario's runs (run id, type, logical date, data interval, run_after) and
each Dag's stored next run are written out.
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
from zoneinfo import ZoneInfo

HOME = tempfile.mkdtemp(prefix="airflow-differential-")
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

CLOCK = [dt.datetime(2026, 1, 1, tzinfo=dt.UTC)]

import airflow.timetables.interval as af_interval  # noqa: E402
import airflow.timetables.trigger as af_trigger  # noqa: E402
import pendulum  # noqa: E402
from airflow._shared.timezones import timezone as af_timezone  # noqa: E402
from sqlalchemy import event, select, update  # noqa: E402
from sqlalchemy.engine import Engine  # noqa: E402
from sqlalchemy.ext.compiler import compiles  # noqa: E402
from sqlalchemy.sql import functions  # noqa: E402


def _utcnow() -> pendulum.DateTime:
    return pendulum.instance(CLOCK[0]).in_timezone("UTC")


class _Time:
    @staticmethod
    def time() -> float:
        return CLOCK[0].timestamp()


af_timezone.utcnow = _utcnow
af_trigger.utcnow = _utcnow
af_interval.utcnow = _utcnow
af_trigger.time = _Time  # MultipleCronTriggerTimetable's `time.time()`


@compiles(functions.now, "sqlite")
def _now(element, compiler, **kw):
    return "frozen_now()"


@event.listens_for(Engine, "connect")
def _frozen_now(dbapi_connection, record):
    dbapi_connection.create_function(
        "frozen_now", 0, lambda: CLOCK[0].astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    )


from airflow.configuration import conf  # noqa: E402
from airflow.dag_processing.collection import update_dag_parsing_results_in_db  # noqa: E402
from airflow.jobs.job import Job  # noqa: E402
from airflow.jobs.scheduler_job_runner import SchedulerJobRunner  # noqa: E402
from airflow.models.backfill import (  # noqa: E402
    Backfill,
    BackfillDagRun,
    ReprocessBehavior,
    _create_backfill,
)
from airflow.models.dag import DagModel  # noqa: E402
from airflow.models.dagbundle import DagBundleModel  # noqa: E402
from airflow.models.dagrun import DagRun  # noqa: E402
from airflow.providers.standard.operators.empty import EmptyOperator  # noqa: E402
from airflow.sdk import (  # noqa: E402
    DAG,
    CronDataIntervalTimetable,
    CronTriggerTimetable,
    DeltaDataIntervalTimetable,
    DeltaTriggerTimetable,
    MultipleCronTriggerTimetable,
)
from airflow.serialization.serialized_objects import LazyDeserializedDAG  # noqa: E402

# The SDK's EventsTimetable does not serialize in 3.3.2 (its encoding lacks the `_summary` the
# core class reads back: KeyError at the Dag processor); the core class does.
from airflow.timetables.events import EventsTimetable  # noqa: E402
from airflow.timetables.simple import OnceTimetable  # noqa: E402
from airflow.utils.session import create_session  # noqa: E402
from airflow.utils.sqlalchemy import prohibit_commit  # noqa: E402

BUNDLE = "differential"
UTC = dt.UTC


def instant(text: str, tz: str = "UTC") -> pendulum.DateTime:
    value = dt.datetime.fromisoformat(text)
    if value.tzinfo is None:
        value = value.replace(tzinfo=ZoneInfo(tz))
    return pendulum.instance(value.astimezone(UTC))


def seconds(value: float) -> dt.timedelta:
    return dt.timedelta(seconds=value)


def run_immediately(value):
    return (
        seconds(value) if isinstance(value, int | float) and not isinstance(value, bool) else value
    )


def timetable(spec, tz: str):
    """The service's definition of a timetable as the Airflow timetable it names (README, "Time
    schedules")."""
    if spec == "@once" or (isinstance(spec, dict) and spec["kind"] == "once"):
        return OnceTimetable()
    if isinstance(spec, str):
        return CronTriggerTimetable(spec, timezone=tz)
    kind, zone = spec["kind"], spec.get("timezone", tz)
    if kind == "cron_trigger":
        return CronTriggerTimetable(
            spec["cron"],
            timezone=zone,
            interval=seconds(spec.get("interval", 0)),
            run_immediately=run_immediately(spec.get("run_immediately", False)),
        )
    if kind == "cron_data_interval":
        return CronDataIntervalTimetable(spec["cron"], timezone=zone)
    if kind == "delta_trigger":
        return DeltaTriggerTimetable(
            seconds(spec["delta"]), interval=seconds(spec.get("interval", 0))
        )
    if kind == "delta_data_interval":
        return DeltaDataIntervalTimetable(seconds(spec["delta"]))
    if kind == "multiple_cron_trigger":
        return MultipleCronTriggerTimetable(
            *spec["crons"],
            timezone=zone,
            interval=seconds(spec.get("interval", 0)),
            run_immediately=run_immediately(spec.get("run_immediately", False)),
        )
    if kind == "events":
        return EventsTimetable(
            event_dates=[instant(d, zone) for d in spec["event_dates"]],
            restrict_to_events=spec.get("restrict_to_events", False),
        )
    raise ValueError(f"unknown kind {kind}")


def dag_of(doc: dict) -> DAG:
    tz = doc.get("timezone", "UTC")
    with DAG(
        doc["dag_id"],
        schedule=timetable(doc["timetable"], tz),
        start_date=instant(doc["start_date"], tz) if doc.get("start_date") else None,
        end_date=instant(doc["end_date"], tz) if doc.get("end_date") else None,
        catchup=doc.get("catchup", False),
        max_active_runs=doc["max_active_runs"],
        is_paused_upon_creation=doc.get("is_paused", False),
    ) as dag:
        EmptyOperator(task_id="a")
    return dag


def parse(docs: list[dict]) -> None:
    with create_session() as session:
        if session.get(DagBundleModel, BUNDLE) is None:
            session.add(DagBundleModel(name=BUNDLE))
            session.flush()
        update_dag_parsing_results_in_db(
            BUNDLE,
            None,
            [LazyDeserializedDAG.from_dag(dag_of(doc)) for doc in docs],
            {},
            None,
            set(),
            session=session,
        )


RUNNER = SchedulerJobRunner(job=Job())


def count_runs() -> int:
    with create_session() as session:
        return len(session.scalars(select(DagRun.id)).all())


def scheduler_pass() -> None:
    for _ in range(1000):
        before = count_runs()
        with create_session() as session, prohibit_commit(session) as guard:
            RUNNER._create_dagruns_for_dags(guard, session)
        if count_runs() == before:
            return
    raise RuntimeError("the scheduler loop never settled")


def set_paused(dag_id: str, paused: bool, docs: list[dict]) -> None:
    with create_session() as session:
        session.execute(update(DagModel).where(DagModel.dag_id == dag_id).values(is_paused=paused))
    if not paused:
        parse([doc for doc in docs if doc["dag_id"] == dag_id])


def finish(dag_id: str) -> None:
    with create_session() as session:
        session.execute(
            update(DagRun)
            .where(DagRun.dag_id == dag_id, DagRun.state.in_(("queued", "running")))
            .values(state="success")
        )
        dag_model = session.scalar(select(DagModel).where(DagModel.dag_id == dag_id))
        RUNNER._set_exceeds_max_active_runs(dag_model=dag_model, session=session)
    RUNNER._mark_backfills_complete()


def backfill(args: dict) -> None:
    _create_backfill(
        dag_id=args["dag_id"],
        from_date=instant(args["from"]),
        to_date=instant(args["to"]),
        max_active_runs=args.get("max_active_runs", 10),
        reverse=args.get("reverse", False),
        dag_run_conf=None,
        triggering_user_name=None,
        reprocess_behavior=ReprocessBehavior(args.get("reprocess_behavior", "none")),
    )


def iso(value) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


def state(dag_ids: list[str]) -> dict:
    with create_session() as session:
        runs = [
            [
                r.dag_id,
                r.run_id,
                str(r.run_type),
                iso(r.logical_date),
                iso(r.data_interval_start),
                iso(r.data_interval_end),
                iso(r.run_after),
            ]
            for r in session.scalars(
                select(DagRun)
                .where(DagRun.dag_id.in_(dag_ids))
                .order_by(DagRun.dag_id, DagRun.run_after)
            )
        ]
        nexts = {
            m.dag_id: [
                iso(m.next_dagrun),
                iso(m.next_dagrun_data_interval_start),
                iso(m.next_dagrun_data_interval_end),
                iso(m.next_dagrun_create_after),
            ]
            for m in session.scalars(select(DagModel).where(DagModel.dag_id.in_(dag_ids)))
        }
        filled = [
            [
                b.dag_id,
                row.sort_ordinal,
                iso(row.logical_date),
                None if row.exception_reason is None else str(row.exception_reason),
            ]
            for b in session.scalars(select(Backfill).where(Backfill.dag_id.in_(dag_ids)))
            for row in session.scalars(
                select(BackfillDagRun)
                .where(BackfillDagRun.backfill_id == b.id)
                .order_by(BackfillDagRun.sort_ordinal)
            )
        ]
    return {"runs": runs, "next": nexts, "backfill_dates": filled}


PARSE_INTERVAL = dt.timedelta(seconds=conf.getint("dag_processor", "min_file_process_interval"))


def last_parse_before(parsed: dt.datetime, now: dt.datetime) -> dt.datetime | None:
    """The last instant of the series `parsed` + k * PARSE_INTERVAL (k >= 1) earlier than
    `now`, None when there is none."""
    k = (now - parsed) // PARSE_INTERVAL
    if parsed + k * PARSE_INTERVAL == now:
        k -= 1
    return parsed + k * PARSE_INTERVAL if k >= 1 else None


def periodic_parses(docs: list[dict], parsed_at: dict[str, dt.datetime], now: dt.datetime) -> None:
    """The Dag processor's parses since the last step (see the module docstring)."""
    due: dict[dt.datetime, list[str]] = {}
    for dag_id, parsed in parsed_at.items():
        instant = last_parse_before(parsed, now)
        if instant is not None:
            due.setdefault(instant, []).append(dag_id)
    for instant, dag_ids in sorted(due.items()):
        CLOCK[0] = instant
        parse([doc for doc in docs if doc["dag_id"] in dag_ids])
        parsed_at.update(dict.fromkeys(dag_ids, instant))


def play(scenario: dict) -> list[dict]:
    docs = list(scenario["dags"])
    dag_ids = [doc["dag_id"] for doc in docs]
    parsed_at: dict[str, dt.datetime] = {}
    out = []
    for at, action, args in scenario["steps"]:
        now = dt.datetime.fromisoformat(at).replace(tzinfo=UTC)
        periodic_parses(docs, parsed_at, now)
        CLOCK[0] = now
        if action == "sync":  # the scenario's Dags, or new versions of some of them
            changed = {doc["dag_id"]: doc for doc in args or ()}
            docs = [changed.get(doc["dag_id"], doc) for doc in docs]
            synced = [doc for doc in docs if not changed or doc["dag_id"] in changed]
            parse(synced)
            parsed_at.update((doc["dag_id"], now) for doc in synced)
        elif action == "pass":
            scheduler_pass()
        elif action in ("pause", "unpause"):
            set_paused(args, action == "pause", docs)
            if action == "unpause":
                parsed_at[args] = now
        elif action == "finish":
            finish(args)
        elif action == "backfill":
            backfill(args)
        else:
            raise ValueError(action)
        out.append(state(dag_ids))
    # Done: the scenario's Dags are paused, out of the next scenarios' passes.
    with create_session() as session:
        session.execute(update(DagModel).where(DagModel.dag_id.in_(dag_ids)).values(is_paused=True))
    return out


def main() -> None:
    with open(sys.argv[1]) as f:
        scenarios = json.load(f)
    results = {name: play(scenario) for name, scenario in scenarios.items()}
    with open(sys.argv[2], "w") as f:
        json.dump({"parse_interval": PARSE_INTERVAL.total_seconds(), "scenarios": results}, f)


if __name__ == "__main__":
    main()
