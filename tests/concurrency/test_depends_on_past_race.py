"""depends_on_past and wait_for_downstream under real concurrency (issue 39): worker threads,
each on its own PostgreSQL connection, claim, start and finish TIs of several runs of one Dag
while others finish; no TI is ever claimed before its previous run's TIs (and, for
wait_for_downstream, their direct downstream) succeeded, and every run completes."""

import datetime
import json
import threading
import time

import pytest
from django.db import connections
from django.utils import timezone

from assets_app.definitions import sync as definitions
from assets_app.models import DagRun, DagRunState, TaskInstance, TIState
from assets_app.scheduling import runs
from assets_app.task_state import claims, starting, success

RUNS = 8
WORKERS = 4
DAY1 = datetime.datetime(2026, 6, 1, tzinfo=datetime.UTC)


def _sync() -> None:
    dag = {
        "dag_id": "past",
        "is_paused": False,
        "tasks": [
            {"task_id": "a", "wait_for_downstream": True},
            {"task_id": "b", "upstream": ["a"], "depends_on_past": True},
        ],
    }
    definitions.sync_definitions(dags=definitions.parse_text(json.dumps(dag), file="x"))


def _states(run_pk: int | None) -> dict[str, str]:
    if run_pk is None:
        return {"a": TIState.SUCCESS, "b": TIState.SUCCESS}
    return dict(TaskInstance.objects.filter(dag_run_id=run_pk).values_list("task_id", "state"))


@pytest.mark.django_db(transaction=True)
def test_workers_never_claim_a_ti_before_its_past_succeeded():
    _sync()
    order = [
        runs.trigger_dag(dag_id="past", logical_date=DAY1 + datetime.timedelta(days=i)).pk
        for i in range(RUNS)
    ]
    previous = dict(zip(order, [None, *order[:-1]], strict=True))
    violations: list[str] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def worker(name: str) -> None:
        try:
            deadline = time.monotonic() + 60
            while not done.is_set() and time.monotonic() < deadline:
                workloads = claims.claim_workloads(hostname=name, limit=1)
                if not workloads:
                    time.sleep(0.002)  # idle spin, not a timing assumption
                    continue
                ti = workloads[0].ti
                past = _states(previous[ti.dag_run_id])
                own = _states(ti.dag_run_id)
                needed = {"a": ["a", "b"], "b": ["b"]}[ti.task_id]
                if any(past[t] != TIState.SUCCESS for t in needed) or (
                    ti.task_id == "b" and own["a"] != TIState.SUCCESS
                ):
                    violations.append(f"{ti.task_id} of run {ti.dag_run_id}: past {past}")
                tries = {"ti_id": ti.id, "try_number": ti.try_number}
                starting.start(
                    **tries, hostname=name, unixname="u", pid=1, start_date=timezone.now()
                )
                success.succeed(**tries, end_date=timezone.now(), task_outlets=[], outlet_events=[])
        except BaseException as exc:
            errors.append(exc)
            done.set()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(WORKERS)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not done.is_set():
        if DagRun.objects.filter(pk__in=order, state=DagRunState.SUCCESS).count() == RUNS:
            break
        time.sleep(0.01)
    done.set()
    for thread in threads:
        thread.join()
    assert errors == []
    assert violations == []
    assert DagRun.objects.filter(pk__in=order, state=DagRunState.SUCCESS).count() == RUNS
