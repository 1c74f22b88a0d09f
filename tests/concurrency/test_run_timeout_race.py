"""dagrun_timeout under real concurrency (issue 39): worker threads finish the TIs of runs while
the run-timeouts pass ends the same runs, each on its own PostgreSQL connection. No deadlock and
no error but the refusal a worker gets for a TI the timeout skipped; every run ends exactly once
(success, or failed by its timeout) and no TI of a timed-out run is left unfinished."""

import datetime
import json
import threading

import pytest
from django.db import connections
from django.utils import timezone

from assets_app.definitions import sync as definitions
from assets_app.guards import exceptions
from assets_app.models import AuditEntry, DagRun, DagRunState, TaskInstance, TIState
from assets_app.models.runs import TI_UNFINISHED_STATES
from assets_app.scheduling import runs, timeouts
from assets_app.task_state import starting, success

RUNS = 12
TASKS = 4


@pytest.mark.django_db(transaction=True)
def test_timeouts_racing_finishes_end_each_run_once():
    dag = {
        "dag_id": "slow",
        "is_paused": False,
        "dagrun_timeout_seconds": 60,
        "tasks": [{"task_id": f"t{i}"} for i in range(TASKS)],
    }
    definitions.sync_definitions(dags=definitions.parse_text(json.dumps(dag), file="x"))
    started = []
    for _ in range(RUNS):
        run = runs.trigger_dag(dag_id="slow")
        for ti in TaskInstance.objects.filter(dag_run=run):
            starting.start(
                ti_id=ti.id,
                try_number=1,
                hostname="h",
                unixname="u",
                pid=1,
                start_date=timezone.now(),
            )
            started.append(ti.id)
    due = timezone.now() + datetime.timedelta(seconds=61)
    barrier = threading.Barrier(3)
    errors: list[BaseException] = []
    refused: list[str] = []

    def finisher(ti_ids: list) -> None:
        try:
            barrier.wait()
            for ti_id in ti_ids:
                try:
                    success.succeed(
                        ti_id=ti_id,
                        try_number=1,
                        end_date=timezone.now(),
                        task_outlets=[],
                        outlet_events=[],
                    )
                except exceptions.InvalidState as exc:
                    refused.append(str(exc))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    def timer() -> None:
        try:
            barrier.wait()
            for _ in range(5):
                timeouts.time_out_due_runs(now=due, batch=1)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    # The finishers take the runs from the newest, the timer from the oldest (earliest due):
    # they meet on the runs in between, so some runs succeed and some time out.
    newest_first = started[::-1]
    threads = [
        threading.Thread(target=finisher, args=(newest_first[0::2],)),
        threading.Thread(target=finisher, args=(newest_first[1::2],)),
        threading.Thread(target=timer),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    timeouts.time_out_due_runs(now=due)  # whatever a racing finish left running
    states = dict(DagRun.objects.values_list("pk", "state"))
    assert set(states.values()) <= {DagRunState.SUCCESS, DagRunState.FAILED}
    failed = [pk for pk, state in states.items() if state == DagRunState.FAILED]
    assert not TaskInstance.objects.filter(state__in=TI_UNFINISHED_STATES).exists()
    # Each failed run was ended by its timeout once (one audit entry each), a run that
    # succeeded by none.
    audited = sorted(
        int(pk)
        for pk in AuditEntry.objects.filter(action="dag_run.timed_out").values_list(
            "targets__object_id", flat=True
        )
    )
    assert audited == sorted(failed)
    # A refused success is a TI the timeout skipped.
    skipped = TaskInstance.objects.filter(state=TIState.SKIPPED).count()
    assert failed  # the timer ends the oldest runs before any finisher reaches them
    assert len(refused) == skipped
