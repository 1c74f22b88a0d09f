"""Invariant 11 under real concurrency: two upstream TIs finishing at the same moment, each from
its own thread and connection against PostgreSQL, queue their common downstream exactly once,
and never leave it waiting."""

import json
import threading

import pytest
from django.db import connections
from django.utils import timezone

from assets_app.definitions import sync as definitions
from assets_app.models import TaskInstance, TIState
from assets_app.scheduling import dependencies, runs
from assets_app.task_state import starting, success

ROUNDS = 25
WIDTH = 4  # upstream tasks finishing together


def _sync() -> None:
    dag = {
        "dag_id": "fan_in",
        "tasks": [
            *({"task_id": f"u{i}"} for i in range(WIDTH)),
            {"task_id": "join", "upstream": [f"u{i}" for i in range(WIDTH)]},
            {
                "task_id": "any",
                "upstream": [f"u{i}" for i in range(WIDTH)],
                "trigger_rule": "one_success",
            },
        ],
    }
    dag["is_paused"] = False  # a sync pauses a new Dag unless it says so (issue 39)
    definitions.sync_definitions(dags=definitions.parse_text(json.dumps(dag), file="x"))


@pytest.mark.django_db(transaction=True)
def test_upstream_finishing_together_queue_their_downstream_once(monkeypatch):
    _sync()
    queued_by_evaluations: list[tuple[int, str]] = []
    record = threading.Lock()
    real_evaluate = dependencies.evaluate

    def recording_evaluate(*, dag_run_id, finished_task_ids):
        result = real_evaluate(dag_run_id=dag_run_id, finished_task_ids=finished_task_ids)
        with record:
            queued_by_evaluations.extend((dag_run_id, t) for t in result.queued)
        return result

    monkeypatch.setattr(dependencies, "evaluate", recording_evaluate)
    run_ids = []
    for _ in range(ROUNDS):
        run = runs.trigger_dag(dag_id="fan_in")
        run_ids.append(run.pk)
        for t in TaskInstance.objects.filter(dag_run=run, state=TIState.QUEUED):
            starting.start(
                ti_id=t.id,
                try_number=t.try_number,
                hostname="h",
                unixname="u",
                pid=1,
                start_date=timezone.now(),
            )
    errors: list[BaseException] = []

    def finisher(run_pk: int, task_id: str, barrier: threading.Barrier) -> None:
        try:
            ti_id = TaskInstance.objects.get(dag_run_id=run_pk, task_id=task_id).id
            barrier.wait()
            success.succeed(
                ti_id=ti_id,
                try_number=1,
                end_date=timezone.now(),
                task_outlets=[],
                outlet_events=[],
            )
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    for run_pk in run_ids:
        barrier = threading.Barrier(WIDTH)
        threads = [
            threading.Thread(target=finisher, args=(run_pk, f"u{i}", barrier)) for i in range(WIDTH)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []
    expected = sorted((run_pk, task_id) for run_pk in run_ids for task_id in ("any", "join"))
    assert sorted(queued_by_evaluations) == expected
    states = set(
        TaskInstance.objects.filter(task_id__in=["join", "any"]).values_list("state", flat=True)
    )
    assert states == {TIState.QUEUED}
