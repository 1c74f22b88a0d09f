"""Deterministic guards for invariants 3, 5 and 8 that only a race used to exercise.

Each test sets up the situation a concurrent drain, scheduler or operator creates, with a second
real PostgreSQL connection (rows committed, locks really held), so the guarded rule is what makes
the test pass:

- one transaction per drain batch (invariant 3): PostgreSQL records, by trigger, the transaction
  id of every event insert, ADRQ insert and outbox delete; a batch's are one and the same;
- claiming never waits (invariant 5): rows another connection holds, under `lock_timeout`, are
  skipped at once instead of waited for;
- the scheduler deletes exactly the ADRQ rows it locked (invariant 8): a row another connection
  holds, and a row committed by a drain while the pass runs, both survive the pass;
- a webhook deliverer's claim skips the endpoints another deliverer holds (invariant 5);
- starting a TI locks only the TI row (invariant 9): its run's row held elsewhere is no wait.
"""

import contextlib
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from assets_app.events_out import delivery as webhook_delivery
from assets_app.events_out import webhooks
from assets_app.models import (
    AssetDagRunQueue,
    AssetEvent,
    AssetEventQueue,
    Backfill,
    Dag,
    DagRun,
    DagRunState,
    FreshnessPolicy,
    TaskInstance,
    TIState,
    WebhookDelivery,
)
from assets_app.outbox import drain
from assets_app.registration import outlets as registration
from assets_app.scheduling import asset_runs as scheduling
from assets_app.scheduling import runs
from assets_app.sql import locks
from assets_app.task_state import claims, starting
from tests.asset_flow import asset_event, asset_outlet, outbox_row, payload, scheduled_dag
from tests.factories import AssetFactory, DagFactory, DagRunFactory, TaskInstanceFactory

pytestmark = pytest.mark.django_db(transaction=True)

LOCK_TIMEOUT = "2s"


@contextlib.contextmanager
def other_connection() -> Iterator[psycopg.Connection]:
    """A second session on the test database (not Django's), in a transaction until closed."""
    s = connection.settings_dict
    conn = psycopg.connect(
        host=s["HOST"] or "127.0.0.1",
        port=s["PORT"] or 5432,
        user=s["USER"],
        password=s["PASSWORD"] or None,
        dbname=s["NAME"],
    )
    try:
        yield conn
    finally:
        conn.rollback()
        conn.close()


@contextlib.contextmanager
def lock_timeout() -> Iterator[None]:
    """Make this session fail (LockNotAvailable) instead of waiting longer than LOCK_TIMEOUT:
    a claim that waits on a row the other session holds (until the test ends) fails the test
    with that error, not with a time measured on a loaded machine."""
    with connection.cursor() as cursor:
        cursor.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")


# --- invariant 3: a batch's events, ADRQ rows and outbox deletes are one transaction ---------

_LOG_TRIGGERS = {
    "assets_app_assetevent": ("INSERT", "NEW.id"),
    "assets_app_assetdagrunqueue": ("INSERT", "NEW.id"),
    "assets_app_asseteventqueue": ("DELETE", "OLD.id"),
}


@pytest.fixture
def write_log() -> Iterator[callable]:
    """Row triggers that log (table, operation, row id, transaction id) for the writes of
    registration; returns a reader of the log. Dropped again before the database is flushed."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE test_write_log (seq serial, tbl text, op text, row_id bigint, xid xid8)"
        )
        for table, (op, row) in _LOG_TRIGGERS.items():
            cursor.execute(
                f"CREATE FUNCTION test_log_{table}() RETURNS trigger LANGUAGE plpgsql AS $$ "
                "BEGIN INSERT INTO test_write_log (tbl, op, row_id, xid) "
                f"VALUES (TG_TABLE_NAME, TG_OP, {row}, pg_current_xact_id()); RETURN NULL; END $$"
            )
            cursor.execute(
                f"CREATE TRIGGER test_log AFTER {op} ON {table} FOR EACH ROW "
                f"EXECUTE FUNCTION test_log_{table}()"
            )

    def read() -> list[tuple[str, str, int, str]]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT tbl, op, row_id, xid::text FROM test_write_log ORDER BY seq")
            return cursor.fetchall()

    try:
        yield read
    finally:
        with connection.cursor() as cursor:
            for table in _LOG_TRIGGERS:
                cursor.execute(f"DROP TRIGGER IF EXISTS test_log ON {table}")
                cursor.execute(f"DROP FUNCTION IF EXISTS test_log_{table}()")
            cursor.execute("DROP TABLE IF EXISTS test_write_log")


def test_a_drain_batch_commits_its_events_adrq_rows_and_outbox_deletes_in_one_transaction(
    write_log,
):
    scheduled_dag("waits", {"all": ["hot", "never_produced"]})
    hot = AssetFactory(name="hot", uri="hot")
    rows = [
        outbox_row(
            payload(
                outlets=[asset_outlet(hot)],
                outlet_events=[asset_event(hot, {"n": n, "k": k}) for k in range(2)],
            )
        )
        for n in range(3)
    ]
    assert write_log() == []

    result = drain.drain_batch(batch_size=10)

    assert result.registered == 3
    log = write_log()
    by_kind: dict[tuple[str, str], set[int]] = {}
    xids: dict[tuple[str, str], set[str]] = {}
    for table, op, row_id, xid in log:
        by_kind.setdefault((table, op), set()).add(row_id)
        xids.setdefault((table, op), set()).add(xid)
    assert by_kind[("assets_app_assetdagrunqueue", "INSERT")] == {
        *AssetDagRunQueue.objects.values_list("id", flat=True)
    }
    assert by_kind[("assets_app_assetevent", "INSERT")] == {
        *AssetEvent.objects.values_list("id", flat=True)
    }
    assert len(by_kind[("assets_app_assetevent", "INSERT")]) == 6
    assert by_kind[("assets_app_asseteventqueue", "DELETE")] == {row.id for row in rows}
    # The COMMITs that wrote any of it: exactly one.
    transactions = {xid for kind_xids in xids.values() for xid in kind_xids}
    assert len(transactions) == 1, f"registration spread over transactions: {xids}"


# --- invariant 5: a drain's claim skips rows another drain holds, without waiting ------------


def test_the_drain_claim_skips_rows_another_session_holds_and_never_waits():
    hot = AssetFactory(name="hot", uri="hot")
    free = [outbox_row(payload(outlets=[asset_outlet(hot)])) for _ in range(3)]
    held_due = outbox_row(payload(outlets=[asset_outlet(hot)]))
    # An attempt that looks dead (claimed long ago), but another drain still holds the row.
    held_claimed = outbox_row(payload(outlets=[asset_outlet(hot)]))
    AssetEventQueue.objects.filter(id=held_claimed.id).update(
        claimed_at=timezone.now() - timedelta(hours=1)
    )
    held = [held_due.id, held_claimed.id]

    with other_connection() as other:
        locked = other.execute(
            "SELECT id FROM assets_app_asseteventqueue WHERE id = ANY(%s) FOR UPDATE", [held]
        ).fetchall()
        assert sorted(r[0] for r in locked) == sorted(held)
        with lock_timeout():
            result = drain.drain_batch(batch_size=10)

    assert (result.claimed, result.registered, result.failed) == (3, 3, 0)
    left = {row.id: row for row in AssetEventQueue.objects.all()}
    assert sorted(left) == sorted(held)
    # The held claimed row was not taken for a dead attempt while someone held it.
    assert left[held_claimed.id].attempts == 0
    assert {e.source_ti_id for e in AssetEvent.objects.all()} == {
        uuid.UUID(str(row.ti_id)) for row in free
    }


def test_a_worker_claim_skips_a_ti_another_claim_holds_and_never_waits():
    run = DagRunFactory()
    now = timezone.now()
    tis = [
        TaskInstanceFactory(dag_run=run, queued_at=now - timedelta(seconds=10 - i))
        for i in range(3)
    ]
    with other_connection() as other:
        other.execute(
            "SELECT id FROM assets_app_taskinstance WHERE id = %s FOR UPDATE", [tis[0].id]
        )
        with lock_timeout():
            claimed = claims.claim_workloads(hostname="worker-2", limit=10)
    assert [w.ti.id for w in claimed] == [tis[1].id, tis[2].id]


def test_a_webhook_claim_skips_an_endpoint_another_deliverer_holds_and_never_waits(settings):
    """Two deliverers: while one holds an endpoint (its claim transaction), the other claims
    the due messages of the other endpoints at once instead of queueing behind it."""
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1/32"]
    specs = [webhooks.SubscriptionSpec("asset.event.registered", "*")]
    held, free = (
        webhooks.create_endpoint(url=f"http://127.0.0.1:9/{name}", subscriptions=specs).endpoint
        for name in ("held", "free")
    )
    registration.register_payload(payload=payload(outlets=[asset_outlet(AssetFactory())]))
    assert WebhookDelivery.objects.count() == 2

    with other_connection() as other:
        other.execute(
            "SELECT id FROM assets_app_webhookendpoint WHERE id = %s FOR NO KEY UPDATE", [held.pk]
        )
        with lock_timeout():
            claimed = webhook_delivery.claim()
    assert [d.endpoint_id for d in claimed] == [free.pk]


# --- invariant 9: starting a TI locks only the TI row ----------------------------------------


def test_starting_a_ti_does_not_wait_on_its_run_row_another_session_holds():
    """`of=("self",)`: a lock that also took the DagRun row (the TI query joins it) would queue
    every worker starting a TI of the run behind whoever holds the run (a run state change)."""
    run = DagRunFactory(state=DagRunState.RUNNING)
    ti = TaskInstanceFactory(dag_run=run)
    with other_connection() as other:
        other.execute("SELECT id FROM assets_app_dagrun WHERE id = %s FOR UPDATE", [run.id])
        with lock_timeout():
            context = starting.start(
                ti_id=ti.id,
                try_number=ti.try_number,
                hostname="w",
                unixname="u",
                pid=7,
                start_date=timezone.now(),
            )
    assert context.ti.state == TIState.RUNNING


# --- invariant 8: the scheduler deletes exactly the ADRQ rows it locked ----------------------


def _produce(asset_name: str, n: int) -> int:
    asset = AssetFactory(name=asset_name, uri=asset_name)
    (event_id,) = registration.register_payload(
        payload=payload(outlets=[asset_outlet(asset)], outlet_events=[asset_event(asset, {"n": n})])
    ).event_ids
    return event_id


def _consumed(dag_id: str) -> list[list[int]]:
    return [
        sorted(run.consumed_events.values_list("id", flat=True))
        for run in DagRun.objects.filter(dag_id=dag_id).order_by("id")
    ]


def test_a_queued_event_row_another_session_holds_survives_the_pass():
    scheduled_dag("d", "a")
    first, held = _produce("a", 1), _produce("a", 2)
    with other_connection() as other:
        other.execute(
            "SELECT id FROM assets_app_assetdagrunqueue WHERE asset_event_id = %s FOR UPDATE",
            [held],
        )
        with lock_timeout():
            result = scheduling.schedule_dags()
    assert len(result.run_ids) == 1
    assert _consumed("d") == [[first]]
    assert list(AssetDagRunQueue.objects.values_list("asset_event_id", flat=True)) == [held]
    scheduling.schedule_dags(dag_ids=["d"])
    assert _consumed("d") == [[first], [held]]


def test_a_queued_event_committed_during_the_pass_survives_it(monkeypatch):
    """A drain commits a new event (and its ADRQ row) for the Dag after the scheduler locked the
    Dag's rows and before it deletes them: READ COMMITTED shows that row to every later
    statement of the pass, so only deleting exactly the locked rows keeps it."""
    scheduled_dag("d", "a")
    first = _produce("a", 1)
    late: list[int] = []
    real_create = runs.create_asset_triggered_runs

    def drain_commits_meanwhile(**kwargs):
        def register() -> None:
            try:
                late.append(_produce("a", 2))
            finally:
                connections.close_all()

        thread = threading.Thread(target=register)
        thread.start()
        thread.join(30)
        assert late, "the concurrent registration did not finish"
        return real_create(**kwargs)

    monkeypatch.setattr(scheduling.runs, "create_asset_triggered_runs", drain_commits_meanwhile)
    with lock_timeout():
        result = scheduling.schedule_dags()
    monkeypatch.undo()

    assert len(result.run_ids) == 1
    assert _consumed("d") == [[first]]
    assert list(AssetDagRunQueue.objects.values_list("asset_event_id", flat=True)) == late
    scheduling.schedule_dags()
    assert _consumed("d") == [[first], late]


# --- invariant 5, every other claim: a row another session holds is skipped, never waited for --


def _timetable_dags(now):
    due = now - timedelta(minutes=1)
    return [
        DagFactory(timetable={"kind": "cron", "cron": "@daily"}, next_dagrun_create_after=due)
        for _ in range(3)
    ]


def _timed_out_runs(now):
    return [
        DagRunFactory(state=DagRunState.RUNNING, timeout_at=now - timedelta(minutes=1))
        for _ in range(3)
    ]


def _backfills(now):
    return [
        Backfill.objects.create(
            dag=DagFactory(), from_date=now - timedelta(days=2), to_date=now - timedelta(days=1)
        )
        for _ in range(3)
    ]


def _freshness_policies(now):
    return [
        FreshnessPolicy.objects.create(
            asset=AssetFactory(), kind="max_interval", interval_seconds=60
        )
        for _ in range(3)
    ]


# (name, table, the rows, the claim: returns the ids it locked, inside the caller's transaction)
OTHER_CLAIMS = [
    (
        "due-timetable-dags",
        Dag,
        _timetable_dags,
        lambda rows, now: [d.pk for d in locks.claim_due_timetable_dags(now=now, limit=10)],
    ),
    (
        "timed-out-runs",
        DagRun,
        _timed_out_runs,
        lambda rows, now: [r[0] for r in locks.lock_timed_out_runs(now=now, limit=10)],
    ),
    (
        "active-backfills",
        Backfill,
        _backfills,
        lambda rows, now: [
            b.pk for b in locks.claim_active_backfills(ids=None, exclude=[], limit=10)
        ],
    ),
    (
        "freshness-policies",
        FreshnessPolicy,
        _freshness_policies,
        lambda rows, now: [p.pk for p in locks.claim_freshness_policies(after_id=0, limit=10)],
    ),
    (
        "runs-for-retention",
        DagRun,
        lambda now: [DagRunFactory(state=DagRunState.SUCCESS) for _ in range(3)],
        lambda rows, now: locks.lock_runs_for_retention(
            DagRun.objects.filter(pk__in=[r.pk for r in rows])
        )[0],
    ),
    (
        "task-instances-to-clear",
        TaskInstance,
        lambda now: [TaskInstanceFactory() for _ in range(3)],
        lambda rows, now: [
            ti.pk
            for ti in locks.lock_task_instances_to_clear(
                TaskInstance.objects.filter(pk__in=[r.pk for r in rows])
            )
        ],
    ),
]


@pytest.mark.parametrize(
    ("table", "make_rows", "claim"),
    [claim[1:] for claim in OTHER_CLAIMS],
    ids=[claim[0] for claim in OTHER_CLAIMS],
)
def test_every_other_claim_skips_a_row_another_session_holds_and_never_waits(
    table, make_rows, claim
):
    """The time scheduler's Dags, the run-timeout timer's runs, the backfill pass, the freshness
    evaluator, retention's runs and an operator's clear: with the first row held by another
    session (FOR UPDATE, the strongest lock any claim takes), each claim returns the others at
    once; a claim that waited fails on `lock_timeout` instead."""
    now = timezone.now()
    rows = make_rows(now)
    with other_connection() as other:
        other.execute(
            f"SELECT 1 FROM {table._meta.db_table} WHERE {table._meta.pk.column} = %s FOR UPDATE",
            [rows[0].pk],
        )
        with lock_timeout(), transaction.atomic():
            locked = claim(rows, now)
    assert sorted(locked) == sorted(r.pk for r in rows[1:])
