"""Freshness policies (issue 29): is each asset's data arriving when its consumers expect it?

A policy is `max_interval` ("an event at least every X": late once X passes after the newest
event, or after the policy's creation while there is none) or `cron_deadline` ("an event by each
tick of a cron", on the policy's time zone's wall clock, ticks as `timetables` computes them for
Dags: late from a tick until an event newer than the tick before it arrives).

The timers process evaluates a policy when it is due (`evaluate_due`, the freshness timer: woken at
the earliest `due_at`, the instant a policy becomes late if nothing arrives, and woken at once when
a policy is set or an event of a late policy's asset is registered), in batches of
FRESHNESS_BATCH_SIZE, each its own short transaction with a constant number of statements: claim the
batch (FOR UPDATE SKIP LOCKED, so two evaluators never report one transition twice), read the newest
event of its assets (one aggregate), stamp the evaluation, store the transitions and write their
webhook messages (`asset.late`, `asset.fresh`) in the same transaction. A transition is stored and
reported once; an evaluation that finds the state unchanged writes no message. The first evaluation
of a policy reports only a late asset.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Min, Q
from django.utils import timezone

from ..definitions import timetables
from ..guards import exceptions
from ..models import Asset, FreshnessKind, FreshnessPolicy, FreshnessState, WebhookEventType
from ..operations import audit
from ..sql import locks, wakeups
from ..sql import webhooks as webhooks_sql
from . import webhooks


@dataclass(frozen=True)
class Verdict:
    state: FreshnessState
    due_at: datetime | None  # when it became late, or when it will if nothing arrives


@dataclass(frozen=True)
class PassResult:
    evaluated: int
    became_late: int
    became_fresh: int
    batches: int


def verdict(policy: FreshnessPolicy, *, latest: datetime | None, now: datetime) -> Verdict:
    """The state of one policy at `now`, given its asset's newest event time (pure)."""
    if policy.kind == FreshnessKind.MAX_INTERVAL:
        due = (latest or policy.created_at) + timedelta(seconds=policy.interval_seconds or 0)
        return Verdict(FreshnessState.LATE if now >= due else FreshnessState.FRESH, due)
    cron = timetables._Cron(policy.cron, timetables.zone(policy.timezone))
    deadline = cron.align_prev(now)
    if deadline <= policy.created_at:  # no deadline since the policy exists
        return Verdict(FreshnessState.FRESH, cron.next(now))
    window_start = cron.prev(deadline)
    if latest is not None and latest > window_start:
        return Verdict(FreshnessState.FRESH, cron.next(now))
    return Verdict(FreshnessState.LATE, deadline)


def check_policy(*, kind: str, interval_seconds: int | None, cron: str, tz: str) -> None:
    """InvalidInput when a policy's fields do not make a rule."""
    if kind == FreshnessKind.MAX_INTERVAL:
        if not interval_seconds or interval_seconds < 1:
            raise exceptions.InvalidInput("max_interval needs interval_seconds >= 1")
        return
    if kind != FreshnessKind.CRON_DEADLINE:
        raise exceptions.InvalidInput(f"unknown freshness kind {kind!r}")
    try:
        timetables._Cron(cron, timetables.zone(tz))
    except timetables.TimetableError as exc:
        raise exceptions.InvalidInput(str(exc), reason="invalid_freshness_policy") from exc


def set_policy(
    *,
    asset: Asset,
    kind: str,
    interval_seconds: int | None = None,
    cron: str = "",
    tz: str = "UTC",
    actor: audit.Actor | None = None,
) -> FreshnessPolicy:
    """Create or replace an asset's policy (its state starts over, unknown). Own transaction,
    audited (`freshness_policy.set`)."""
    check_policy(kind=kind, interval_seconds=interval_seconds, cron=cron, tz=tz)
    with transaction.atomic(durable=True):
        policy, _ = FreshnessPolicy.objects.update_or_create(
            asset=asset,
            defaults={
                "kind": kind,
                "interval_seconds": interval_seconds,
                "cron": cron,
                "timezone": tz,
                "state": FreshnessState.UNKNOWN,
                "state_since": None,
                "due_at": None,
                "created_at": timezone.now(),
            },
        )
        wakeups.wake(wakeups.FRESHNESS)  # evaluated at once (at commit)
        rule = f"every {interval_seconds} s" if kind == FreshnessKind.MAX_INTERVAL else cron
        audit.record(
            actor=actor,
            action="freshness_policy.set",
            summary=f"freshness policy of asset {asset.name}: {kind} {rule} ({tz})",
            targets=[audit.Target(kind="asset", object_id=asset.pk)],
            detail={"kind": kind, "interval_seconds": interval_seconds, "cron": cron, "tz": tz},
        )
    return policy


def delete_policy(*, policy_id: int, actor: audit.Actor | None = None) -> None:
    """Remove a policy (its asset is no longer watched), audited in the same transaction (the
    caller's when there is one: the admin's delete view runs in its own atomic block)."""
    with transaction.atomic():
        policy = FreshnessPolicy.objects.select_related("asset").filter(id=policy_id).first()
        if policy is None:
            return
        policy.delete()
        audit.record(
            actor=actor,
            action="freshness_policy.delete",
            summary=f"removed the freshness policy of asset {policy.asset.name}",
            targets=[audit.Target(kind="asset", object_id=policy.asset_id)],
        )


def _message(policy: FreshnessPolicy, v: Verdict, latest: datetime | None) -> dict:
    return {
        "asset": {"id": policy.asset_id, "name": policy.asset.name},
        "state": v.state.value,
        "policy": {
            "kind": policy.kind,
            "interval_seconds": policy.interval_seconds,
            "cron": policy.cron or None,
            "timezone": policy.timezone,
        },
        "due_at": v.due_at.isoformat() if v.due_at else None,
        "last_event_at": latest.isoformat() if latest else None,
    }


def evaluate_batch(
    *,
    after_id: int,
    limit: int,
    now: datetime | None = None,
    only_due: bool = False,
    include_late: bool = True,
) -> tuple[int, int, int, int]:
    """Evaluate the next `limit` policies after `after_id` (with `only_due`, of those due at
    `now` and, with `include_late`, the late ones), own durable transaction; returns
    (evaluated, became late, became fresh, last id). At most five statements whatever `limit`:
    claim, newest events, the states stored (and the evaluation stamped), and one message
    statement per direction that has transitions."""
    with transaction.atomic(durable=True):
        now = now or timezone.now()
        policies = locks.claim_freshness_policies(
            after_id=after_id,
            limit=limit,
            due_by=now if only_due else None,
            include_late=include_late,
        )
        if not policies:
            return 0, 0, 0, after_id
        latest = webhooks_sql.latest_event_times([p.asset_id for p in policies])
        late: list[tuple[str, dict]] = []
        fresh: list[tuple[str, dict]] = []
        for policy in policies:
            v = verdict(policy, latest=latest.get(policy.asset_id), now=now)
            if v.state != policy.state:
                message = (policy.asset.name, _message(policy, v, latest.get(policy.asset_id)))
                if v.state == FreshnessState.LATE:
                    late.append(message)
                elif policy.state == FreshnessState.LATE:
                    fresh.append(message)
                policy.state_since = now
            policy.state = v.state
            policy.due_at = v.due_at
        # Every policy of the batch, changed or not: its evaluation time is stamped too.
        webhooks_sql.update_freshness(
            rows=[(p.id, p.state, p.state_since, p.due_at) for p in policies], now=now
        )
        webhooks.write_messages(event_type=WebhookEventType.ASSET_LATE, items=late, now=now)
        webhooks.write_messages(event_type=WebhookEventType.ASSET_FRESH, items=fresh, now=now)
    return len(policies), len(late), len(fresh), policies[-1].id


def evaluate_pass(
    *,
    batch_size: int | None = None,
    now: datetime | None = None,
    only_due: bool = False,
    include_late: bool = True,
) -> PassResult:
    """Evaluate every policy once (with `only_due`, every policy due at `now`, and the late
    ones with `include_late`), batch after batch (policies another evaluator holds are
    skipped: it evaluates them)."""
    size = int(batch_size or settings.FRESHNESS_BATCH_SIZE)
    now = now or timezone.now()
    after = 0
    evaluated = late = fresh = batches = 0
    while True:
        n, became_late, became_fresh, after = evaluate_batch(
            after_id=after, limit=size, now=now, only_due=only_due, include_late=include_late
        )
        if n == 0:
            break
        batches += 1
        evaluated += n
        late += became_late
        fresh += became_fresh
        if n < size:
            break
    return PassResult(evaluated=evaluated, became_late=late, became_fresh=fresh, batches=batches)


def evaluate_due(*, include_late: bool, now: datetime | None = None) -> PassResult:
    """The freshness timer's round: the policies due at `now` (never evaluated since they were
    set, or their `due_at` passed: the instant they become late if nothing arrived), and with
    `include_late` the late ones (woken because an event of a late policy's asset was
    registered, or at the timer's start: a fresh transition waits for no due time)."""
    return evaluate_pass(now=now, only_due=True, include_late=include_late)


def next_due_at() -> datetime | None:
    """When a policy is next due (`evaluate_due`): now for one never evaluated, else the
    earliest `due_at` of those not late; None when every policy is late (only an event wakes
    them) or there is none. One statement (the `freshness_policy_due` index)."""
    found = FreshnessPolicy.objects.exclude(state=FreshnessState.LATE).aggregate(
        never=Count("id", filter=Q(due_at__isnull=True)), first=Min("due_at")
    )
    return timezone.now() if found["never"] else found["first"]


def counts() -> dict[str, int]:
    """Policies by state (the dashboard and /metrics)."""
    found = dict.fromkeys(FreshnessState.values, 0)
    for state, n in FreshnessPolicy.objects.values_list("state").annotate(n=Count("id")):
        found[state] = n
    return found


def late_policies(limit: int = 20) -> Sequence[FreshnessPolicy]:
    return list(
        FreshnessPolicy.objects.select_related("asset")
        .filter(state=FreshnessState.LATE)
        .order_by("due_at")[:limit]
    )
