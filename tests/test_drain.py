import io
import uuid
from datetime import timedelta

import psycopg
import pytest
from django.core.management import call_command
from django.db import DataError, IntegrityError, OperationalError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from assets_app.catalog import asset_events
from assets_app.cluster import nudges
from assets_app.models import (
    Asset,
    AssetDagRunQueue,
    AssetEvent,
    AssetEventQueue,
    AuditEntry,
    ComponentHeartbeat,
    DagRun,
    DagRunType,
    TaskInstance,
    TIState,
)
from assets_app.operations import metrics
from assets_app.outbox import drain
from assets_app.outbox import rows as outbox
from assets_app.registration import outlets as registration
from tests.asset_flow import asset_event, asset_outlet, outbox_row, payload, scheduled_dag
from tests.factories import AssetFactory, TaskFactory, TaskInstanceFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def fast_retries(settings):
    settings.ASSET_QUEUE_MAX_ATTEMPTS = 3
    settings.ASSET_QUEUE_BACKOFF_BASE_SECONDS = 0.0
    settings.ASSET_QUEUE_BACKOFF_CAP_SECONDS = 0.0
    return settings


def poison_row() -> AssetEventQueue:
    """A row whose outlet conflicts with an existing asset (same name, other uri)."""
    AssetFactory(name="taken", uri="s3://taken")
    return outbox_row(
        payload(outlets=[{"name": "taken", "uri": "s3://other", "type": "Asset"}], task_id="bad")
    )


class Flaky:
    """Registration of the asset "flaky" fails with a lock timeout (a transient database error)
    while `failing` is set: the real drain path, with the database refusing at one step."""

    def __init__(self, monkeypatch):
        self.failing = True
        real = registration._resolve_assets

        def resolve(wanted):
            if self.failing and any(name == "flaky" for name, _ in wanted):
                raise OperationalError("canceling statement due to lock timeout")
            return real(wanted)

        monkeypatch.setattr(registration, "_resolve_assets", resolve)


@pytest.fixture
def flaky(monkeypatch):
    return Flaky(monkeypatch)


def transient_row() -> AssetEventQueue:
    return outbox_row(
        payload(outlets=[{"name": "flaky", "uri": "s3://flaky", "type": "Asset"}], task_id="bad")
    )


def test_success_becomes_events_adrq_and_a_downstream_run(django_capture_on_commit_callbacks):
    orders = AssetFactory(name="orders")
    dag = scheduled_dag("report", "orders")
    TaskFactory(dag=dag, task_id="build")
    row = outbox_row(
        payload(outlets=[asset_outlet(orders)], outlet_events=[asset_event(orders, {"n": 5})])
    )
    with django_capture_on_commit_callbacks(execute=True):
        result = drain.drain()
    assert (result.claimed, result.registered, result.events_written) == (1, 1, 1)
    assert result.runs_triggered == 1
    assert not AssetEventQueue.objects.filter(id=row.id).exists()
    event = AssetEvent.objects.get()
    assert event.extra == {"n": 5}
    run = DagRun.objects.get(dag=dag)
    assert run.run_type == DagRunType.ASSET_TRIGGERED
    assert run.run_after == event.timestamp
    assert list(run.consumed_events.values_list("id", flat=True)) == [event.id]
    assert list(run.task_instances.values_list("task_id", "state")) == [("build", TIState.QUEUED)]
    assert AssetDagRunQueue.objects.count() == 0
    assert metrics.value(metrics.REGISTERED) == 1
    assert metrics.value(metrics.EVENTS_WRITTEN) == 1
    assert metrics.value(metrics.RUNS_TRIGGERED) == 1
    heartbeat = ComponentHeartbeat.objects.get(component="drain")
    assert heartbeat.last_ok_at == heartbeat.last_run_at
    assert heartbeat.detail["registered"] == 1


def test_row_whose_ti_was_deleted_is_registered_from_its_payload():
    orders = AssetFactory(name="orders")
    ti = TaskInstanceFactory(running=True, task_id="produce", map_index=4, try_number=2)
    outbox.enqueue(ti=ti, outlets=[asset_outlet(orders)], outlet_events=[], end_date=timezone.now())
    ti_id, dag_id, run_id = ti.id, ti.dag_id, ti.run_id
    ti.dag_run.delete()
    assert not TaskInstance.objects.filter(id=ti_id).exists()
    drain.drain()
    event = AssetEvent.objects.get()
    assert (
        event.source_ti_id,
        event.source_dag_id,
        event.source_run_id,
        event.source_task_id,
        event.source_map_index,
        event.source_try_number,
    ) == (ti_id, dag_id, run_id, "produce", 4, 2)
    assert AssetEventQueue.objects.count() == 0


def test_failure_records_error_and_backs_off_within_the_jitter_window(settings, flaky):
    settings.ASSET_QUEUE_BACKOFF_BASE_SECONDS = 10.0
    settings.ASSET_QUEUE_BACKOFF_CAP_SECONDS = 15.0
    row = transient_row()
    before = timezone.now()
    result = drain.drain()
    after = timezone.now()
    assert (result.claimed, result.registered, result.failed, result.parked) == (1, 0, 1, 0)
    row.refresh_from_db()
    assert row.attempts == 1
    assert row.parked_at is None
    assert row.last_error == "OperationalError: canceling statement due to lock timeout"
    assert row.last_error_type == "django.db.utils.OperationalError"
    assert row.last_error_kind == "transient"
    assert [(a["kind"], a["error_type"], a["error"]) for a in row.attempt_history] == [
        ("transient", "django.db.utils.OperationalError", row.last_error)
    ]
    assert before <= row.next_attempt_at <= after + timedelta(seconds=10)
    assert AssetEvent.objects.count() == 0


def test_permanent_error_parks_at_once_with_a_reason_naming_the_conflicting_asset(
    django_capture_on_commit_callbacks,
):
    row = poison_row()
    taken = Asset.objects.get(name="taken")
    result = drain.drain()
    assert (result.failed, result.parked) == (1, 1)
    row.refresh_from_db()
    assert row.parked_at is not None and row.attempts == 1
    assert row.last_error_kind == "permanent"
    assert row.error_detail["asset_ids"] == [taken.pk]
    assert f"#{taken.pk} name='taken' uri='s3://taken'" in row.park_reason
    assert "Correct the stored asset's uri" in row.park_reason
    assert len(row.attempt_history) == 1

    # The fix: the stored asset's uri is corrected (audited), then the row is requeued.
    asset_events.change_asset_uri(asset_id=taken.pk, uri="s3://other")
    call_command("requeue_parked", "--id", str(row.pk), stdout=io.StringIO())
    with django_capture_on_commit_callbacks(execute=True):
        result = drain.drain()
    assert (result.registered, result.failed) == (1, 0)
    assert AssetEvent.objects.filter(asset=taken).count() == 1
    assert list(AuditEntry.objects.order_by("id").values_list("action", "via")) == [
        ("asset.change_uri", "system"),
        ("outbox.requeue", "command"),
    ]


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (OperationalError("lock timeout"), "transient"),
        (IntegrityError("duplicate key (a concurrent writer)"), "transient"),
        (RuntimeError("unknown"), "transient"),
        (DataError("value too long for type character varying(1500)"), "permanent"),
        (registration.RegistrationError("payload.outlets[0]: must be an object"), "permanent"),
    ],
)
def test_classify_failure(exc, kind):
    failure = outbox.classify_failure(exc)
    assert failure.kind == kind
    assert bool(failure.reason) == (kind == "permanent")


def test_backoff_is_capped_exponential_with_full_jitter(settings, monkeypatch):
    settings.ASSET_QUEUE_BACKOFF_BASE_SECONDS = 2.0
    settings.ASSET_QUEUE_BACKOFF_CAP_SECONDS = 60.0
    monkeypatch.setattr(outbox.random, "uniform", lambda low, high: (low, high))
    assert [outbox.backoff_seconds(attempts=n) for n in (1, 2, 3, 5, 6, 100)] == [
        (0, 2.0),
        (0, 4.0),
        (0, 8.0),
        (0, 32.0),
        (0, 60.0),
        (0, 60.0),
    ]


def test_poison_row_parks_after_max_attempts_while_other_rows_flow_and_requeue_brings_it_back(
    fast_retries, django_capture_on_commit_callbacks, flaky
):
    good_asset = AssetFactory(name="good")
    bad = transient_row()
    registered = []
    for attempt in range(1, 4):
        good = outbox_row(payload(outlets=[asset_outlet(good_asset)], task_id=f"good{attempt}"))
        with django_capture_on_commit_callbacks(execute=True):
            result = drain.drain()
        assert (result.registered, result.failed) == (1, 1)
        assert not AssetEventQueue.objects.filter(id=good.id).exists()
        registered.append(result.registered)
        bad.refresh_from_db()
        assert bad.attempts == attempt
    assert bad.parked_at is not None
    assert result.parked == 1
    assert metrics.value(metrics.PARKED) == 1
    assert metrics.value(metrics.FAILED_ATTEMPTS) == 3
    # Parked rows are left alone.
    assert drain.drain().claimed == 0
    assert AssetEvent.objects.filter(asset=good_asset).count() == 3

    bad.refresh_from_db()
    assert "Failed 3 times with transient errors" in bad.park_reason
    assert [a["kind"] for a in bad.attempt_history] == ["transient"] * 3

    # The operator fixes the cause and requeues.
    flaky.failing = False
    call_command("requeue_parked", "--all")
    bad.refresh_from_db()
    assert (bad.attempts, bad.parked_at, bad.park_reason) == (0, None, "")
    assert bad.last_error.startswith("OperationalError")  # kept as history
    assert len(bad.attempt_history) == 3
    result = drain.drain()
    assert (result.registered, result.failed) == (1, 0)
    assert AssetEvent.objects.filter(asset__name="flaky").count() == 1
    assert AssetEventQueue.objects.count() == 0


def test_one_bad_row_in_a_batch_does_not_sink_the_others():
    good_asset = AssetFactory(name="good")
    goods = [outbox_row(payload(outlets=[asset_outlet(good_asset)])) for _ in range(3)]
    bad = poison_row()
    goods += [outbox_row(payload(outlets=[asset_outlet(good_asset)])) for _ in range(2)]
    result = drain.drain_batch(batch_size=10)
    assert (result.claimed, result.registered, result.failed) == (6, 5, 1)
    assert list(AssetEventQueue.objects.values_list("id", flat=True)) == [bad.id]
    assert AssetEvent.objects.count() == 5
    assert {e.source_ti_id for e in AssetEvent.objects.all()} == {
        uuid.UUID(str(g.ti_id)) for g in goods
    }


def test_drain_stops_when_its_time_budget_is_spent_and_hands_over(monkeypatch):
    asset = AssetFactory(name="a")
    for _ in range(5):
        outbox_row(payload(outlets=[asset_outlet(asset)]))
    nudged = []
    monkeypatch.setattr(nudges, "nudge_drain", lambda: nudged.append(1))
    result = drain.drain(batch_size=2, time_budget=0)
    assert (result.batches, result.registered) == (1, 2)
    assert nudged == [1]  # rows are left: a fresh drain task takes over
    result = drain.drain(batch_size=2, time_budget=60)
    assert nudged == [1]  # emptied the queue: nothing to hand over
    assert (result.batches, result.registered) == (2, 3)
    assert AssetEventQueue.objects.count() == 0


def test_rows_not_yet_due_are_not_claimed():
    asset = AssetFactory(name="a")
    row = outbox_row(payload(outlets=[asset_outlet(asset)]))
    AssetEventQueue.objects.filter(id=row.id).update(
        next_attempt_at=timezone.now() + timedelta(minutes=5)
    )
    assert drain.drain().claimed == 0


def drain_batch_queries(rows: int) -> int:
    asset = Asset.objects.get(name="q")
    for _ in range(rows):
        outbox_row(
            payload(outlets=[asset_outlet(asset)], outlet_events=[asset_event(asset, {"k": 1})])
        )
    with CaptureQueriesContext(connection) as ctx:
        result = drain.drain_batch(batch_size=500)
    assert (result.registered, result.runs_triggered) == (rows, 1)
    return len(ctx.captured_queries)


def test_query_count_of_one_drain_batch_is_the_same_for_1_and_500_rows():
    AssetFactory(name="q")
    dag = scheduled_dag("q_down", "q")
    TaskFactory(dag=dag, task_id="t1")
    TaskFactory(dag=dag, task_id="t2")
    one = drain_batch_queries(1)
    DagRun.objects.all().delete()
    five_hundred = drain_batch_queries(500)
    assert one == five_hundred
    assert AssetEvent.objects.count() == 501


def test_operator_functions_park_requeue_delete_and_select():
    asset = AssetFactory(name="a")
    r1 = outbox_row(payload(outlets=[asset_outlet(asset)], dag_id="d1"))
    r2 = outbox_row(payload(outlets=[asset_outlet(asset), asset_outlet(asset)], dag_id="d2"))
    assert outbox.park(row_ids=[r1.id, r2.id]) == [r1.id, r2.id]
    assert outbox.park(row_ids=[r1.id]) == []  # already parked
    assert list(outbox.select_rows(parked=True, dag_id="d2")) == [r2]
    assert outbox.requeue(row_ids=[r1.id]) == [r1.id]
    assert list(outbox.select_rows(parked=False)) == [r1]
    assert outbox.delete_rows(row_ids=[r2.id, 999_999]) == outbox.DeleteResult(
        rows=1, outlets_lost=2
    )
    assert list(AssetEventQueue.objects.values_list("id", flat=True)) == [r1.id]


def test_queue_status_counts_pending_due_parked_and_by_dag():
    asset = AssetFactory(name="a")
    scheduled_dag("down", "a", is_paused=True)
    outbox_row(payload(outlets=[asset_outlet(asset)], dag_id="p1"))
    later = outbox_row(payload(outlets=[asset_outlet(asset)], dag_id="p1"))
    AssetEventQueue.objects.filter(id=later.id).update(
        next_attempt_at=timezone.now() + timedelta(minutes=1),
        created_at=timezone.now() - timedelta(seconds=30),
    )
    parked = outbox_row(payload(outlets=[asset_outlet(asset)], dag_id="p2"))
    outbox.park(row_ids=[parked.id])
    registered = outbox_row(payload(outlets=[asset_outlet(asset)], ti_id=uuid.uuid4()))
    drain.drain_batch(batch_size=1)  # registers the oldest due row (the first p1 row)
    assert not AssetEventQueue.objects.filter(id=registered.id, attempts__gt=0).exists()
    status = outbox.queue_status()
    assert (status.pending, status.due, status.parked) == (2, 1, 1)
    assert 29 <= status.oldest_pending_age_seconds < 60
    assert status.queued_events == 1
    assert [(d.dag_id, d.pending, d.parked, d.queued_events) for d in status.by_dag] == [
        ("down", 0, 0, 1),
        ("p1", 1, 0, 0),
        ("p2", 0, 1, 0),
        ("producer", 1, 0, 0),
    ]


class SimulatedCrash(Exception):
    pass


@pytest.mark.django_db(transaction=True)
def test_crash_between_registration_and_commit_leaves_the_row_pending_and_retry_writes_once(
    monkeypatch,
):
    orders = AssetFactory(name="orders")
    scheduled_dag("down", "orders")
    row = outbox_row(
        payload(outlets=[asset_outlet(orders)], outlet_events=[asset_event(orders, {"n": 1})])
    )
    seen = {}

    def crash(rows):
        # Registration has run in this transaction: the events are there, uncommitted.
        seen["events_before_crash"] = AssetEvent.objects.count()
        raise SimulatedCrash("process died before commit")

    monkeypatch.setattr(drain, "_before_commit", crash)
    with pytest.raises(SimulatedCrash):
        drain.drain()
    assert seen == {"events_before_crash": 1}
    crashed = ComponentHeartbeat.objects.get(component="drain")
    assert (crashed.last_run_at is not None, crashed.last_ok_at) == (True, None)
    row.refresh_from_db()
    # The claim committed before the attempt: the row says a drain took it and never finished.
    assert (row.attempts, row.parked_at, row.last_error) == (0, None, "")
    assert row.claimed_at is not None
    assert AssetEvent.objects.count() == 0
    assert AssetDagRunQueue.objects.count() == 0
    assert metrics.value(metrics.REGISTERED) == 0
    # Within the claim's grace the row is left alone (its drain may be about to lock it).
    assert drain.drain().claimed == 0

    monkeypatch.undo()
    monkeypatch.setattr(outbox, "CLAIM_GRACE_SECONDS", 0.0)
    result = drain.drain()
    # The dead attempt is counted (and would park the row at the maximum), then retried at once.
    assert (result.failed, result.parked) == (1, 0)
    assert metrics.value(metrics.FAILED_ATTEMPTS) == 1
    assert (result.registered, result.events_written, result.runs_triggered) == (1, 1, 1)
    assert AssetEvent.objects.count() == 1
    assert AssetEventQueue.objects.count() == 0
    assert DagRun.objects.filter(dag_id="down").count() == 1
    assert metrics.value(metrics.REGISTERED) == 1
    assert drain.drain().claimed == 0
    assert ComponentHeartbeat.objects.get(component="drain").last_ok_at is not None


def test_drain_nudges_coalesce_while_one_is_waiting():
    from django_q.models import OrmQ

    def waiting_drains() -> int:
        return sum(row.func() == nudges.DRAIN_FUNC for row in OrmQ.objects.all())

    nudges.nudge_drain()
    nudges.nudge_drain()
    assert waiting_drains() == 1
    # Once a cluster has picked it up (locked it), the next nudge enqueues a new drain.
    OrmQ.objects.update(lock=timezone.now() + timedelta(seconds=90))
    nudges.nudge_drain()
    assert waiting_drains() == 2
    nudges.nudge_scheduler(dag_ids=["b", "a"])
    (scheduler_task,) = [row for row in OrmQ.objects.all() if row.func() == nudges.SCHEDULE_FUNC]
    assert scheduler_task.kwargs() == {"dag_ids": ["a", "b"]}


def test_changing_an_asset_uri_refuses_a_taken_or_empty_uri_and_writes_nothing():
    from assets_app.guards import exceptions

    orders = AssetFactory(name="orders", uri="s3://old")
    AssetFactory(name="other", uri="s3://taken")
    with pytest.raises(exceptions.Conflict) as taken:
        asset_events.change_asset_uri(asset_id=orders.pk, uri="s3://taken")
    assert taken.value.reason == "asset_uri_taken"
    with pytest.raises(exceptions.InvalidInput):
        asset_events.change_asset_uri(asset_id=orders.pk, uri="  ")
    with pytest.raises(exceptions.NotFound):
        asset_events.change_asset_uri(asset_id=10**9, uri="s3://x")
    orders.refresh_from_db()
    assert orders.uri == "s3://old" and not AuditEntry.objects.exists()


def _rows_with_outlets(*counts: int) -> list[AssetEventQueue]:
    return [
        outbox_row(
            payload(
                outlets=[
                    {"name": f"r{i}-a{j}", "uri": f"s3://r{i}/a{j}", "type": "Asset"}
                    for j in range(n)
                ],
                task_id=f"t{i}",
            )
        )
        for i, n in enumerate(counts)
    ]


def test_batches_are_sized_by_outlets_and_a_big_row_is_registered_in_chunks(settings):
    """A batch takes rows while their outlets fit ASSET_QUEUE_BATCH_OUTLETS; a row above it is
    taken alone and registered a chunk per batch, keeping its place, each chunk committed with
    its events; between chunks the row is free (an operator could park it)."""
    settings.ASSET_QUEUE_BATCH_OUTLETS = 10
    *_, big = _rows_with_outlets(4, 4, 4, 25)

    first = drain.drain_batch()
    assert (first.claimed, first.registered, first.events_written) == (2, 2, 8)
    assert first.more
    second = drain.drain_batch()  # small_c alone: big would not fit with it
    assert (second.claimed, second.registered, second.events_written) == (1, 1, 4)
    chunks = []
    while AssetEventQueue.objects.exists():
        batch = drain.drain_batch()
        chunks.append((batch.claimed, batch.registered, batch.chunked, batch.events_written))
        if AssetEventQueue.objects.exists():
            big.refresh_from_db()
            assert big.claimed_at is None  # released between chunks
            chunks.append(big.registered_count)
    assert chunks == [(1, 0, 1, 10), 10, (1, 0, 1, 10), 20, (1, 1, 0, 5)]
    events = AssetEvent.objects.filter(source_task_id="t3")
    assert events.count() == 25
    assert set(events.values_list("source_ordinal", flat=True)) == {0}
    assert drain.drain_batch().claimed == 0


def test_a_chunk_registered_again_writes_nothing_twice(settings):
    """The place a chunked row keeps is an optimisation: a chunk registered again (its place
    lost) writes nothing new, since the events' idempotency keys come from the whole payload."""
    settings.ASSET_QUEUE_BATCH_OUTLETS = 10
    (big,) = _rows_with_outlets(25)
    drain.drain_batch()
    AssetEventQueue.objects.filter(id=big.id).update(registered_count=0)
    while AssetEventQueue.objects.exists():
        drain.drain_batch()
    assert AssetEvent.objects.count() == 25


@pytest.mark.django_db(transaction=True)
def test_a_savepoint_rollback_that_fails_is_never_followed_by_per_row_retries(monkeypatch, caplog):
    """Issue 13 item 7: the batch fails and rolling back its savepoint fails too (the session
    was terminated; psycopg may not have marked the connection closed yet). Django marks the
    transaction `needs_rollback`, so no row may be retried on it: the error goes up, the
    transaction rolls back, and no row records a failure."""
    from django.db import DatabaseError, connections

    from assets_app.registration import outlets as registration

    rows = _rows_with_outlets(1, 1, 1)

    def batch_fails(**kwargs):
        raise DatabaseError("the batch failed")

    real = connections["default"]

    def rollback_fails(sid):
        raise DatabaseError("server closed the connection unexpectedly")

    monkeypatch.setattr(registration, "register_payloads", batch_fails)
    monkeypatch.setattr(real, "savepoint_rollback", rollback_fails)
    with pytest.raises(DatabaseError, match="the batch failed"):
        drain.drain_batch()
    monkeypatch.undo()
    assert not [r for r in caplog.records if " failed: " in r.getMessage()]
    assert list(AssetEventQueue.objects.values_list("attempts", flat=True)) == [0, 0, 0]
    assert AssetEventQueue.objects.count() == len(rows)


def _wrapped(error: Exception) -> Exception:
    from django.db import OperationalError

    try:
        try:
            raise error
        except Exception as exc:
            raise OperationalError(str(exc)) from exc
    except OperationalError as wrapped:
        return wrapped


@pytest.mark.parametrize(
    ("make_error", "unusable"),
    [
        (lambda: psycopg.errors.AdminShutdown("terminating connection"), True),
        (lambda: psycopg.errors.ConnectionFailure("connection failure"), True),
        (lambda: psycopg.OperationalError("consuming input failed: server closed"), True),
        (lambda: psycopg.errors.LockNotAvailable("lock timeout"), False),
        (lambda: psycopg.errors.UniqueViolation("duplicate key"), False),
    ],
    ids=["57P01", "08006", "client-side", "lock-timeout", "unique-violation"],
)
def test_connection_loss_is_recognised_however_it_surfaces(make_error, unusable):
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    assert drain._connection_unusable(_wrapped(make_error())) is unusable


def test_the_drain_yields_to_a_burst_for_a_bounded_time_then_works(settings):
    """While successes arrive faster than the threshold and wait undrained, the drain waits
    before its batch, but at most ASSET_DRAIN_YIELD_MAX_SECONDS; then it registers them. A
    trickle below the threshold: no wait."""
    settings.ASSET_DRAIN_YIELD_ABOVE_PER_SECOND = 10
    settings.ASSET_DRAIN_YIELD_MAX_SECONDS = 0.3
    orders = AssetFactory(name="orders")
    burst = [outbox_row(payload(outlets=[asset_outlet(orders)], task_id=f"b{i}")) for i in range(6)]
    result = drain.drain()  # 6 rows within the last 0.5 s: 12/s > 10/s
    detail = ComponentHeartbeat.objects.get(component="drain").detail
    assert 0.3 <= detail["yielded_seconds"] < 0.6
    assert result.registered == len(burst)

    outbox_row(payload(outlets=[asset_outlet(orders)], task_id="trickle"))
    assert drain.drain().registered == 1
    assert ComponentHeartbeat.objects.get(component="drain").detail["yielded_seconds"] == 0


def test_a_drain_starts_with_a_short_batch_and_doubles_it_up_to_the_whole(settings, monkeypatch):
    """`_Ramp`: the first batch of a drain takes 1/8 of ASSET_QUEUE_BATCH_OUTLETS, each next
    one twice the last up to the whole, and after a yield the drain starts small again."""
    settings.ASSET_QUEUE_BATCH_OUTLETS = 16
    settings.ASSET_DRAIN_YIELD_ABOVE_PER_SECOND = 0  # no yield: the ramp alone
    _rows_with_outlets(*[1] * 40)
    sizes = []
    real = drain.drain_batch

    def batch(**kwargs):
        result = real(**kwargs)
        sizes.append((kwargs["outlet_budget"], result.events_written))
        return result

    monkeypatch.setattr(drain, "drain_batch", batch)
    assert drain.drain().registered == 40
    assert sizes == [(2, 2), (4, 4), (8, 8), (16, 16), (16, 10)]

    ramp = drain._Ramp()
    assert [ramp.next(yielded=False) for _ in range(5)] == [2, 4, 8, 16, 16]
    assert ramp.next(yielded=True) == 2
    assert ramp.next(yielded=False) == 4


@pytest.mark.parametrize(
    "stored_type",
    [outbox.DRAIN_DIED_TYPE, "assets_app.outbox.DrainDied"],
    ids=["current-name", "name-stored-before-the-module-moved"],
)
def test_a_row_whose_drain_died_is_claimed_alone_under_either_stored_name(stored_type):
    """`last_error_type` is stored; issue 37 moved `DrainDied` (assets_app/outbox.py ->
    outbox/rows.py), and a row recorded under the old name is still taken alone."""
    assets = [AssetFactory(name=f"alone-{i}") for i in range(3)]
    rows = [
        outbox_row(payload(outlets=[asset_outlet(asset)], task_id=f"t{i}"))
        for i, asset in enumerate(assets)
    ]
    AssetEventQueue.objects.filter(id=rows[0].id).update(last_error_type=stored_type)
    claim = outbox.claim_batch(limit=10, outlet_budget=100)
    assert claim.row_ids == [rows[0].id]
    assert claim.more
    other = outbox.claim_batch(limit=10, outlet_budget=100)
    assert other.row_ids == [rows[1].id, rows[2].id]
