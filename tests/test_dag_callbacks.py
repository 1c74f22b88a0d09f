"""Dag-level callbacks (issue 39): a run's finish writes one callback request, in its own
transaction, for a Dag with the callback of the run's new state (Airflow 3.3.2's
`DagRun.update_state` / the scheduler's timeout: reason, relevant TI); a replay writes nothing;
`bin/airflow-worker` claims requests with SKIP LOCKED and a lease, and reports them once.
Against real PostgreSQL; the stock worker running the callbacks is
tests/compat/test_airflow_worker_dag_callbacks.py."""

import datetime
import threading

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from assets_app.guards import exceptions
from assets_app.models import (
    CallbackState,
    DagCallbackRequest,
    DagRunState,
    TaskInstance,
    TIState,
)
from assets_app.scheduling import dependencies, runs, timeouts
from assets_app.task_state import dag_callbacks, finishing, success
from tests.test_dependencies import sync, ti
from tests.test_fail_fast import start

pytestmark = pytest.mark.django_db

CALLBACKS = {
    "dag_id": "cb",
    "has_on_success_callback": True,
    "has_on_failure_callback": True,
    "tasks": [{"task_id": "a"}, {"task_id": "b"}, {"task_id": "c", "upstream": ["a", "b"]}],
}


def succeed(t) -> None:
    success.succeed(
        ti_id=t.id,
        try_number=t.try_number,
        end_date=timezone.now(),
        task_outlets=[],
        outlet_events=[],
    )


def run_to_success(run) -> None:
    for task_id in ("a", "b", "c"):
        start(ti(run, task_id))
        succeed(ti(run, task_id))


def test_a_run_that_succeeds_writes_one_request_and_a_replay_writes_nothing():
    sync(CALLBACKS)
    run = runs.trigger_dag(dag_id="cb")
    run_to_success(run)
    run.refresh_from_db()
    assert run.state == DagRunState.SUCCESS
    (request,) = DagCallbackRequest.objects.all()
    assert (request.dag_run_id, request.dag_id, request.clear_number) == (run.id, "cb", 0)
    assert (request.is_failure_callback, request.reason) == (False, "success")
    assert request.last_ti_id == ti(run, "c").id  # the success that ended last
    assert request.state == CallbackState.PENDING
    # The last TI's success again, and the finish again: nothing more.
    assert success.succeed(
        ti_id=ti(run, "c").id,
        try_number=1,
        end_date=timezone.now(),
        task_outlets=[],
        outlet_events=[],
    ).replayed
    dependencies.finish_run_if_done(run.id, dag_id="cb", now=timezone.now())
    assert DagCallbackRequest.objects.count() == 1


def test_a_finish_with_a_callback_costs_one_statement_more_and_without_none():
    """Whether the Dag has the callback comes back with the finishing UPDATE (RETURNING): a
    Dag without one pays nothing (tests/test_consecutive_failures.py pins that finish at 3)."""
    for dag_id, wanted in (("cb", True), ("plain", False)):
        sync({**CALLBACKS, "dag_id": dag_id, "has_on_success_callback": wanted})
        run = runs.trigger_dag(dag_id=dag_id)
        TaskInstance.objects.filter(dag_run=run).update(state=TIState.SUCCESS)
        with CaptureQueriesContext(connection) as queries:
            dependencies.finish_run_if_done(run.pk, dag_id=dag_id, now=timezone.now())
        assert len(queries) == (4 if wanted else 3), [q["sql"] for q in queries]
    assert list(DagCallbackRequest.objects.values_list("dag_id", flat=True)) == ["cb"]


def test_a_failed_run_requests_the_failure_callback_with_the_failed_ti():
    sync(CALLBACKS)
    run = runs.trigger_dag(dag_id="cb")
    start(ti(run, "a"))
    succeed(ti(run, "a"))
    start(ti(run, "b"))
    finishing.finish(
        ti_id=ti(run, "b").id, try_number=1, state=TIState.FAILED, end_date=timezone.now()
    )
    run.refresh_from_db()
    assert run.state == DagRunState.FAILED
    (request,) = DagCallbackRequest.objects.all()
    assert (request.is_failure_callback, request.reason) == (True, "task_failure")
    assert request.last_ti_id == ti(run, "b").id


def test_only_the_callback_the_dag_has_is_requested():
    sync({**CALLBACKS, "has_on_success_callback": False})
    run_to_success(runs.trigger_dag(dag_id="cb"))
    sync({**CALLBACKS, "dag_id": "plain", "has_on_success_callback": False})
    run_to_success(runs.trigger_dag(dag_id="plain"))
    assert DagCallbackRequest.objects.count() == 0


def test_a_cleared_run_finishing_again_is_a_new_state_change():
    sync(CALLBACKS)
    run = runs.trigger_dag(dag_id="cb")
    run_to_success(run)
    runs.clear_dag_run(dag_id="cb", run_id=run.run_id, dry_run=False)
    run_to_success(run)
    assert sorted(DagCallbackRequest.objects.values_list("clear_number", flat=True)) == [0, 1]


def test_a_timed_out_run_requests_the_failure_callback_with_its_last_started_ti():
    sync({**CALLBACKS, "dagrun_timeout_seconds": 60})
    run = runs.trigger_dag(dag_id="cb")
    start(ti(run, "a"))
    start(ti(run, "b"))
    timeouts.time_out_due_runs(now=timezone.now() + datetime.timedelta(hours=1))
    run.refresh_from_db()
    assert run.state == DagRunState.FAILED
    (request,) = DagCallbackRequest.objects.all()
    assert (request.is_failure_callback, request.reason) == (True, "timed_out")
    assert request.last_ti_id == ti(run, "b").id  # started last
    assert ti(run, "b").state == TIState.SKIPPED


def _requests(count: int) -> list[int]:
    sync(CALLBACKS)
    for _ in range(count):
        run_to_success(runs.trigger_dag(dag_id="cb"))
    return sorted(DagCallbackRequest.objects.values_list("id", flat=True))


def test_a_lease_hides_a_claimed_request_until_it_ends_then_reports_are_per_attempt(settings):
    (pk,) = _requests(1)
    (claimed,) = dag_callbacks.claim(claimed_by="w1", limit=10)
    assert (claimed.request.id, claimed.attempt, claimed.dag_run.state) == (pk, 1, "success")
    assert claimed.last_ti is not None and claimed.last_ti.task_id == "c"
    assert dag_callbacks.claim(claimed_by="w2", limit=10) == []  # leased to w1
    # w1 dies: its lease ends and w2 gets it, as attempt 2.
    DagCallbackRequest.objects.filter(id=pk).update(
        lease_until=timezone.now() - datetime.timedelta(seconds=1)
    )
    (again,) = dag_callbacks.claim(claimed_by="w2", limit=10)
    assert again.attempt == 2
    with pytest.raises(exceptions.InvalidState):  # w1's late report of attempt 1
        dag_callbacks.report(request_id=pk, attempt=1, state="success")
    done = dag_callbacks.report(request_id=pk, attempt=2, state="failed", error="Boom")
    assert (done.state, done.replayed) == ("failed", False)
    replay = dag_callbacks.report(request_id=pk, attempt=2, state="failed", error="Boom")
    assert replay.replayed
    with pytest.raises(exceptions.InvalidState):
        dag_callbacks.report(request_id=pk, attempt=2, state="success")
    request = DagCallbackRequest.objects.get(id=pk)
    assert (request.state, request.last_error, request.claimed_by) == ("failed", "Boom", "w2")
    assert dag_callbacks.claim(claimed_by="w3", limit=10) == []  # ended: never due again
    with pytest.raises(exceptions.NotFound):
        dag_callbacks.report(request_id=pk + 1000, attempt=1, state="success")


def test_a_request_claimed_max_attempts_times_without_a_report_is_parked(settings):
    settings.DAG_CALLBACK_LEASE_SECONDS = -1  # every claim's lease has ended at once
    settings.DAG_CALLBACK_MAX_ATTEMPTS = 2
    (pk,) = _requests(1)
    assert [c.attempt for c in dag_callbacks.claim(claimed_by="w", limit=1)] == [1]
    assert [c.attempt for c in dag_callbacks.claim(claimed_by="w", limit=1)] == [2]
    assert dag_callbacks.claim(claimed_by="w", limit=1) == []
    request = DagCallbackRequest.objects.get(id=pk)
    assert (request.state, request.attempts) == (CallbackState.PARKED, 2)
    assert "without a report" in request.last_error


@pytest.mark.django_db(transaction=True)
def test_concurrent_claims_never_share_a_request():
    """Four threads claim 3 at a time until nothing is left: each request exactly once."""
    ids = _requests(12)
    got: list[list[int]] = []
    barrier = threading.Barrier(4)

    def worker(name: str) -> None:
        mine: list[int] = []
        try:
            barrier.wait()
            while batch := dag_callbacks.claim(claimed_by=name, limit=3):
                mine += [c.request.id for c in batch]
        finally:
            connection.close()
        got.append(mine)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    claimed = [pk for mine in got for pk in mine]
    assert sorted(claimed) == ids
