"""Invariants 1 and 9: what runs while the TI row lock is held is flat in the number of outlets
and of consumed events; ti_run's total query count is flat in the number of consumed events.

The statements "under the lock" are captured with `connection.execute_wrapper`: every statement
from the `SELECT ... FOR UPDATE` of the TI up to the end of the transaction that took it
(`connection.in_atomic_block` turning false marks the COMMIT). These tests commit for real
(`transaction=True`), so the transaction boundaries are the production ones.
"""

import threading
from contextlib import contextmanager
from datetime import datetime

import pytest
from django.db import OperationalError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from assets_app.models import (
    AssetAliasEvent,
    AssetEvent,
    AssetEventQueue,
    DagRun,
    DagRunAssetEvent,
    DagRunState,
    TaskInstance,
    TIState,
)
from assets_app.task_state import finishing, retries, starting, success
from tests.factories import AssetAliasFactory, AssetFactory, TaskInstanceFactory

START = datetime.fromisoformat("2026-06-30T10:00:00+00:00")


class StatementLog:
    def __init__(self) -> None:
        self.entries: list[tuple[str, bool]] = []

    def __call__(self, execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        self.entries.append((sql, context["connection"].in_atomic_block))
        return result

    def under_ti_lock(self) -> list[str]:
        """Statements from each statement that locks a TI row (a `FOR UPDATE` on the TI table,
        or an UPDATE of it) until its transaction ended."""
        held: list[str] = []
        holding = False
        for sql, in_transaction in self.entries:
            if not in_transaction:
                holding = False
            elif ('FROM "assets_app_taskinstance"' in sql and "FOR UPDATE" in sql) or (
                sql.startswith('UPDATE "assets_app_taskinstance"')
            ):
                holding = True
            if holding:
                held.append(sql)
        return held


@contextmanager
def statement_log():
    log = StatementLog()
    with connection.execute_wrapper(log):
        yield log


def kinds(statements: list[str]) -> list[str]:
    return [
        "SELECT FOR UPDATE" if "FOR UPDATE" in sql else sql.split(None, 1)[0].upper()
        for sql in statements
    ]


def outlets(n: int) -> tuple[list[dict], list[dict]]:
    profiles = [{"name": f"o{i}", "uri": f"s3://b/o{i}", "type": "Asset"} for i in range(n)]
    events = [
        {"dest_asset_key": {"name": f"o{i}", "uri": f"s3://b/o{i}"}, "extra": {"i": i}}
        for i in range(n)
    ]
    return profiles, events


def succeed_and_log(n_outlets: int) -> list[str]:
    ti = TaskInstanceFactory(running=True)
    profiles, events = outlets(n_outlets)
    with statement_log() as log:
        change = success.succeed(
            ti_id=ti.id,
            try_number=ti.try_number,
            end_date=timezone.now(),
            task_outlets=profiles,
            outlet_events=events,
        )
    assert change.state == TIState.SUCCESS and not change.replayed
    return log.under_ti_lock()


@pytest.mark.django_db(transaction=True)
def test_queue_mode_success_holds_the_lock_for_one_statement_whatever_the_outlets(settings):
    settings.ASSET_REGISTRATION_MODE = "queue"

    one = succeed_and_log(1)
    thousand = succeed_and_log(1000)

    # The outbox row is inserted in the same transaction, just before the lock is taken by the
    # conditional UPDATE itself (running, same try -> success); then only COMMIT.
    assert kinds(one) == ["UPDATE"]
    assert kinds(thousand) == kinds(one)
    assert AssetEventQueue.objects.count() == 2
    assert AssetEvent.objects.count() == 0  # nothing registered under (or with) the lock


@pytest.mark.django_db(transaction=True)
def test_inline_mode_success_registers_before_the_lock_and_holds_it_for_two_statements(
    settings,
):
    settings.ASSET_REGISTRATION_MODE = "inline"

    one = succeed_and_log(1)
    thousand = succeed_and_log(1000)

    assert kinds(one) == ["SELECT FOR UPDATE", "UPDATE"]
    assert kinds(thousand) == kinds(one)
    assert AssetEventQueue.objects.count() == 0
    assert AssetEvent.objects.count() == 1001


def _fail(ti) -> None:
    finishing.finish(ti_id=ti.id, try_number=ti.try_number, state="failed", end_date=START)


def _skip(ti) -> None:
    finishing.finish(ti_id=ti.id, try_number=ti.try_number, state="skipped", end_date=START)


def _retry_without_tries_left(ti) -> None:
    retries.retry(ti_id=ti.id, try_number=ti.try_number, end_date=START)


def _retry_with_a_try_left(ti) -> None:
    retries.retry(ti_id=ti.id, try_number=ti.try_number, end_date=START)


@pytest.mark.parametrize(
    ("finish", "max_tries", "run_state"),
    [
        (_fail, 0, DagRunState.FAILED),
        (_skip, 0, DagRunState.SUCCESS),
        (_retry_without_tries_left, 0, DagRunState.FAILED),
        (_retry_with_a_try_left, 1, None),
    ],
    ids=["failed", "skipped", "retry-exhausted", "retry"],
)
@pytest.mark.django_db(transaction=True)
def test_a_finish_other_than_success_holds_the_lock_for_two_statements(
    finish, max_tries, run_state
):
    """What follows the finish (downstream evaluation, the run's finish and its webhook
    messages) runs after the commit: the lock covers only the locking read and the UPDATE.
    A retry with a try left queues the next try in that same UPDATE."""
    ti = TaskInstanceFactory(running=True, max_tries=max_tries)
    before = DagRun.objects.get(id=ti.dag_run_id).state
    with statement_log() as log:
        finish(ti)
    assert kinds(log.under_ti_lock()) == ["SELECT FOR UPDATE", "UPDATE"]
    if run_state is None:  # a retry: the TI's next try waits for its delay, its run goes on
        tried = ti.try_number
        ti.refresh_from_db()
        assert (ti.state, ti.try_number) == (TIState.QUEUED, tried + 1)  # the next try, delayed
        assert DagRun.objects.get(id=ti.dag_run_id).state == before
    else:  # the follow-up did run (the run's only TI finished it), just not under the lock
        assert DagRun.objects.get(id=ti.dag_run_id).state == run_state


def make_consumed_events(ti, n: int) -> None:
    assets = [AssetFactory(name=f"c{i}") for i in range(3)]
    alias = AssetAliasFactory(name="via")
    events = AssetEvent.objects.bulk_create(
        AssetEvent(asset=assets[i % 3], extra={"i": i}, source_dag_id="up") for i in range(n)
    )
    DagRunAssetEvent.objects.bulk_create(
        DagRunAssetEvent(dag_run=ti.dag_run, dag=ti.dag_run.dag, asset_event=e) for e in events
    )
    AssetAliasEvent.objects.bulk_create(
        AssetAliasEvent(alias=alias, asset_event=e) for e in events[::2]
    )


def start_and_log(n_events: int) -> tuple[list[str], int, starting.RunContext]:
    ti = TaskInstanceFactory()
    make_consumed_events(ti, n_events)
    with statement_log() as log:
        context = starting.start(
            ti_id=ti.id,
            try_number=ti.try_number,
            hostname="h",
            unixname="u",
            pid=1,
            start_date=START,
        )
    return log.under_ti_lock(), len(log.entries), context


@pytest.mark.django_db(transaction=True)
def test_ti_run_holds_the_lock_for_two_statements_and_runs_a_fixed_number_of_queries():
    held_one, total_one, context_one = start_and_log(1)
    held_many, total_many, context_many = start_and_log(5000)

    assert kinds(held_one) == ["SELECT FOR UPDATE", "UPDATE"]
    assert kinds(held_many) == kinds(held_one)
    assert total_many == total_one
    assert len(context_one.consumed_events) == 1
    assert len(context_many.consumed_events) == 5000
    aliased = [e for e in context_many.consumed_events if e.source_alias_names == ("via",)]
    assert len(aliased) == 2500  # read in one query: none per event


@pytest.mark.parametrize("n_events", [1, 5000])
@pytest.mark.django_db
def test_ti_run_total_query_count_is_pinned(django_assert_num_queries, n_events):
    ti = TaskInstanceFactory()
    make_consumed_events(ti, n_events)
    # SAVEPOINT, SELECT FOR UPDATE, UPDATE, RELEASE (the durable atomic inside the test's
    # transaction), then run -> running, DagRun, events joined with assets, source aliases,
    # the XCom keys of an earlier try and this try's reschedule count.
    with django_assert_num_queries(10):
        context = starting.start(
            ti_id=ti.id,
            try_number=ti.try_number,
            hostname="h",
            unixname="u",
            pid=1,
            start_date=START,
        )
    assert len(context.consumed_events) == n_events


@pytest.mark.django_db
def test_ti_run_http_response_query_count_is_flat(worker_api):
    """The HTTP layer adds nothing per event either (serialisation uses the prefetched rows)."""
    counts = []
    for n in (1, 300):
        ti = TaskInstanceFactory()
        make_consumed_events(ti, n)
        with CaptureQueriesContext(connection) as ctx:
            response = worker_api.request(
                "PATCH",
                f"/task-instances/{ti.id}/run",
                {
                    "state": "running",
                    "hostname": "h",
                    "unixname": "u",
                    "pid": 1,
                    "start_date": START.isoformat(),
                },
                ti_id=ti.id,
            )
        assert response.status_code == 200
        assert len(response.json()["dag_run"]["consumed_asset_events"]) == n
        counts.append(len(ctx.captured_queries))
        AssetEvent.objects.all().delete()
    assert counts[0] == counts[1]


@pytest.mark.django_db(transaction=True)
def test_inline_mode_never_waits_on_foreign_key_checks_while_holding_the_ti_lock(settings):
    """Foreign keys are checked as registration inserts run, before the TI lock: an event whose
    asset row is locked elsewhere makes the success wait with the TI row still free."""
    settings.ASSET_REGISTRATION_MODE = "inline"
    ti = TaskInstanceFactory(running=True)
    asset = AssetFactory(name="held", uri="s3://b/held")
    holding, release = threading.Event(), threading.Event()
    outcome: list = []

    def hold_asset() -> None:
        try:
            with transaction.atomic():
                list(type(asset).objects.select_for_update().filter(id=asset.id))
                holding.set()
                assert release.wait(20)
        finally:
            connection.close()

    def succeed() -> None:
        try:
            profile = {"name": "held", "uri": "s3://b/held", "type": "Asset"}
            change = success.succeed(
                ti_id=ti.id,
                try_number=ti.try_number,
                end_date=timezone.now(),
                task_outlets=[profile],
                outlet_events=[],
            )
            outcome.append(change.state)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_asset)
    holder.start()
    assert holding.wait(10)
    worker = threading.Thread(target=succeed)
    worker.start()
    try:
        worker.join(1.0)
        assert worker.is_alive(), "the success should be waiting on the held asset row"
        with transaction.atomic():
            try:
                locked = list(TaskInstance.objects.select_for_update(nowait=True).filter(id=ti.id))
            except OperationalError:
                locked = None
        assert locked, "the TI row was locked while the success waited on a foreign key check"
    finally:
        release.set()
        holder.join(20)
        worker.join(20)
    assert outcome == [TIState.SUCCESS]


@pytest.mark.django_db(transaction=True)
def test_reschedule_inserts_its_row_before_the_lock_and_holds_it_for_one_statement():
    ti = TaskInstanceFactory(running=True)
    when = timezone.now()
    with statement_log() as log:
        change = retries.reschedule(
            ti_id=ti.id, try_number=ti.try_number, reschedule_date=when, end_date=when
        )
    assert change.state == TIState.QUEUED
    # The TaskReschedule INSERT runs before the conditional UPDATE that takes the lock.
    assert kinds(log.under_ti_lock()) == ["UPDATE"]
    ti.refresh_from_db()
    assert (ti.state, ti.retry_at, ti.reschedules.count()) == (TIState.QUEUED, when, 1)
