"""Deadlocks are bugs (invariant 7): what can deadlock in our schema is driven here, and a
control run with the lock order broken on purpose shows that this test detects it.

What can deadlock. Only transactions that insert some of the same unique keys wait for each
other's row locks in the drain / scheduler flow: an INSERT (ON CONFLICT DO NOTHING or not) of a
key another open transaction inserted waits for that transaction to end. Two drains whose
batches create the same new assets (`Asset.name` and `Asset.uri` are unique), the same new
aliases (`AssetAlias.name`) or the same alias -> asset links (`AssetAliasAsset`) therefore wait
key by key. In one order that is a queue (the second drain waits, then finds the keys taken);
in two orders each drain holds a key the other needs next: PostgreSQL's `deadlock_detected`.
This is what happens when producers declare the same new outlets and their successes are
drained at once, and what `registration.in_lock_order` (sorted keys for every such insert)
prevents. The test drives exactly that: DRAINS drains whose payloads declare the same NEW_ASSETS
new assets and NEW_ALIASES new aliases linking to them, every other payload in the opposite
order, registered at once.

What cannot deadlock, and why:
- ADRQ inserts. An ADRQ key is (target Dag, event), and an event is always new in the
  transaction that queues it (events are inserted first, with fresh ids; a replay queues
  nothing), so two transactions never insert the same ADRQ key and never wait on each other's
  ADRQ rows, in whatever order they insert them. (Their sort, invariant 7, is checked on every
  writer by tests/api/test_adrq_lock_order.py, not here: no concurrent run could show it.) The
  same holds for events and alias-event links: their keys belong to one transaction.
- Claims. Drains claim outbox rows, schedulers claim Dag rows and their ADRQ rows, workers
  claim TIs, all with SKIP LOCKED: a claim never waits, so it is never part of a cycle (the
  batch's re-lock of its own claimed rows waits only on its own claim, see `locks.py`).
- Foreign-key checks. They take FOR KEY SHARE on the referenced Dag, asset and event rows,
  which conflicts only with deleting those rows or changing their keys; the scheduler's Dag
  lock is FOR NO KEY UPDATE, compatible with it, and the scheduler deletes only ADRQ rows it
  locked itself.
So the hot-asset traffic each round also carries (events of one asset for HOT_DAGS Dags, with
SCHEDULERS schedulers consuming while the drains insert) must never deadlock either, and every
event must be consumed once per Dag.

Deadlocks are counted two ways, both required 0 (and, in the control, at least 1): a
`deadlock_detected` (SQLSTATE 40P01) raised by registration inside a drain (the drain then
retries each row of its batch in its own savepoint, so the error does not surface further), and
PostgreSQL's own `pg_stat_database.deadlocks` for the test database. The ordered run must also
show the contention it claims to survive: in some round two drains' asset inserts overlapped in
time (one waited for the other's keys); otherwise it proved nothing and fails. A test-only
trigger slows each asset row insert (`slow_asset_inserts`) so that they do overlap.
"""

import contextlib
import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from django.db import OperationalError, connection
from django.utils import timezone

from assets_app.models import AssetDagRunQueue, AssetEventQueue
from assets_app.outbox import drain
from assets_app.registration import outlets as registration
from assets_app.scheduling import asset_runs as scheduling

from .conftest import consumption_report, figure, make_scheduled_dag, pg_deadlocks, run_in_threads

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROUNDS = 2  # the ordered run
CONTROL_ROUNDS = 3  # the control: at most this many rounds to see a deadlock (it takes one)
DRAINS = 4
NEW_ASSETS = 200
ROW_DELAY = 0.002  # seconds each asset row insert takes (see `slow_asset_inserts`)
NEW_ALIASES = 20
HOT_DAGS = 4
SCHEDULERS = 2
HOT = "hot-asset"
ASSET_INSERT = 'INSERT INTO "assets_app_asset" ('


def _is_deadlock(exc: BaseException | None) -> bool:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if getattr(exc, "sqlstate", None) == "40P01":
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _queue_round(round_no: int) -> None:
    """DRAINS outbox rows, each declaring the round's NEW_ASSETS new assets and NEW_ALIASES new
    aliases (alias i links to asset i), every other row in the opposite order, plus one event
    of the hot asset. Their TIs need not exist: rows carry their source."""
    names = [f"r{round_no}-asset-{i:04d}" for i in range(NEW_ASSETS)]
    aliases = [f"r{round_no}-alias-{i:03d}" for i in range(NEW_ALIASES)]
    now = timezone.now()
    rows = []
    for n in range(DRAINS):
        order = names if n % 2 == 0 else names[::-1]
        alias_order = aliases if n % 2 == 0 else aliases[::-1]
        ti_id = uuid.uuid4()
        source = {
            "ti_id": str(ti_id),
            "dag_id": "producer",
            "run_id": f"manual__round_{round_no}",
            "task_id": f"task_{n}",
            "map_index": -1,
            "try_number": 1,
        }
        rows.append(
            AssetEventQueue(
                ti_id=ti_id,
                try_number=1,
                source_dag_id=source["dag_id"],
                source_run_id=source["run_id"],
                source_task_id=source["task_id"],
                next_attempt_at=now - timedelta(milliseconds=n),
                outlet_count=NEW_ASSETS + NEW_ALIASES + 1,
                payload={
                    "outlets": [{"name": HOT, "uri": HOT, "type": "Asset"}]
                    + [{"name": name, "uri": name, "type": "Asset"} for name in order]
                    + [{"name": alias, "type": "AssetAlias"} for alias in alias_order],
                    "outlet_events": [
                        {
                            "source_alias_name": alias,
                            "dest_asset_key": {"name": names[i], "uri": names[i]},
                            "dest_asset_extra": {},
                            "extra": {},
                        }
                        for i, alias in sorted(
                            enumerate(aliases), key=lambda pair: pair[0], reverse=n % 2 == 1
                        )
                    ],
                    "source": source,
                    "end_date": now.isoformat(),
                },
            )
        )
    AssetEventQueue.objects.bulk_create(rows)


class Observed:
    """What the drains saw: deadlocks raised by registration, and asset insert intervals."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.deadlocks = 0
        self.inserts: list[tuple[int, int, float, float]] = []  # round, drain, start, end

    @contextlib.contextmanager
    def spying(self, monkeypatch) -> Iterator[None]:
        real = registration.register_payloads

        def register_payloads(**kwargs):
            try:
                return real(**kwargs)
            except OperationalError as exc:
                if _is_deadlock(exc):
                    with self.lock:
                        self.deadlocks += 1
                raise

        monkeypatch.setattr(registration, "register_payloads", register_payloads)
        yield
        monkeypatch.setattr(registration, "register_payloads", real)

    def recorder(self, round_no: int, drain: int) -> Callable:
        def record(execute, sql, params, many, context):
            if not sql.startswith(ASSET_INSERT):
                return execute(sql, params, many, context)
            started = time.monotonic()
            try:
                return execute(sql, params, many, context)
            finally:
                with self.lock:
                    self.inserts.append((round_no, drain, started, time.monotonic()))

        return record

    def overlapping_rounds(self) -> int:
        rounds = 0
        for round_no in {r for r, _, _, _ in self.inserts}:
            spans = sorted((s, e) for r, _, s, e in self.inserts if r == round_no)
            if any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans)):
                rounds += 1
        return rounds


def _run_round(round_no: int, observed: Observed) -> None:
    barrier = threading.Barrier(DRAINS + SCHEDULERS)
    drains_done = threading.Event()
    finished = [0]

    def drainer(n: int) -> None:
        with connection.cursor() as cursor:
            # Detect a deadlock after 100 ms rather than PostgreSQL's default 1 s (this session).
            cursor.execute("SET deadlock_timeout = '100ms'")
        barrier.wait(30)
        with connection.execute_wrapper(observed.recorder(round_no, n)):
            while AssetEventQueue.objects.filter(parked_at__isnull=True).exists():
                drain.drain_batch(batch_size=1)
        with observed.lock:
            finished[0] += 1
            if finished[0] == DRAINS:
                drains_done.set()

    def scheduler(n: int) -> None:
        barrier.wait(30)
        while True:
            done = drains_done.is_set()
            scheduling.schedule_dags()
            if done and not AssetDagRunQueue.objects.exists():
                return
            time.sleep(0.002 * (n + 1))

    run_in_threads(
        [lambda n=n: drainer(n) for n in range(DRAINS)]
        + [lambda n=n: scheduler(n) for n in range(SCHEDULERS)],
        timeout=120,
    )


@pytest.fixture
def slow_asset_inserts() -> Iterator[None]:
    """A test-only trigger that makes each asset row insert take ROW_DELAY: an INSERT of the
    round's NEW_ASSETS then lasts long enough that concurrent drains' inserts always run at
    the same time, whatever the machine's load (without it two drains overlapped in only some
    rounds: a 1,000-row insert takes milliseconds). Nothing else changes: the locks, waits and
    PostgreSQL's deadlock detection are the real ones."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION test_slow_insert() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN PERFORM pg_sleep({ROW_DELAY}); RETURN NEW; END $$"
        )
        cursor.execute(
            "CREATE TRIGGER test_slow_insert BEFORE INSERT ON assets_app_asset "
            "FOR EACH ROW EXECUTE FUNCTION test_slow_insert()"
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER IF EXISTS test_slow_insert ON assets_app_asset")
            cursor.execute("DROP FUNCTION IF EXISTS test_slow_insert()")


def _setup_hot_dags() -> None:
    conditions = [HOT, {"all": [HOT]}, {"any": [HOT]}, {"all": [{"any": [HOT]}]}]
    for j in range(HOT_DAGS):
        make_scheduled_dag(f"hot_dag_{j}", conditions[j % len(conditions)])


def _drive(
    monkeypatch, *, rounds: int, stop_at_first_deadlock: bool
) -> tuple[Observed, int, int, float]:
    observed = Observed()
    deadlocks_before = pg_deadlocks()
    started = time.monotonic()
    done = 0
    with observed.spying(monkeypatch):
        for round_no in range(rounds):
            _queue_round(round_no)
            _run_round(round_no, observed)
            done += 1
            if stop_at_first_deadlock and observed.deadlocks:
                break
    elapsed = time.monotonic() - started
    return observed, pg_deadlocks() - deadlocks_before, done, elapsed


def test_drains_creating_the_same_new_assets_never_deadlock(monkeypatch, slow_asset_inserts):
    _setup_hot_dags()
    observed, deadlocks_pg, rounds, elapsed = _drive(
        monkeypatch, rounds=ROUNDS, stop_at_first_deadlock=False
    )
    report = consumption_report()
    overlapping = observed.overlapping_rounds()
    figure(
        f"deadlocks (lock order kept): {rounds} rounds x {DRAINS} drains sharing {NEW_ASSETS} "
        f"new assets and {NEW_ALIASES} aliases; overlapping asset inserts in {overlapping} "
        f"rounds; deadlocks raised={observed.deadlocks} pg_stat={deadlocks_pg}; "
        f"{report['runs']} runs, {elapsed:.1f} s"
    )
    assert (observed.deadlocks, deadlocks_pg) == (0, 0)
    # Every round should overlap (each insert lasts NEW_ASSETS * ROW_DELAY); one is enough proof
    # and leaves room for a thread that a loaded machine delays past the others' commit.
    assert overlapping >= 1, "drains never inserted the same assets at once: nothing driven"
    assert AssetEventQueue.objects.count() == 0
    assert AssetDagRunQueue.objects.count() == 0
    assert report["consumptions"] == HOT_DAGS * (rounds * DRAINS)
    assert (report["missed"], report["foreign"], report["doubled"], report["empty_runs"]) == (
        0,
        0,
        0,
        0,
    )


def test_control_with_the_lock_order_broken_the_drive_deadlocks(monkeypatch, slow_asset_inserts):
    """The same drive with `in_lock_order` replaced by the callers' own order (what dropping
    the sort would do): opposite payload orders then meet, and the test above would fail."""
    _setup_hot_dags()
    monkeypatch.setattr(registration, "in_lock_order", list)
    observed, deadlocks_pg, rounds, elapsed = _drive(
        monkeypatch, rounds=CONTROL_ROUNDS, stop_at_first_deadlock=True
    )
    figure(
        f"deadlocks (control, order broken): {rounds} round(s); deadlocks raised="
        f"{observed.deadlocks} pg_stat={deadlocks_pg}, {elapsed:.1f} s"
    )
    assert observed.deadlocks >= 1, f"no deadlock in {rounds} rounds with the order broken"
    assert deadlocks_pg >= 1
    # The drain survives its deadlocks: the victim's rows are retried one by one and registered.
    assert AssetEventQueue.objects.filter(parked_at__isnull=False).count() == 0
