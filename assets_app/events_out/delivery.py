"""Sending webhook messages (issue 29): run by the cluster, never by the transactions that
wrote them, so a slow or dead receiver never delays registration or scheduling.

A pass (`deliver`) repeats, within its time budget:

1. claim, its own short transaction: lock the endpoints with due messages (FOR NO KEY UPDATE
   SKIP LOCKED, `locks.claim_webhook_endpoints`) and stamp a lease (`claimed_until`) on their
   oldest due messages, at most `max_in_flight` per endpoint counting attempts still leased
   (`sql.webhooks.claim_deliveries`); commit. No lock is held from here on.
2. send each claimed message (threads; each attempt has WEBHOOK_TIMEOUT_SECONDS), after the SSRF
   guard checks the addresses the host resolves to now (DNS rebinding) and connects to the
   checked one;
3. record each outcome in its own short transaction: the attempt row, then the message
   delivered (2xx), or due again after an exponential backoff with jitter
   (`backoff_seconds`, or the receiver's `Retry-After` when it says later), or failed once
   WEBHOOK_MAX_AGE_SECONDS (about three days) have passed since it was written. A 410 disables
   the endpoint (its messages wait, nothing is dropped, until an operator resumes it).

A process that dies mid-attempt leaves a lease that expires: the message is due again, with
the same `webhook-id` (delivery is at least once; receivers deduplicate by that id).
"""

import logging
import random
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

import urllib3
from django.conf import settings
from django.db import transaction
from django.db.models import Count, QuerySet
from django.utils import timezone

from ..models import DeliveryState, EndpointState, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from ..operations import audit
from ..sql import locks, wakeups
from ..sql import webhooks as webhooks_sql
from . import egress, webhooks

logger = logging.getLogger(__name__)
ENDPOINTS_PER_CLAIM = 50
SENDER_THREADS = 8
# How long an idle pass waits before looking for due messages again.
IDLE_POLL_SECONDS = 0.5


@dataclass(frozen=True)
class Outcome:
    status: int | None
    error: str
    retry_after: float | None
    duration_ms: int


@dataclass(frozen=True)
class DeliveryPass:
    attempts: int
    delivered: int
    failed_attempts: int
    disabled_endpoints: int


def backoff_seconds(*, attempts: int) -> float:
    """The wait after the `attempts`-th failed attempt (1-based): exponential from
    WEBHOOK_BACKOFF_BASE_SECONDS, doubling, capped at WEBHOOK_BACKOFF_CAP_SECONDS, with equal
    jitter (uniform in [ceiling / 2, ceiling]) so retries of many messages spread out while each
    one's spacing keeps its lower bound. Settings are read at call time."""
    base = float(settings.WEBHOOK_BACKOFF_BASE_SECONDS)
    cap = float(settings.WEBHOOK_BACKOFF_CAP_SECONDS)
    ceiling = min(cap, base * 2 ** min(attempts - 1, 62))
    return random.uniform(ceiling / 2, ceiling)


def _retry_after(value: str | None, *, now: datetime) -> float | None:
    """Seconds from a `Retry-After` header (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - now).total_seconds())


def lease_seconds() -> float:
    """How long a claimed message is held for its attempt: the attempt's timeout twice and a
    second more (the attempt's own checks and its record). Expired, the attempt died."""
    return 2 * float(settings.WEBHOOK_TIMEOUT_SECONDS) + 1


def claim(*, now: datetime | None = None) -> list[WebhookDelivery]:
    """Claim due messages (step 1 above), own durable transaction; returns them with their
    endpoints. Three statements whatever the number of endpoints and messages."""
    with transaction.atomic(durable=True):
        now = now or timezone.now()
        candidates = webhooks_sql.endpoints_with_due_messages(now=now, limit=ENDPOINTS_PER_CLAIM)
        endpoint_ids = locks.claim_webhook_endpoints(candidates)
        ids = webhooks_sql.claim_deliveries(
            endpoint_ids=endpoint_ids,
            now=now,
            lease_until=now + timedelta(seconds=lease_seconds()),
            default_limit=int(settings.WEBHOOK_MAX_IN_FLIGHT),
        )
    return list(WebhookDelivery.objects.select_related("endpoint").filter(id__in=ids))


def _send(delivery: WebhookDelivery) -> Outcome:
    """One HTTP attempt, outside any transaction."""
    started = time.monotonic()
    now = timezone.now()

    def outcome(status: int | None, error: str = "", retry_after: float | None = None) -> Outcome:
        elapsed = int((time.monotonic() - started) * 1000)
        return Outcome(status=status, error=error, retry_after=retry_after, duration_ms=elapsed)

    endpoint = delivery.endpoint
    try:
        target = egress.check_url(endpoint.url)
        headers = webhooks.headers(endpoint=endpoint, delivery=delivery, now=now)
    except Exception as exc:  # refused by the guard, or a secret that does not decrypt
        return outcome(None, f"{type(exc).__name__}: {exc}")
    parts = urlsplit(endpoint.url)
    default_port = 443 if target.scheme == "https" else 80
    headers["host"] = target.host if target.port == default_port else f"{target.host}:{target.port}"
    timeout = urllib3.Timeout(total=float(settings.WEBHOOK_TIMEOUT_SECONDS))
    # Connect to the address the guard checked (no second resolution a rebinding could
    # answer differently); TLS still verifies the certificate against the host name.
    pool: urllib3.HTTPConnectionPool
    if target.scheme == "https":
        pool = urllib3.HTTPSConnectionPool(
            target.address,
            target.port,
            timeout=timeout,
            retries=False,
            server_hostname=target.host,
            assert_hostname=target.host,
            cert_reqs="CERT_REQUIRED",
        )
    else:
        pool = urllib3.HTTPConnectionPool(
            target.address, target.port, timeout=timeout, retries=False
        )
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        with pool:
            response = pool.urlopen(
                "POST",
                path,
                body=delivery.body.encode(),
                headers=headers,
                redirect=False,
                retries=False,
                preload_content=False,
            )
            response.read(64 * 1024)
            response.release_conn()
    except Exception as exc:
        return outcome(None, f"{type(exc).__name__}: {exc}"[:2000])
    return outcome(
        response.status,
        "" if 200 <= response.status < 300 else f"HTTP {response.status}",
        _retry_after(response.headers.get("retry-after"), now=now),
    )


def record(delivery: WebhookDelivery, result: Outcome, *, now: datetime | None = None) -> str:
    """Record one attempt's outcome (step 3 above), own durable transaction; returns the
    message's state after it ("delivered", "pending", "failed"), or "disabled" after a 410."""
    (state,) = record_batch([(delivery, result)], now=now)
    return state


def record_batch(
    outcomes: Sequence[tuple[WebhookDelivery, Outcome]], *, now: datetime | None = None
) -> list[str]:
    """Record the outcomes of a claimed batch in one durable transaction (one commit for the
    batch: a commit per attempt made the database's fsync the bound on deliveries per second);
    returns each message's state after it (see `record`)."""
    now = now or timezone.now()
    states = []
    with transaction.atomic(durable=True):
        for delivery, result in outcomes:
            states.append(_record(delivery, result, now=now))
    return states


def _record(delivery: WebhookDelivery, result: Outcome, *, now: datetime) -> str:
    attempts = delivery.attempts + 1
    changes: dict = {
        "attempts": attempts,
        "claimed_until": None,
        "last_status": result.status,
        "last_error": result.error,
    }
    next_at: datetime | None = None
    outcome = DeliveryState.PENDING.value
    if result.status is not None and 200 <= result.status < 300:
        changes.update(state=DeliveryState.DELIVERED, delivered_at=now)
        outcome = DeliveryState.DELIVERED.value
    elif result.status == 410:
        next_at = now
        outcome = "disabled"
    else:
        wait = backoff_seconds(attempts=attempts)
        if result.retry_after is not None:
            wait = max(wait, min(result.retry_after, float(settings.WEBHOOK_BACKOFF_CAP_SECONDS)))
        next_at = now + timedelta(seconds=wait)
        age = (next_at - delivery.created_at).total_seconds()
        if age > float(settings.WEBHOOK_MAX_AGE_SECONDS):
            changes["state"] = DeliveryState.FAILED
            outcome = DeliveryState.FAILED.value
            next_at = None
    if next_at is not None:
        changes["next_attempt_at"] = next_at
    WebhookAttempt.objects.create(
        delivery_id=delivery.pk,
        attempted_at=now,
        status_code=result.status,
        error=result.error,
        duration_ms=result.duration_ms,
        next_attempt_at=next_at if outcome == DeliveryState.PENDING else None,
    )
    WebhookDelivery.objects.filter(id=delivery.pk, state=DeliveryState.PENDING).update(**changes)
    if outcome == "disabled":
        webhooks.set_state(
            endpoint_ids=[delivery.endpoint_id],
            state=EndpointState.DISABLED,
            reason=f"the receiver answered 410 Gone at {now.isoformat()}",
        )
    return outcome


def deliver(*, time_budget: float | None = None, stop_when_idle: bool = False) -> DeliveryPass:
    """Claim, send and record due messages until the time budget
    (WEBHOOK_TIME_BUDGET_SECONDS) is spent, or, with `stop_when_idle`, until nothing is due.
    Safe to run in any number of processes at once (claims skip what others hold)."""
    budget = float(settings.WEBHOOK_TIME_BUDGET_SECONDS if time_budget is None else time_budget)
    deadline = time.monotonic() + budget
    attempts = delivered = failed = disabled = 0
    with ThreadPoolExecutor(max_workers=SENDER_THREADS) as pool:
        while time.monotonic() < deadline:
            batch = claim()
            if not batch:
                if stop_when_idle:
                    break
                time.sleep(min(IDLE_POLL_SECONDS, max(0.0, deadline - time.monotonic())))
                continue
            results = list(pool.map(_send, batch))
            for state in record_batch(list(zip(batch, results, strict=True))):
                attempts += 1
                delivered += state == DeliveryState.DELIVERED
                failed += state != DeliveryState.DELIVERED
                disabled += state == "disabled"
    return DeliveryPass(
        attempts=attempts, delivered=delivered, failed_attempts=failed, disabled_endpoints=disabled
    )


def next_due_at() -> datetime | None:
    """When a message is next due for `deliver` (the delivery timer's next look): the earliest
    of the pending messages of active endpoints not in flight (their `next_attempt_at`) and
    the leases of those in flight (an attempt whose process died is due again when its lease
    expires); None when there is none. Two statements, each the first row of an index."""
    pending = WebhookDelivery.objects.filter(state=DeliveryState.PENDING)
    free = (
        pending.filter(claimed_until__isnull=True, endpoint__state=EndpointState.ACTIVE)
        .order_by("next_attempt_at")
        .values_list("next_attempt_at", flat=True)
        .first()
    )
    leased = (
        pending.filter(claimed_until__isnull=False)
        .order_by("claimed_until")
        .values_list("claimed_until", "next_attempt_at")
        .first()
    )
    candidates = [free] if free is not None else []
    if leased is not None:
        lease_end, next_attempt = leased
        assert lease_end is not None  # filtered on
        candidates.append(max(lease_end, next_attempt))
    return min(candidates, default=None)


# --- operators (admin actions) -----------------------------------------------------------------


def _replay(
    messages: QuerySet[WebhookDelivery],
    *,
    actor: audit.Actor | None,
    summary: str,
    targets: list[audit.Target],
    detail: dict[str, Any] | None = None,
) -> int:
    """Make `messages` due again now, keeping their `webhook-id`: one UPDATE and, when any
    changed, its audit entry (`webhook.replay`, `summary` after the count), in one transaction."""
    with transaction.atomic(durable=True):
        n = messages.update(
            state=DeliveryState.PENDING, next_attempt_at=timezone.now(), claimed_until=None
        )
        if n:
            wakeups.wake(wakeups.WEBHOOKS)
            audit.record(
                actor=actor,
                action="webhook.replay",
                summary=f"replayed {n} webhook messages{summary}",
                targets=targets,
                detail=detail,
            )
    return n


def replay(*, delivery_ids: Iterable[int], actor: audit.Actor | None = None) -> int:
    """Send these messages again (delivered or failed ones too), soon, with their same
    `webhook-id`; returns how many."""
    ids = sorted(delivery_ids)
    return _replay(
        WebhookDelivery.objects.filter(id__in=ids),
        actor=actor,
        summary="",
        targets=[audit.Target(kind="webhook_message", object_id=i) for i in ids],
    )


def replay_range(
    *,
    endpoint_id: int | None,
    since: datetime,
    until: datetime,
    actor: audit.Actor | None = None,
) -> int:
    """Send again every message written in [since, until) (to one endpoint, or all); returns
    how many (the range in the audit entry's detail)."""
    messages = WebhookDelivery.objects.filter(created_at__gte=since, created_at__lt=until)
    if endpoint_id is not None:
        messages = messages.filter(endpoint_id=endpoint_id)
    return _replay(
        messages,
        actor=actor,
        summary=f" written in [{since}, {until})",
        targets=[]
        if endpoint_id is None
        else [audit.Target(kind="webhook_endpoint", object_id=endpoint_id)],
        detail={"since": since.isoformat(), "until": until.isoformat()},
    )


def pause(*, endpoint_ids: Iterable[int], actor: audit.Actor | None = None) -> int:
    return webhooks.set_state(endpoint_ids=endpoint_ids, state=EndpointState.PAUSED, actor=actor)


def resume(*, endpoint_ids: Iterable[int], actor: audit.Actor | None = None) -> int:
    """Resume paused or disabled endpoints; their pending messages are due at once."""
    ids = list(endpoint_ids)
    with transaction.atomic(durable=True):
        changed = webhooks.set_state(endpoint_ids=ids, state=EndpointState.ACTIVE, actor=actor)
        WebhookDelivery.objects.filter(endpoint_id__in=ids, state=DeliveryState.PENDING).update(
            next_attempt_at=timezone.now()
        )
    return changed


def endpoint_summary(endpoint: WebhookEndpoint) -> dict[str, int]:
    """Messages of an endpoint by state (for the admin)."""
    counts = dict.fromkeys(DeliveryState.values, 0)
    for state, n in (
        WebhookDelivery.objects.filter(endpoint=endpoint)
        .values_list("state")
        .annotate(n=Count("id"))
    ):
        counts[state] = n
    return counts
