"""Exactly one run per (Dag, logical date) whatever crashes (issue 24's second acceptance item):
two time-scheduler processes catch up minute schedules while one of them is SIGKILLed at a
random point again and again (and restarted); afterwards every due logical date of every Dag
has exactly one run, never 0 or 2, each with its TI.

The CI-sized run (20 Dags, 40 kills) takes about 80 s; the issue's size (60 Dags, 200 kills)
is marked slow and runs with TIME_SCHEDULER_PROOF_FULL=1. TIME_SCHEDULER_PROOF_DAGS /
TIME_SCHEDULER_PROOF_KILLS set the CI-sized run's sizes.
Small batches (4 Dags, 2 runs per Dag and pass) make many transactions for a kill to land in.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from django.utils import timezone

from assets_app.definitions import sync as definitions
from assets_app.models import DagRun, TaskInstance
from assets_app.scheduling import time_runs as time_scheduling
from tests.proof.conftest import ROOT, figure

LOOP = """
import random, time, django
django.setup()
from assets_app.scheduling import time_runs as time_scheduling
while True:
    time_scheduling.create_due_runs()
    time.sleep(random.random() / 50)
"""


def _dags(count: int, minutes: int) -> dt.datetime:
    start = (timezone.now() - dt.timedelta(minutes=minutes)).replace(second=0, microsecond=0)
    documents = [
        {
            "dag_id": f"minute_{i:03d}",
            "is_paused": False,  # a sync pauses a new Dag unless it says so (issue 39)
            "timetable": "* * * * *",
            "start_date": start.isoformat(),
            "catchup": True,
            "max_active_runs": 100_000,
            "tasks": [{"task_id": "t"}],
        }
        for i in range(count)
    ]
    definitions.sync_definitions(
        dags=[d for doc in documents for d in definitions.parse_document(doc, file="proof")]
    )
    return start


def _due_dates(start: dt.datetime) -> int:
    """How many minute dates are due for one Dag now (its start's included)."""
    now = timezone.now().replace(second=0, microsecond=0)
    return int((now - start).total_seconds() // 60) + 1


def _spawn(env: dict[str, str], log) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", LOOP], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )


def _scenario(service_env, tmp_path, *, dags: int, kills: int) -> None:
    start = _dags(dags, minutes=60)
    env = {**service_env, "TIME_SCHEDULER_BATCH_SIZE": "4", "TIME_SCHEDULER_RUNS_PER_DAG": "2"}
    log = (tmp_path / "schedulers.log").open("w")
    procs = [_spawn(env, log), _spawn(env, log)]
    rng = random.Random(24)
    done = 0
    progress = []
    seen = DagRun.objects.count()
    try:
        while done < kills:
            time.sleep(rng.uniform(0.6, 1.8))  # a fresh process needs ~0.5 s to start working
            # ... and several on a loaded machine (a CI run at load 8 saw no run created in 40
            # kills): each kill waits (30 s at most) until the schedulers have created something
            # since the last one, so the kills land between passes of working schedulers, not
            # only in start-ups. Once every due date has its run nothing moves: kill at once.
            deadline = time.monotonic() + 30
            while DagRun.objects.count() == seen and time.monotonic() < deadline:
                if seen >= dags * _due_dates(start):
                    break
                time.sleep(0.05)
            seen = DagRun.objects.count()
            victim = rng.randrange(2)
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait()
            done += 1
            progress.append(DagRun.objects.count())
            procs[victim] = _spawn(env, log)
        time.sleep(1)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        log.close()
    # Whatever the kills left, one clean pass creates the rest; then every due date has one run.
    now = timezone.now()
    time_scheduling.create_due_runs(now=now)
    expected_count = int((now.replace(second=0, microsecond=0) - start).total_seconds() // 60) + 1
    rows = list(DagRun.objects.values_list("dag_id", "logical_date"))
    per_pair = Counter(rows)
    assert max(per_pair.values()) == 1, [pair for pair, n in per_pair.items() if n > 1][:5]
    for i in range(dags):
        dates = sorted(date for dag_id, date in rows if dag_id == f"minute_{i:03d}")
        wanted = [start + dt.timedelta(minutes=m) for m in range(expected_count)]
        assert dates == wanted, (i, len(dates), len(wanted))
    assert TaskInstance.objects.count() == len(rows)
    assert progress[-1] > progress[0], "the schedulers made no progress between kills"
    figure(
        f"time scheduler kills: {done} SIGKILLs over {dags} minute Dags with catchup, "
        f"{len(rows)} runs, each due logical date exactly once (runs seen at kills: "
        f"{progress[0]} ... {progress[-1]})"
    )


@pytest.mark.django_db(transaction=True)
def test_two_schedulers_sigkilled_create_each_logical_date_once(service_env, tmp_path):
    _scenario(
        service_env,
        tmp_path,
        dags=int(os.environ.get("TIME_SCHEDULER_PROOF_DAGS", 20)),
        kills=int(os.environ.get("TIME_SCHEDULER_PROOF_KILLS", 40)),
    )


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("TIME_SCHEDULER_PROOF_FULL"),
    reason="the issue's size (~5 minutes): set TIME_SCHEDULER_PROOF_FULL=1",
)
@pytest.mark.django_db(transaction=True)
def test_issue_size_200_kills_over_60_dags(service_env, tmp_path):
    _scenario(service_env, tmp_path, dags=60, kills=200)
