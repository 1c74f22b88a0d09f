"""Database faults: the drain's connection is terminated mid-batch, and registration (and the
success hand-off) hits a lock timeout. Each recovers with nothing lost and nothing doubled.
"""

import random
import threading
import time

import psycopg
import pytest
from django.db import DatabaseError, connection, connections, transaction

from assets_app.models import AssetEvent, AssetEventQueue, TaskInstance
from assets_app.operations import metrics
from assets_app.outbox import drain
from assets_app.outbox import rows as outbox

from .conftest import (
    database_url,
    figure,
    make_running_tis,
    make_scheduled_dag,
    run_in_threads,
    wait_until,
)
from .workers import succeed_ti

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def no_yielding(settings):
    """These threads poll the database busily; the drain must not wait for them here."""
    settings.ASSET_DRAIN_YIELD_MAX_SECONDS = 0


ASSETS = [f"fault-{i}" for i in range(10)]


def _events_by_ti() -> dict:
    got: dict = {}
    for ti_id, name in AssetEvent.objects.values_list("source_ti_id", "asset__name"):
        got.setdefault(ti_id, []).append(name)
    return {k: sorted(v) for k, v in got.items()}


def _backend_registering_a_batch(pid: int) -> bool:
    """The backend is inside a batch transaction, registering: it holds its outbox rows (FOR
    UPDATE) and has inserted asset events. The claim transaction before it also locks outbox
    rows but writes no event; a termination there leaves no claim behind, and a run whose
    three terminations all landed there proved nothing about a killed batch (issue 13,
    finding 7: it failed `assert died` at random)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT count(DISTINCT c.relname) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
            WHERE l.granted AND l.pid = %s AND (
              (c.relname = 'assets_app_asseteventqueue' AND l.mode = 'RowShareLock')
              OR (c.relname = 'assets_app_assetevent' AND l.mode = 'RowExclusiveLock'))
            """,
            [pid],
        )
        return cursor.fetchone()[0] == 2


def _claims() -> set:
    """(row, claim stamp) of every claim left behind: one per attempt that died."""
    return set(
        AssetEventQueue.objects.filter(claimed_at__isnull=False).values_list("id", "claimed_at")
    )


def test_terminated_drain_connection_mid_batch_rolls_back_and_recovers(caplog, monkeypatch):
    """pg_terminate_backend on the drain's session while its batch transaction is open, 3 times;
    right after each, every outbox row still queued has no events and every row gone has all of
    them, and no row was retried one by one on the dead session (however the termination
    surfaced: in a statement, in the savepoint's rollback, at COMMIT); a later drain counts
    the attempts that died (exactly the rows a killed batch had claimed) and registers the rest
    exactly once."""
    # One drain at a time here: a claim with no lock behind it is dead at once.
    monkeypatch.setattr(outbox, "CLAIM_GRACE_SECONDS", 0.0)
    make_scheduled_dag("fault_downstream", {"any": ASSETS})
    tis = make_running_tis("fault_producer", 800)
    rng = random.Random(3)
    outlets = {ti.id: rng.sample(ASSETS, 8) for ti in tis}
    for ti in tis:
        succeed_ti(ti, [{"name": a, "uri": a} for a in outlets[ti.id]])
    assert AssetEventQueue.objects.count() == len(tis)

    terminations = 0
    errors: list[str] = []
    died: set = set()
    for _ in range(3):
        pid_box: list[int] = []
        ready = threading.Event()

        def drainer(pid_box: list[int] = pid_box, ready: threading.Event = ready) -> None:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                pid_box.append(cursor.fetchone()[0])
            ready.set()
            try:
                while drain.drain(batch_size=50, time_budget=30).claimed:
                    pass
            except DatabaseError as exc:
                errors.append(type(exc).__name__)

        def terminator(pid_box: list[int] = pid_box, ready: threading.Event = ready) -> None:
            nonlocal terminations
            assert ready.wait(10)
            pid = pid_box[0]
            wait_until(lambda: _backend_registering_a_batch(pid), timeout=10, interval=0)
            # Somewhere in the batch (a statement, a savepoint's rollback, the COMMIT), still in it.
            time.sleep(random.uniform(0.0, 0.02))
            wait_until(lambda: _backend_registering_a_batch(pid), timeout=10, interval=0)
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
                terminations += cursor.fetchone()[0]

        run_in_threads([drainer, terminator], timeout=60)

        # Atomicity at the moment of the crash: a row is either still queued with no events,
        # or gone with all of its events.
        queued = set(AssetEventQueue.objects.values_list("ti_id", flat=True))
        by_ti = _events_by_ti()
        assert queued, "the drain finished before it was terminated"
        assert not queued & set(by_ti)
        assert by_ti == {ti.id: sorted(outlets[ti.id]) for ti in tis if ti.id not in queued}
        # Killed in its batch transaction, a drain leaves its claims behind (killed in the claim
        # transaction itself, it leaves none new); the next drain counts those attempts.
        died |= _claims()

    assert terminations == 3
    assert len(errors) == 3
    # A dead session is not retried row by row (every row would fail the same way).
    assert not [r for r in caplog.records if " failed: " in r.getMessage()]
    while drain.drain(batch_size=50).claimed:
        pass
    figure(
        f"db faults: {terminations} drain connections terminated mid-batch ({errors}); "
        f"{len(died)} attempts that died counted"
    )
    assert died
    assert metrics.value(metrics.FAILED_ATTEMPTS) == len(died)
    assert AssetEventQueue.objects.count() == 0
    assert _events_by_ti() == {ti.id: sorted(outlets[ti.id]) for ti in tis}


def _terminate_and_wait(pid: int) -> None:
    """Terminate a backend from another session and wait until it is gone."""
    with psycopg.connect(database_url(), autocommit=True) as other:
        assert other.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]
        deadline = time.monotonic() + 10
        while other.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone():
            assert time.monotonic() < deadline, "the backend did not exit"
            time.sleep(0.01)


def test_a_row_whose_drain_is_killed_mid_batch_has_its_attempt_counted_and_parks(
    settings, monkeypatch
):
    """Each drain of the row loses its session just before COMMIT (the row is registered, its
    transaction open): nothing commits, but the attempt is counted by the next drain, so a row
    that always kills its drain is parked after ASSET_QUEUE_MAX_ATTEMPTS with the reason; between
    attempts no drain holds it, so the operator's Park works; requeued, it registers once."""
    settings.ASSET_QUEUE_MAX_ATTEMPTS = 2
    monkeypatch.setattr(outbox, "CLAIM_GRACE_SECONDS", 0.0)
    (ti,) = make_running_tis("fault_killed_producer", 1)
    succeed_ti(ti, [{"name": a, "uri": a} for a in ASSETS[:3]])
    (row,) = AssetEventQueue.objects.all()

    def kill_own_session(rows) -> None:
        _terminate_and_wait(connection.connection.info.backend_pid)

    def drain_killed() -> None:
        monkeypatch.setattr(drain, "_before_commit", kill_own_session)
        with pytest.raises(DatabaseError):
            drain.drain()
        monkeypatch.setattr(drain, "_before_commit", lambda rows: None)
        connections.close_all()

    drain_killed()  # attempt 1 dies
    row.refresh_from_db()
    assert (row.attempts, row.parked_at, row.last_error) == (0, None, "")
    assert row.claimed_at is not None
    drain_killed()  # counts attempt 1, retries the row alone: attempt 2 dies
    row.refresh_from_db()
    assert (row.attempts, row.parked_at) == (1, None)
    assert row.last_error_type == outbox.DRAIN_DIED_TYPE
    assert "died" in row.last_error
    result = drain.drain()  # counts attempt 2: the maximum, so the row parks
    assert (result.claimed, result.failed, result.parked) == (0, 1, 1)
    row.refresh_from_db()
    assert row.attempts == 2 and row.parked_at is not None and row.claimed_at is None
    assert not AssetEvent.objects.exists()

    assert outbox.requeue(row_ids=[row.id]) == [row.id]
    drain_killed()
    assert outbox.park(row_ids=[row.id]) == [row.id]  # no drain holds it: Park works
    assert outbox.requeue(row_ids=[row.id]) == [row.id]
    drain.drain()
    assert not AssetEventQueue.objects.exists()
    assert _events_by_ti() == {ti.id: sorted(ASSETS[:3])}


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
            drain.drain()
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
        drain.drain()
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
