"""Mapped tasks under real concurrency (issue 25), each finish from its own thread and
connection against PostgreSQL: map indexes finishing together queue their downstream exactly
once, and two upstream tasks finishing together expand the mapped task between them once."""

import json
import threading

import pytest
from django.db import connections
from django.utils import timezone

from assets_app.definitions import sync as definitions
from assets_app.models import DagRun, TaskInstance, TIState
from assets_app.runtime import xcoms
from assets_app.scheduling import dependencies, runs
from assets_app.task_state import starting, success

ROUNDS = 10
WIDTH = 8  # map indexes, or upstream tasks, finishing together


def _sync(dag: dict) -> None:
    # is_paused false: a sync pauses a new Dag unless it says so (issue 39).
    definitions.sync_definitions(
        dags=definitions.parse_text(json.dumps({"is_paused": False, **dag}), file="x")
    )


def _start(ti: TaskInstance) -> None:
    starting.start(
        ti_id=ti.id,
        try_number=ti.try_number,
        hostname="h",
        unixname="u",
        pid=1,
        start_date=timezone.now(),
    )


def _succeed(ti_id) -> None:
    success.succeed(
        ti_id=ti_id, try_number=1, end_date=timezone.now(), task_outlets=[], outlet_events=[]
    )


def _push(run: DagRun, task_id: str, length: int) -> None:
    xcoms.push(
        dag_id=run.dag_id,
        run_id=run.run_id,
        task_id=task_id,
        key="return_value",
        value=list(range(length)),
        mapped_length=length,
    )


@pytest.fixture
def queued_by_evaluations(monkeypatch) -> list[tuple[int, str]]:
    """(run, task_id) of every TI an evaluation queued, from every thread."""
    queued: list[tuple[int, str]] = []
    record = threading.Lock()
    real_evaluate = dependencies.evaluate

    def recording_evaluate(*, dag_run_id, finished_task_ids):
        result = real_evaluate(dag_run_id=dag_run_id, finished_task_ids=finished_task_ids)
        with record:
            queued.extend((dag_run_id, t) for t in result.queued)
        return result

    monkeypatch.setattr(dependencies, "evaluate", recording_evaluate)
    return queued


def _together_in(run_pk: int, **filters: str) -> None:
    """`_together` over the run's TIs that `filters` select."""
    _together(
        list(TaskInstance.objects.filter(dag_run_id=run_pk, **filters).values_list("id", flat=True))
    )


def _together(ti_ids: list) -> None:
    """Succeed the (started) TIs at the same moment, one thread and connection each."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(ti_ids))

    def finisher(ti_id) -> None:
        try:
            barrier.wait()
            _succeed(ti_id)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=finisher, args=(ti_id,)) for ti_id in ti_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


@pytest.mark.django_db(transaction=True)
def test_map_indexes_finishing_together_queue_their_downstream_once(queued_by_evaluations):
    _sync(
        {
            "dag_id": "fan",
            "tasks": [
                {"task_id": "list"},
                {"task_id": "each", "upstream": ["list"], "expand": {"x": {"xcom": "list"}}},
                {"task_id": "sum", "upstream": ["each"]},
            ],
        }
    )
    run_ids = []
    for _ in range(ROUNDS):
        run = runs.trigger_dag(dag_id="fan")
        run_ids.append(run.pk)
        root = TaskInstance.objects.get(dag_run=run, task_id="list")
        _start(root)
        _push(run, "list", WIDTH)
        _succeed(root.id)
        mapped = list(TaskInstance.objects.filter(dag_run=run, task_id="each"))
        assert sorted(ti.map_index for ti in mapped) == list(range(WIDTH))
        for ti in mapped:
            _start(ti)
    queued_by_evaluations.clear()
    for run_pk in run_ids:
        _together_in(run_pk, task_id="each")
    assert sorted(queued_by_evaluations) == sorted((run_pk, "sum") for run_pk in run_ids)
    assert set(TaskInstance.objects.filter(task_id="sum").values_list("state", flat=True)) == {
        TIState.QUEUED
    }


@pytest.mark.django_db(transaction=True)
def test_upstream_finishing_together_expand_their_mapped_downstream_once(queued_by_evaluations):
    _sync(
        {
            "dag_id": "fan_in",
            "tasks": [
                *({"task_id": f"u{i}"} for i in range(WIDTH)),
                {
                    "task_id": "each",
                    "upstream": [f"u{i}" for i in range(WIDTH)],
                    "expand": {"x": {"xcom": "u0"}},
                },
            ],
        }
    )
    run_ids = []
    for _ in range(ROUNDS):
        run = runs.trigger_dag(dag_id="fan_in")
        run_ids.append(run.pk)
        _push(run, "u0", 5)
        for ti in TaskInstance.objects.filter(dag_run=run, state=TIState.QUEUED):
            _start(ti)
    queued_by_evaluations.clear()
    for run_pk in run_ids:
        _together_in(run_pk, task_id__startswith="u")
    assert sorted(queued_by_evaluations) == sorted((run_pk, "each") for run_pk in run_ids)
    for run_pk in run_ids:
        assert sorted(
            TaskInstance.objects.filter(dag_run_id=run_pk, task_id="each").values_list(
                "map_index", "state"
            )
        ) == [(i, TIState.QUEUED) for i in range(5)]


@pytest.mark.django_db(transaction=True)
def test_roots_of_a_mapped_group_expanding_together_expand_the_group_once(queued_by_evaluations):
    """A mapped group over `src`'s return value with WIDTH roots, each also after an unmapped
    task of its own: those finish together, so the roots expand in racing statements, each
    spreading the expansion to the group's other tasks. Every task of the group gets its map
    indexes once (a second INSERT would be a unique violation in a thread), and map index 2 of
    the roots finishing together queues map index 2 of their downstream in the group once."""
    roots = [f"g.r{i}" for i in range(WIDTH)]
    over_src = {"x": {"xcom": "src"}}
    _sync(
        {
            "dag_id": "group",
            "tasks": [
                {"task_id": "src"},
                *({"task_id": f"u{i}"} for i in range(WIDTH)),
                *(
                    {
                        "task_id": root,
                        "upstream": ["src", f"u{i}"],
                        "map_group": "g",
                        "expand": over_src,
                    }
                    for i, root in enumerate(roots)
                ),
                {"task_id": "g.b", "upstream": roots, "map_group": "g", "expand": over_src},
                {"task_id": "g.c", "upstream": ["g.b"], "map_group": "g", "expand": over_src},
            ],
        }
    )
    run_ids = []
    for _ in range(ROUNDS):
        run = runs.trigger_dag(dag_id="group")
        run_ids.append(run.pk)
        src = TaskInstance.objects.get(dag_run=run, task_id="src")
        _start(src)
        _push(run, "src", 5)
        _succeed(src.id)
        for ti in TaskInstance.objects.filter(dag_run=run, task_id__startswith="u"):
            _start(ti)
    queued_by_evaluations.clear()
    for run_pk in run_ids:
        _together_in(run_pk, task_id__startswith="u")
    assert sorted(queued_by_evaluations) == sorted(
        (run_pk, root) for run_pk in run_ids for root in roots
    )
    for run_pk in run_ids:
        group = TaskInstance.objects.filter(dag_run_id=run_pk, task_id__startswith="g.")
        assert sorted(group.values_list("task_id", "map_index", "state")) == sorted(
            [(root, i, TIState.QUEUED) for root in roots for i in range(5)]
            + [(task_id, i, TIState.SCHEDULED) for task_id in ("g.b", "g.c") for i in range(5)]
        )
    queued_by_evaluations.clear()
    for run_pk in run_ids:
        second = TaskInstance.objects.filter(dag_run_id=run_pk, task_id__in=roots, map_index=2)
        for ti in second:
            _start(ti)
        _together(list(second.values_list("id", flat=True)))
    assert sorted(queued_by_evaluations) == sorted((run_pk, "g.b") for run_pk in run_ids)
    for run_pk in run_ids:
        assert sorted(
            TaskInstance.objects.filter(dag_run_id=run_pk, task_id="g.b").values_list(
                "map_index", "state"
            )
        ) == [(i, TIState.QUEUED if i == 2 else TIState.SCHEDULED) for i in range(5)]
