"""Database faults: the drain's connection is terminated mid-batch, and registration (and the
success hand-off) hits a lock timeout. Each recovers with nothing lost and nothing doubled.
"""

import random
import threading
import time

import pytest
from django.db import DatabaseError, connection, connections, transaction

from assets_app import outbox
from assets_app.models import AssetEvent, AssetEventQueue, TaskInstance

from .conftest import figure, make_running_tis, make_scheduled_dag, run_in_threads, wait_until
from .workers import succeed_ti

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ASSETS = [f"fault-{i}" for i in range(10)]


def _events_by_ti() -> dict:
    got: dict = {}
    for ti_id, name in AssetEvent.objects.values_list("source_ti_id", "asset__name"):
        got.setdefault(ti_id, []).append(name)
    return {k: sorted(v) for k, v in got.items()}


def _backend_holds_outbox_row_locks(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
            WHERE c.relname = 'assets_app_asseteventqueue' AND l.mode = 'RowShareLock'
              AND l.granted AND l.pid = %s
            """,
            [pid],
        )
        return cursor.fetchone()[0] > 0


def test_terminated_drain_connection_mid_batch_rolls_back_and_recovers(caplog):
    """pg_terminate_backend on the drain's session while its batch transaction is open, 3 times;
    right after each, every outbox row still queued has no events and every row gone has all of
    them; a later drain registers the rest exactly once."""
    make_scheduled_dag("fault_downstream", {"any": ASSETS})
    tis = make_running_tis("fault_producer", 800)
    rng = random.Random(3)
    outlets = {ti.id: rng.sample(ASSETS, 8) for ti in tis}
    for ti in tis:
        succeed_ti(ti, [{"name": a, "uri": a} for a in outlets[ti.id]])
    assert AssetEventQueue.objects.count() == len(tis)

    terminations = 0
    errors: list[str] = []
    for _ in range(3):
        pid_box: list[int] = []
        ready = threading.Event()

        def drainer(pid_box: list[int] = pid_box, ready: threading.Event = ready) -> None:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                pid_box.append(cursor.fetchone()[0])
            ready.set()
            try:
                while outbox.drain(batch_size=50, time_budget=30).claimed:
                    pass
            except DatabaseError as exc:
                errors.append(type(exc).__name__)

        def terminator(pid_box: list[int] = pid_box, ready: threading.Event = ready) -> None:
            nonlocal terminations
            assert ready.wait(10)
            time.sleep(random.uniform(0.0, 0.05))
            wait_until(lambda: _backend_holds_outbox_row_locks(pid_box[0]), timeout=10, interval=0)
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid_box[0]])
                terminations += cursor.fetchone()[0]

        run_in_threads([drainer, terminator], timeout=60)

        # Atomicity at the moment of the crash: a row is either still queued with no events,
        # or gone with all of its events.
        queued = set(AssetEventQueue.objects.values_list("ti_id", flat=True))
        by_ti = _events_by_ti()
        assert queued, "the drain finished before it was terminated"
        assert not queued & set(by_ti)
        assert by_ti == {ti.id: sorted(outlets[ti.id]) for ti in tis if ti.id not in queued}

    assert terminations == 3
    assert len(errors) == 3
    # A dead session is not retried row by row (every row would fail the same way).
    assert not [r for r in caplog.records if "outbox row" in r.getMessage()]
    while outbox.drain(batch_size=50).claimed:
        pass
    figure(f"db faults: {terminations} drain connections terminated mid-batch ({errors})")
    assert AssetEventQueue.objects.count() == 0
    assert _events_by_ti() == {ti.id: sorted(outlets[ti.id]) for ti in tis}


def _queue_three_rows_one_on_a_locked_asset() -> tuple[list, dict]:
    make_scheduled_dag("fault_lock_downstream", {"any": ["locked", "free-1", "free-2"]})
    tis = make_running_tis("fault_lock_producer", 3)
    outlets = {tis[0].id: ["locked"], tis[1].id: ["free-1"], tis[2].id: ["free-2", "free-1"]}
    for ti in tis:
        succeed_ti(ti, [{"name": a, "uri": a} for a in outlets[ti.id]])
    return tis, outlets


def _drain_while_asset_locked() -> list[Exception]:
    """Drain once with lock_timeout 300 ms while another transaction holds the asset 'locked'
    FOR UPDATE (which blocks the FOR KEY SHARE an event insert's foreign key check needs)."""
    holding = threading.Event()
    release = threading.Event()
    raised: list[Exception] = []

    def holder() -> None:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT id FROM assets_app_asset WHERE name = 'locked' FOR UPDATE")
            holding.set()
            assert release.wait(30)

    def drainer() -> None:
        assert holding.wait(10)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '300ms'")
        try:
            outbox.drain()
        except DatabaseError as exc:
            raised.append(exc)
        finally:
            release.set()

    run_in_threads([holder, drainer], timeout=60)
    return raised


def test_registration_lock_timeout_recovers_with_nothing_lost(settings):
    """Registration cannot take a lock it needs before lock_timeout: whatever the drain does with
    that (fail the batch or only the row), nothing is half-written, and once the lock is gone
    every row is registered exactly once."""
    settings.ASSET_QUEUE_BACKOFF_BASE_SECONDS = 0.2
    settings.ASSET_QUEUE_BACKOFF_CAP_SECONDS = 0.2
    tis, outlets = _queue_three_rows_one_on_a_locked_asset()
    raised = _drain_while_asset_locked()

    queued = set(AssetEventQueue.objects.values_list("ti_id", flat=True))
    assert tis[0].id in queued
    by_ti = _events_by_ti()
    assert not queued & set(by_ti)
    assert by_ti == {ti.id: sorted(outlets[ti.id]) for ti in tis if ti.id not in queued}
    figure(
        f"db faults: lock timeout during registration -> "
        f"{[type(e.__cause__).__name__ for e in raised] or 'row failure recorded'}, "
        f"{len(queued)} row(s) kept queued"
    )

    def drained() -> bool:
        outbox.drain()
        return not AssetEventQueue.objects.exists()

    wait_until(drained, timeout=10, interval=0.1)
    assert _events_by_ti() == {ti.id: sorted(outlets[ti.id]) for ti in tis}


def test_registration_lock_timeout_fails_only_that_row(settings):
    """Invariant 6: a failing row never blocks other rows, and its failure is kept as data."""
    settings.ASSET_QUEUE_BACKOFF_BASE_SECONDS = 0.2
    settings.ASSET_QUEUE_BACKOFF_CAP_SECONDS = 0.2
    tis, _ = _queue_three_rows_one_on_a_locked_asset()
    raised = _drain_while_asset_locked()

    assert raised == []
    row = AssetEventQueue.objects.get()
    assert row.ti_id == tis[0].id
    assert row.attempts == 1
    assert row.parked_at is None
    assert row.last_error_type == "django.db.utils.OperationalError"
    assert "lock timeout" in row.last_error
    assert _events_by_ti() == {tis[1].id: ["free-1"], tis[2].id: ["free-1", "free-2"]}


def test_success_lock_timeout_writes_nothing_and_the_retry_succeeds_once():
    """The TI row is locked by another transaction; a success with lock_timeout 300 ms fails
    with nothing written (TI still running, no outbox row); the retry succeeds with one row."""
    (ti,) = make_running_tis("fault_ti_producer", 1)
    holding = threading.Event()
    release = threading.Event()
    failures: list[str] = []

    def holder() -> None:
        with transaction.atomic():
            TaskInstance.objects.select_for_update().get(id=ti.id)
            holding.set()
            assert release.wait(30)

    def worker() -> None:
        assert holding.wait(10)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '300ms'")
        try:
            succeed_ti(ti, [{"name": "fault-ti", "uri": "fault-ti"}])
        except DatabaseError as exc:
            failures.append(type(exc.__cause__).__name__)
        finally:
            release.set()
        assert TaskInstance.objects.get(id=ti.id).state == "running"
        assert not AssetEventQueue.objects.exists()

    run_in_threads([holder, worker], timeout=60)
    connections.close_all()
    assert failures == ["LockNotAvailable"]
    assert not succeed_ti(ti, [{"name": "fault-ti", "uri": "fault-ti"}]).replayed
    assert succeed_ti(ti, [{"name": "fault-ti", "uri": "fault-ti"}]).replayed
    assert TaskInstance.objects.get(id=ti.id).state == "success"
    assert AssetEventQueue.objects.filter(ti_id=ti.id).count() == 1
