"""The service's time scheduler against Airflow 3.3.2's own, step by step (issue 40).

Each scenario is a few Dags (the service's definitions) and steps at set instants: a sync, a
scheduler pass, a pause or an unpause, the Dag's runs finishing, a backfill. Airflow plays them
with its own code on its own metadata database, its clock frozen at each step
(`airflow_scheduler_driver.py`, run once for all the scenarios by the Airflow virtualenv's
python; its docstring says which Airflow function each step is); the service plays them on the
test database, its clock (`timezone.now`, read by a sync and an unpause) set the same and each
pass given the step's instant. After every step both give the Dags' runs (run id, type, logical
date, data interval, run_after), each Dag's stored next run and the backfills' planned dates;
any difference fails, listed by scenario and step.

Where the two differ by design, the comparison reads them alike: the service creates a
backfill's runs as their turn comes (at most its max_active_runs at once, none while the Dag is
paused: a run is claimable as soon as it exists) where Airflow creates them all, queued, at once,
so a backfill's dates still waiting count as the runs Airflow has (same run id and dates). A
"pass" runs Airflow's scheduler loop until a loop creates nothing (it makes one run per Dag per
loop), and the service's sweep (time scheduler, then backfills) the same way. An unpause is
Airflow's API unpause and then the Dag processor's parse of the Dag (it re-parses every file
every 30 s, paused or not).

The Dag processor's periodic parses: a deployed Airflow parses every file again every
`min_file_process_interval` (30 s) and each parse stores the Dag's next run again from its
latest automated run, at the parse's clock. The driver plays those parses between the steps
(every 30 s from a Dag's sync or unpause; a parse on a step's instant comes after the step), the
service plays the last one when its pass looks at a Dag (`next_runs.reparse`: taken to be
TIME_SCHEDULER_PARSE_INTERVAL_SECONDS before the pass; a next run stored after it, or due for
less time than that, stands). On a Dag's parse series the two take the same parse; off it
Airflow's last parse is up to 30 s later than the service's, which changes nothing with catchup
or for ticks further apart, but does for a delta or an event in between (a deployed Airflow's
series starts whenever its processor first parsed the file: the phase is not knowable, the
service fixes it). So the scenarios put a step where a delta or events Dag's run has been due
longer than that on its series, or where no event lies between the two parses. The service's
"next run" after a step is the one its pass would read (`reparse` applied), as Airflow stores it
at each parse.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from assets_app.catalog import dags as catalog_dags
from assets_app.definitions import next_runs
from assets_app.definitions import sync as definitions
from assets_app.models import Backfill, BackfillDagRun, Dag, DagRun, DagRunState
from assets_app.scheduling import backfills
from assets_app.scheduling import time_runs as time_scheduling
from tests.compat.airflow_worker_env import sdk_python

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

DRIVER = Path(__file__).with_name("airflow_scheduler_driver.py")
UTC = dt.UTC


def dag(dag_id: str, timetable, **fields) -> dict:
    # is_paused false: Airflow's side runs with dags_are_paused_at_creation off (the driver).
    return {
        "dag_id": dag_id,
        "timetable": timetable,
        "max_active_runs": 16,
        "is_paused": False,
        **fields,
    }


HOURLY = "@hourly"
SCENARIOS: dict[str, dict] = {
    # Catchup on: every missed hour, in order, from the start date; then paused for hours and
    # unpaused: every hour missed meanwhile.
    "catchup_on_unpause": {
        "dags": [dag("c_on", HOURLY, start_date="2026-01-01T00:00:00", catchup=True)],
        "steps": [
            ("2026-01-01T02:30:00", "sync", None),
            ("2026-01-01T02:30:01", "pass", None),
            ("2026-01-01T03:00:00.500", "pass", None),
            ("2026-01-01T03:10:00", "pause", "c_on"),
            ("2026-01-01T06:20:00", "pass", None),
            ("2026-01-01T07:05:00", "unpause", "c_on"),
            ("2026-01-01T07:05:01", "pass", None),
            ("2026-01-01T08:00:02", "pass", None),
        ],
    },
    # Catchup off: the latest tick only, after the sync and after an unpause.
    "catchup_off_unpause": {
        "dags": [dag("c_off", HOURLY, start_date="2025-12-25T00:00:00", is_paused=True)],
        "steps": [
            ("2026-01-01T02:30:00", "sync", None),
            ("2026-01-01T02:31:00", "pass", None),
            ("2026-01-01T05:20:00", "unpause", "c_off"),
            ("2026-01-01T05:20:00", "pass", None),
            ("2026-01-01T06:00:01", "pass", None),
            ("2026-01-01T07:00:00", "pass", None),
            ("2026-01-01T07:10:00", "pause", "c_off"),
            ("2026-01-01T09:59:59", "unpause", "c_off"),
            ("2026-01-01T10:00:01", "pass", None),
        ],
    },
    # max_active_runs: catchup waits for slots; the runs finish, the next ones come (without
    # catchup the latest tick by then, 08:00: the Dag processor's parses stored it).
    "max_active_runs": {
        "dags": [
            dag(
                "limited",
                HOURLY,
                start_date="2026-01-01T00:00:00",
                catchup=True,
                max_active_runs=2,
            ),
            dag("limited_off", HOURLY, start_date="2026-01-01T00:00:00", max_active_runs=1),
        ],
        "steps": [
            ("2026-01-01T05:30:00", "sync", None),
            ("2026-01-01T05:30:00", "pass", None),
            ("2026-01-01T06:00:00", "pass", None),
            ("2026-01-01T06:10:00", "finish", "limited"),
            ("2026-01-01T06:10:00", "pass", None),
            ("2026-01-01T08:20:00", "finish", "limited_off"),
            ("2026-01-01T08:20:00", "finish", "limited"),
            ("2026-01-01T08:20:01", "pass", None),
        ],
    },
    # Events, catchup off (the default): each event gets its run though the passes land a
    # second or less late; a pass landing 70 s after an event (00:03:30) finds it skipped by
    # the Dag processor's parse since, which stored the first event not past (00:04:30).
    "events": {
        "dags": [
            dag(
                "events_off",
                {
                    "kind": "events",
                    "event_dates": [
                        "2026-01-01T00:01:30",
                        "2026-01-01T00:02:30",
                        "2026-01-01T00:03:30",
                        "2026-01-01T00:04:30",
                        "2026-01-01T00:06:00",
                    ],
                },
            ),
            dag(
                "events_on",
                {
                    "kind": "events",
                    "event_dates": [
                        "2025-12-31T23:00:00",
                        "2026-01-01T00:01:30",
                        "2026-01-01T00:10:00",
                    ],
                },
                start_date="2025-12-31T00:00:00",
                catchup=True,
            ),
        ],
        "steps": [
            ("2026-01-01T00:00:00", "sync", None),
            ("2026-01-01T00:00:00.200", "pass", None),
            ("2026-01-01T00:01:30.400", "pass", None),
            ("2026-01-01T00:02:31", "pass", None),
            ("2026-01-01T00:04:40", "pass", None),
            ("2026-01-01T00:06:02", "pass", None),
            ("2026-01-01T00:10:00", "pass", None),
        ],
    },
    # A timedelta (DeltaTriggerTimetable) without catchup does not drift with passes a second or
    # two late; a data-interval delta neither. Then the scheduler is down for hours: at the
    # pass, the run the Dag processor's last parse stored (a delta from its instant).
    "deltas": {
        "dags": [
            dag("delta", {"kind": "delta_trigger", "delta": 21600}, start_date="2025-12-31"),
            dag(
                "delta_interval",
                {"kind": "delta_trigger", "delta": 7200, "interval": 1800},
                start_date="2025-12-31",
            ),
            dag(
                "delta_data",
                {"kind": "delta_data_interval", "delta": 7200},
                start_date="2025-12-31",
            ),
        ],
        "steps": [
            ("2026-01-01T00:00:00", "sync", None),
            ("2026-01-01T00:00:00", "pass", None),
            ("2026-01-01T02:00:01.500", "pass", None),
            ("2026-01-01T04:00:01", "pass", None),
            ("2026-01-01T06:00:01", "pass", None),
            ("2026-01-01T08:00:00.500", "pass", None),
            ("2026-01-01T10:00:02", "pass", None),
            ("2026-01-01T12:00:02", "pass", None),
            ("2026-01-01T19:30:00", "pass", None),
        ],
    },
    # run_immediately of a cron trigger without a start date: True, False, a number of seconds,
    # null (10% of the gap between ticks); a pass on time, one late.
    "run_immediately": {
        "dags": [
            dag("ri_true", {"kind": "cron_trigger", "cron": "@hourly", "run_immediately": True}),
            dag("ri_false", {"kind": "cron_trigger", "cron": "@hourly", "run_immediately": False}),
            dag("ri_600", {"kind": "cron_trigger", "cron": "@hourly", "run_immediately": 600}),
            dag("ri_none", {"kind": "cron_trigger", "cron": "@hourly", "run_immediately": None}),
            dag("ri_daily", {"kind": "cron_trigger", "cron": "@daily", "run_immediately": None}),
        ],
        "steps": [
            ("2026-01-01T10:08:00", "sync", None),
            ("2026-01-01T10:08:00", "pass", None),
            ("2026-01-01T11:10:00", "pass", None),
            ("2026-01-01T12:00:00", "pass", None),
        ],
    },
    # Cron kinds, without catchup and with: a data-interval cron, multiple crons, once, an end
    # date, a cron in a zone with a DST change (Zurich, 29 March), an offset interval.
    "cron_kinds": {
        "dags": [
            dag(
                "data_interval",
                {"kind": "cron_data_interval", "cron": "0 */6 * * *"},
                start_date="2026-03-28T00:00:00",
            ),
            dag(
                "data_interval_on",
                {"kind": "cron_data_interval", "cron": "0 */6 * * *"},
                start_date="2026-03-28T00:00:00",
                catchup=True,
            ),
            dag(
                "multiple",
                {"kind": "multiple_cron_trigger", "crons": ["0 3 * * *", "30 */4 * * *"]},
                start_date="2026-03-28T00:00:00",
            ),
            dag(
                "zurich",
                "30 2 * * *",
                timezone="Europe/Zurich",
                start_date="2026-03-27T00:00:00",
                catchup=True,
            ),
            dag(
                "offset",
                {"kind": "cron_trigger", "cron": "0 */4 * * *", "interval": 3600},
                start_date="2026-03-28T00:00:00",
                catchup=True,
                end_date="2026-03-29T06:00:00",
            ),
            dag("once", "@once", start_date="2026-03-28T05:00:00"),
        ],
        "steps": [
            ("2026-03-28T01:00:00", "sync", None),
            ("2026-03-28T01:00:01", "pass", None),
            ("2026-03-28T07:31:00", "pass", None),
            ("2026-03-29T02:00:00", "pass", None),
            ("2026-03-29T09:00:00", "pass", None),
            ("2026-03-30T03:00:00", "pass", None),
        ],
    },
    # A schedule changed by a sync: its next run from the last run, at that sync.
    "schedule_change": {
        "dags": [dag("changed", HOURLY, start_date="2026-01-01T00:00:00", catchup=True)],
        "steps": [
            ("2026-01-01T03:30:00", "sync", None),
            ("2026-01-01T03:30:00", "pass", None),
            (
                "2026-01-01T04:10:00",
                "sync",
                [dag("changed", "*/20 * * * *", start_date="2026-01-01T00:00:00", catchup=True)],
            ),
            ("2026-01-01T05:05:00", "pass", None),
            (
                "2026-01-01T05:10:00",
                "sync",
                [dag("changed", "*/20 * * * *", start_date="2026-01-01T00:00:00")],
            ),
            ("2026-01-01T07:50:00", "pass", None),
        ],
    },
    # Backfills beside scheduled runs: their runs count apart from max_active_runs; a backfill
    # over the stored next run's dates (the scheduler skips what they hold, and an unpause
    # stores the next run after the backfill's latest).
    "backfills": {
        "dags": [
            dag(
                "filled",
                "@daily",
                start_date="2026-01-01T00:00:00",
                catchup=True,
                max_active_runs=2,
            ),
            dag(
                "held",
                "@daily",
                start_date="2026-01-01T00:00:00",
                catchup=True,
                is_paused=True,
            ),
            dag("held_on", "@daily", start_date="2026-01-01T00:00:00", catchup=True),
        ],
        "steps": [
            ("2026-01-03T12:00:00", "sync", None),
            (
                "2026-01-03T12:00:00",
                "backfill",
                {"dag_id": "filled", "from": "2025-12-01", "to": "2025-12-02"},
            ),
            ("2026-01-03T12:00:01", "pass", None),
            (
                "2026-01-03T12:00:02",
                "backfill",
                {"dag_id": "held", "from": "2026-01-01", "to": "2026-01-02"},
            ),
            ("2026-01-03T12:00:03", "unpause", "held"),
            ("2026-01-03T12:00:04", "pass", None),
            ("2026-01-05T00:00:00", "finish", "filled"),
            (
                "2026-01-05T00:00:01",
                "backfill",
                {
                    "dag_id": "filled",
                    "from": "2025-12-20",
                    "to": "2026-01-04",
                    "max_active_runs": 50,
                    "reverse": True,
                    "reprocess_behavior": "completed",
                },
            ),
            ("2026-01-05T00:00:02", "pass", None),
        ],
    },
    # Six-field crons (the seconds last, as croniter reads them in Airflow).
    "six_fields": {
        "dags": [
            dag(
                "every_second",
                "*/30 * * * * *",
                start_date="2026-01-01T00:00:00",
                catchup=True,
                max_active_runs=5,
            ),
            dag("twenty_seconds", "0 12 * * * */20", start_date="2026-01-01T00:00:00"),
        ],
        "steps": [
            ("2026-01-01T00:00:00", "sync", None),
            ("2026-01-01T00:00:03.500", "pass", None),
            ("2026-01-01T00:00:04", "finish", "every_second"),
            ("2026-01-01T00:00:59", "pass", None),
            ("2026-01-01T12:00:21", "pass", None),
            ("2026-01-01T12:00:45", "pass", None),
        ],
    },
    # Blocked at max_active_runs past many of the Dag processor's parses, then unblocked: the
    # next run is the one the last parse stored (a tick within the last parse interval
    # follows it at once: `ten`'s 08:10 and 08:20).
    "blocked_cron_off": {
        "dags": [
            dag("cron_off", HOURLY, start_date="2026-01-01T00:00:00", max_active_runs=1),
            dag("ten", "*/10 * * * *", start_date="2026-01-01T00:00:00", max_active_runs=2),
        ],
        "steps": [
            ("2026-01-01T05:30:00", "sync", None),
            ("2026-01-01T05:30:00", "pass", None),
            ("2026-01-01T05:40:00", "pass", None),
            ("2026-01-01T06:00:00", "pass", None),
            ("2026-01-01T06:45:00", "pass", None),
            ("2026-01-01T07:20:00", "pass", None),
            ("2026-01-01T08:20:00", "finish", "cron_off"),
            ("2026-01-01T08:20:00", "finish", "ten"),
            ("2026-01-01T08:20:00", "pass", None),
        ],
    },
    # With catchup the parse stores the run after the latest automated one: unchanged while
    # blocked (`hourly_on` goes on at 01:00), except that a backfill's later dates move it on
    # (`daily_on` skips 01-02, as Airflow does once a parse has seen the backfill).
    "blocked_catchup_on": {
        "dags": [
            dag(
                "daily_on",
                "@daily",
                start_date="2026-01-01T00:00:00",
                catchup=True,
                max_active_runs=1,
            ),
            dag(
                "hourly_on",
                HOURLY,
                start_date="2026-01-03T00:00:00",
                catchup=True,
                max_active_runs=1,
            ),
        ],
        "steps": [
            ("2026-01-03T12:00:00", "sync", None),
            ("2026-01-03T12:00:00", "pass", None),
            (
                "2026-01-03T12:30:00",
                "backfill",
                {"dag_id": "daily_on", "from": "2026-01-03", "to": "2026-01-03"},
            ),
            ("2026-01-03T13:00:00", "pass", None),
            ("2026-01-04T00:00:00", "finish", "daily_on"),
            ("2026-01-04T00:00:00", "finish", "hourly_on"),
            ("2026-01-04T00:00:00", "pass", None),
        ],
    },
    # A delta without catchup, blocked: the parse's instant plus nothing (Airflow's
    # `max(now, last + delta)`), then the delta from the run created; a pass a second late
    # still creates the stored one.
    "blocked_delta": {
        "dags": [
            dag(
                "delta_off",
                {"kind": "delta_trigger", "delta": 3600},
                start_date="2025-12-31",
                max_active_runs=1,
            ),
        ],
        "steps": [
            ("2026-01-01T00:00:00", "sync", None),
            ("2026-01-01T00:00:00", "pass", None),
            ("2026-01-01T01:00:00", "pass", None),
            ("2026-01-01T02:30:00", "pass", None),
            ("2026-01-01T03:00:00", "finish", "delta_off"),
            ("2026-01-01T03:00:00", "pass", None),
            ("2026-01-01T03:30:00", "finish", "delta_off"),
            ("2026-01-01T03:59:31", "pass", None),
        ],
    },
    # Events without catchup, blocked: the events past at a parse are skipped; an event due for
    # no longer than the parse interval still gets its run (00:05:00).
    "blocked_events": {
        "dags": [
            dag(
                "events_blocked",
                {
                    "kind": "events",
                    "event_dates": [
                        "2026-01-01T00:01:00",
                        "2026-01-01T00:02:00",
                        "2026-01-01T00:02:40",
                        "2026-01-01T00:04:10",
                        "2026-01-01T00:05:00",
                        "2026-01-01T00:06:00",
                        "2026-01-01T00:10:00",
                    ],
                },
                max_active_runs=1,
            ),
        ],
        "steps": [
            ("2026-01-01T00:00:00", "sync", None),
            ("2026-01-01T00:01:00.500", "pass", None),
            ("2026-01-01T00:03:00", "pass", None),
            ("2026-01-01T00:04:30", "finish", "events_blocked"),
            ("2026-01-01T00:04:30", "pass", None),
            ("2026-01-01T00:05:30", "finish", "events_blocked"),
            ("2026-01-01T00:05:30", "pass", None),
            ("2026-01-01T00:10:00", "finish", "events_blocked"),
            ("2026-01-01T00:10:00", "pass", None),
        ],
    },
}


@pytest.fixture(scope="module")
def airflow(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("differential")
    scenarios, out = folder / "scenarios.json", folder / "airflow.json"
    scenarios.write_text(json.dumps(SCENARIOS))
    done = subprocess.run(
        [str(sdk_python()), str(DRIVER), str(scenarios), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    played = json.loads(out.read_text())
    # Airflow's own default parse interval, the service's default.
    assert played["parse_interval"] == settings.TIME_SCHEDULER_PARSE_INTERVAL_SECONDS == 30
    return played["scenarios"]


def iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


def document(doc: dict) -> dict:
    return {**doc, "tasks": [{"task_id": "a"}]}


def state(dag_ids: list[str], now: dt.datetime) -> dict:
    runs = [
        [
            r.dag_id,
            r.run_id,
            r.run_type,
            iso(r.logical_date),
            iso(r.data_interval_start),
            iso(r.data_interval_end),
            iso(r.run_after),
        ]
        for r in DagRun.objects.filter(dag_id__in=dag_ids)
    ]
    # A backfill's dates waiting for their turn, as the runs Airflow has made of them already.
    runs += [
        [
            row.backfill.dag_id,
            backfills.backfill_run_id(row.run_after),
            "backfill",
            iso(row.logical_date),
            iso(row.data_interval_start),
            iso(row.data_interval_end),
            iso(row.run_after),
        ]
        for row in BackfillDagRun.objects.filter(
            backfill__dag_id__in=dag_ids,
            started_at__isnull=True,
            exception_reason__isnull=True,
            dag_run__isnull=True,
        ).select_related("backfill")
    ]
    # Each Dag's next run as the Dag processor's last parse stored it (a Dag at max_active_runs
    # or paused keeps its stored fields in the database until a pass or an unpause).
    dags = list(Dag.objects.filter(dag_id__in=dag_ids))
    next_runs.reparse(dags, now=now)
    nexts = {
        d.dag_id: [
            iso(d.next_dagrun),
            iso(d.next_dagrun_data_interval_start),
            iso(d.next_dagrun_data_interval_end),
            iso(d.next_dagrun_create_after),
        ]
        for d in dags
    }
    filled = [
        [b.dag_id, row.sort_ordinal, iso(row.logical_date), row.exception_reason]
        for b in Backfill.objects.filter(dag_id__in=dag_ids).order_by("pk")
        for row in BackfillDagRun.objects.filter(backfill=b).order_by("sort_ordinal")
    ]
    return {"runs": runs, "next": nexts, "backfill_dates": filled}


def play(scenario: dict, monkeypatch) -> list[dict]:
    clock = [dt.datetime(2026, 1, 1, tzinfo=UTC)]
    monkeypatch.setattr(timezone, "now", lambda: clock[0])
    docs = list(scenario["dags"])
    dag_ids = [doc["dag_id"] for doc in docs]
    out = []
    for at, action, args in scenario["steps"]:
        clock[0] = dt.datetime.fromisoformat(at).replace(tzinfo=UTC)
        if action == "sync":
            changed = {doc["dag_id"]: doc for doc in args or ()}
            docs = [changed.get(doc["dag_id"], doc) for doc in docs]
            definitions.sync_definitions(
                dags=[
                    parsed
                    for doc in docs
                    if not changed or doc["dag_id"] in changed
                    for parsed in definitions.parse_document(document(doc), file="d.json")
                ]
            )
        elif action == "pass":  # the scheduler sweep's: the time scheduler, then backfills
            for _ in range(1000):
                timed = time_scheduling.create_due_runs(now=clock[0])
                filled = backfills.start_runs(now=clock[0])
                if not timed.run_ids and not filled.run_ids:
                    break
        elif action in ("pause", "unpause"):
            catalog_dags.set_paused(dag_id=args, is_paused=action == "pause")
        elif action == "finish":
            DagRun.objects.filter(
                dag_id=args, state__in=[DagRunState.QUEUED, DagRunState.RUNNING]
            ).update(state=DagRunState.SUCCESS)
            backfills.start_runs(now=clock[0])  # the scheduler's pass: a finished one completes
        elif action == "backfill":
            backfills.create_backfill(
                dag_id=args["dag_id"],
                from_date=dt.datetime.fromisoformat(args["from"]).replace(tzinfo=UTC),
                to_date=dt.datetime.fromisoformat(args["to"]).replace(tzinfo=UTC),
                max_active_runs=args.get("max_active_runs", 10),
                run_backwards=args.get("reverse", False),
                reprocess_behavior=args.get("reprocess_behavior", "none"),
                now=clock[0],
            )
        else:
            raise ValueError(action)
        out.append(state(dag_ids, clock[0]))
    return out


def differences(scenario: dict, ours: list[dict], theirs: list[dict]) -> list[str]:
    found = []
    for (at, action, args), mine, airflows in zip(scenario["steps"], ours, theirs, strict=True):
        step = f"{at} {action}{'' if args is None else ' ' + json.dumps(args)[:60]}"
        mine_runs = sorted(map(tuple, mine["runs"]), key=lambda r: (r[0], r[6], r[1]))
        their_runs = sorted(map(tuple, airflows["runs"]), key=lambda r: (r[0], r[6], r[1]))
        for run in sorted(set(their_runs) - set(mine_runs)):
            found.append(f"{step}: Airflow has run {run}, the service not")
        for run in sorted(set(mine_runs) - set(their_runs)):
            found.append(f"{step}: the service has run {run}, Airflow not")
        for dag_id, theirs_next in sorted(airflows["next"].items()):
            if mine["next"].get(dag_id) != theirs_next:
                found.append(
                    f"{step}: {dag_id} next run: service {mine['next'].get(dag_id)} "
                    f"Airflow {theirs_next}"
                )
        if [tuple(r) for r in mine["backfill_dates"]] != [
            tuple(r) for r in airflows["backfill_dates"]
        ]:
            found.append(
                f"{step}: backfill dates: service {mine['backfill_dates']} "
                f"Airflow {airflows['backfill_dates']}"
            )
    return found


@pytest.mark.django_db
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_no_difference_from_airflows_scheduler(name, airflow, monkeypatch):
    scenario = SCENARIOS[name]
    ours = play(scenario, monkeypatch)
    theirs = airflow[name]
    assert any(step["runs"] for step in theirs), "a scenario that creates no run shows nothing"
    found = differences(scenario, ours, theirs)
    assert not found, f"{len(found)} differences:\n" + "\n".join(found[:20])
