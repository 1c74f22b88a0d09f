"""Registration fences (invariant 16, issue 41): a bounded Dag's events consumed oldest first
even when the transactions that wrote them commit out of order.

Event ids come from a sequence when a transaction inserts them, and the transaction commits
later: an event with id 77 may commit after the event with id 78. A scheduler pass sees only
committed ADRQ rows, so without a fence a `max_events` or `per_event` Dag could get a run of
events 57-76 and 78 while 77, still in flight, went to a later run.

The fence is one transaction-scoped advisory lock per bounded Dag (`max_events_per_run` set),
keyed by a 64-bit hash of its dag_id:

- a registering transaction takes it SHARED for every bounded Dag scheduled on the assets or
  aliases it is about to write events of, sorted by key, before it allocates any event id
  (`shared_fences_sql`, in `registration_sql.announce_events`); any number of registrations
  share it;
- a scheduler pass takes it EXCLUSIVE for the bounded Dags it is about to consume from, after
  their Dag rows and before their ADRQ rows, without waiting (`try_for_scheduling`): a Dag
  whose fence a registration holds is left out of the pass, and that registration schedules it
  after its own commit (the drain's pass, the REST door's nudge). Holding the fence, the pass
  reads every row whose event id was allocated before it (their writers have committed), and a
  registration that comes after waits for the pass to commit, then allocates higher ids.
- `wait_for_scheduling` waits for the fence (at most a timeout): a Dag left out again and
  again while registrations overlap (two drains taking turns) gets its pass once the one
  registration ahead of it commits, since a waiting exclusive request queues the new shared
  ones behind it.

No deadlock: registrations take only shared fences, in key order; a scheduler either never
waits (`try_for_scheduling`) or waits holding no other fence and no row lock
(`wait_for_scheduling` comes first in its transaction). A hash collision between two Dags only
makes one wait for the other's registrations.

SQLite: nothing; it serializes writing transactions itself, so ids commit in order.
"""

from collections.abc import Sequence

from django.db import OperationalError, connection, transaction

from ..models import Dag, DagScheduleAliasReference, DagScheduleAssetReference

# The seed of `hashtextextended` for fence keys: any fixed number, so the keys of Dags are
# their own among the service's advisory locks (`locks.DAG_SYNC_ADVISORY_LOCK_KEY`).
FENCE_SEED = 0x0F3E_2C41


def _postgresql() -> bool:
    return connection.vendor == "postgresql"


def shared_fences_sql() -> str:
    """A scalar subquery taking the shared fence of every bounded Dag scheduled on the assets
    or aliases of its two array parameters (asset ids, alias ids), in key order, waiting only
    for a scheduler pass that holds one: for the statement a registration runs before it
    inserts any event (`registration_sql.announce_events`). The fences are released by the
    transaction's commit or rollback."""
    return (
        "(SELECT count(pg_advisory_xact_lock_shared(k)) FROM ("
        f"SELECT DISTINCT hashtextextended(d.dag_id, {FENCE_SEED}) AS k "
        f"FROM {Dag._meta.db_table} d "
        "WHERE d.max_events_per_run IS NOT NULL AND ("
        f"d.dag_id IN (SELECT dag_id FROM {DagScheduleAssetReference._meta.db_table} "
        "WHERE asset_id = ANY(%s)) "
        f"OR d.dag_id IN (SELECT dag_id FROM {DagScheduleAliasReference._meta.db_table} "
        "WHERE alias_id = ANY(%s))) ORDER BY k) fences)"
    )


def try_for_scheduling(dag_ids: Sequence[str]) -> list[str]:
    """Take the exclusive fence of each of these (bounded) Dags that no registration holds,
    without waiting; returns those whose fence is held (left out of the pass). 1 statement, in
    the caller's transaction; the fences taken are released by its commit or rollback."""
    if not dag_ids or not _postgresql():
        return []
    text = (
        "SELECT dag_id FROM unnest(%s::text[]) AS dag_id "
        f"WHERE NOT pg_try_advisory_xact_lock(hashtextextended(dag_id, {FENCE_SEED})) "
        "ORDER BY dag_id"
    )
    with connection.cursor() as cursor:
        cursor.execute(text, [sorted(dag_ids)])
        return [row[0] for row in cursor.fetchall()]


def wait_for_scheduling(dag_id: str, *, timeout_seconds: float) -> bool:
    """Take the exclusive fence of one Dag, waiting at most `timeout_seconds` for the
    registrations holding it; True when taken (held until the caller's transaction ends).
    Must be the first lock of the caller's transaction. 2 statements (3 on a timeout), in a
    savepoint of the caller's transaction."""
    if not _postgresql():
        return True
    milliseconds = max(1, int(timeout_seconds * 1000))
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            # The caller's lock_timeout is read before it is set for the wait, and restored
            # after it (target lists are evaluated left to right).
            cursor.execute(
                "SELECT current_setting('lock_timeout'), set_config('lock_timeout', %s, true)",
                [f"{milliseconds}ms"],
            )
            (before, _) = cursor.fetchone()
            cursor.execute(
                f"SELECT pg_advisory_xact_lock(hashtextextended(%s, {FENCE_SEED})), "
                "set_config('lock_timeout', %s, true)",
                [dag_id, before],
            )
    except OperationalError:  # lock_timeout: the savepoint is rolled back, with the setting
        return False
    return True
