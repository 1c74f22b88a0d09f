"""Webhook endpoints and the messages owed to them (issue 29), following Standard Webhooks.

An endpoint has a URL (checked by the SSRF guard, `egress.check_url`, when it is saved and
before each attempt), its subscriptions (an event type and a glob over the asset name or the
dag_id), a signing secret `whsec_<base64>` stored Fernet-encrypted as Connections' passwords
are, and a state (active, paused by an operator, disabled by a 410).

Messages are written in the transaction of what they report, by one statement per batch that
matches subscriptions in the database (`sql/webhooks.py`): an asset event's by the statement
that inserts it (`registration_sql.insert_events`), a finished run's by the finish
(`dependencies.finish_run_if_done`), a parked outbox row's by the park (`outbox`), a freshness
transition's by the evaluation (`freshness`). They are sent by the cluster
(`webhook_delivery`), never by the transaction that wrote them.

Signatures: `webhook-signature: v1,<base64 HMAC-SHA256(secret, "<id>.<timestamp>.<body>")>`,
one per active secret (two while a rotation's overlap lasts), space-separated.
"""

import base64
import hashlib
import hmac
import json
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ..guards import encryption, exceptions
from ..models import (
    AssetEventQueue,
    EndpointState,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEventType,
    WebhookSubscription,
)
from ..models.webhooks import PATTERN_MAX_LENGTH
from ..operations import audit
from ..sql import wakeups
from ..sql import webhooks as webhooks_sql
from . import egress

SECRET_PREFIX = "whsec_"


@dataclass(frozen=True)
class SubscriptionSpec:
    event_type: str
    pattern: str = "*"


@dataclass(frozen=True)
class SavedEndpoint:
    """An endpoint as saved; `secret` is the clear secret when this save made one (shown once)."""

    endpoint: WebhookEndpoint
    secret: str | None


def like_pattern(glob: str) -> str:
    """A glob (`*` any run, `?` one character) as a SQL LIKE pattern with `\\` as escape."""
    out = []
    for char in glob:
        if char in "\\%_":
            out.append("\\" + char)
        elif char == "*":
            out.append("%")
        elif char == "?":
            out.append("_")
        else:
            out.append(char)
    return "".join(out)


def generate_secret() -> str:
    """A new signing secret: `whsec_` and 32 random bytes in base64 (Standard Webhooks)."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def _secret_bytes(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


def sign(*, secret: str, message_id: str, timestamp: int, body: str) -> str:
    """One `v1,<signature>` of a message (Standard Webhooks, symmetric)."""
    signed = f"{message_id}.{timestamp}.{body}".encode()
    digest = hmac.new(_secret_bytes(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def active_secrets(endpoint: WebhookEndpoint, *, now: datetime) -> list[str]:
    """The clear secrets that sign now: the current one, and the previous one while its
    rotation overlap lasts."""
    found = [encryption.decrypt(endpoint.secret)]
    if (
        endpoint.previous_secret
        and endpoint.previous_secret_expires_at
        and endpoint.previous_secret_expires_at > now
    ):
        found.append(encryption.decrypt(endpoint.previous_secret))
    return [s for s in found if s]


def headers(*, endpoint: WebhookEndpoint, delivery: WebhookDelivery, now: datetime) -> dict:
    """The Standard Webhooks headers of one attempt: the id is the message's (the same on every
    attempt), the timestamp the attempt's."""
    timestamp = int(now.timestamp())
    signatures = " ".join(
        sign(secret=s, message_id=delivery.message_id, timestamp=timestamp, body=delivery.body)
        for s in active_secrets(endpoint, now=now)
    )
    return {
        "webhook-id": delivery.message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signatures,
        "content-type": "application/json",
        "user-agent": "asset-event-service-webhooks/1",
    }


def _check_subscriptions(specs: Iterable[SubscriptionSpec]) -> list[SubscriptionSpec]:
    checked = []
    for spec in specs:
        if spec.event_type not in WebhookEventType.values:
            raise exceptions.InvalidInput(
                f"unknown event type {spec.event_type!r}: one of "
                f"{', '.join(WebhookEventType.values)}",
                reason="unknown_event_type",
            )
        if not spec.pattern or len(spec.pattern) > PATTERN_MAX_LENGTH:
            raise exceptions.InvalidInput(
                f"a subscription pattern has 1 to {PATTERN_MAX_LENGTH} characters",
                reason="invalid_pattern",
            )
        if spec not in checked:
            checked.append(spec)
    if not checked:
        raise exceptions.InvalidInput(
            "an endpoint subscribes to at least one event type", reason="no_subscription"
        )
    return checked


def _set_subscriptions(endpoint: WebhookEndpoint, specs: Sequence[SubscriptionSpec]) -> None:
    endpoint.subscriptions.all().delete()
    WebhookSubscription.objects.bulk_create(
        [
            WebhookSubscription(
                endpoint=endpoint,
                event_type=spec.event_type,
                pattern=spec.pattern,
                like_pattern=like_pattern(spec.pattern),
            )
            for spec in specs
        ]
    )


def create_endpoint(
    *,
    url: str,
    subscriptions: Iterable[SubscriptionSpec],
    description: str = "",
    max_in_flight: int | None = None,
    secret: str | None = None,
    actor: audit.Actor | None = None,
) -> SavedEndpoint:
    """Create an endpoint with its subscriptions and a new secret (returned once, in clear).
    The URL must pass the SSRF guard now (EgressRefused, HTTP 422). Own durable transaction,
    audited (`webhook_endpoint.create`)."""
    specs = _check_subscriptions(subscriptions)
    egress.check_url(url)
    clear = secret or generate_secret()
    _check_secret(clear)
    with transaction.atomic(durable=True):
        encryption.check_key_reads_stored()
        endpoint = WebhookEndpoint.objects.create(
            url=url,
            description=description,
            secret=encryption.encrypt(clear) or "",
            max_in_flight=max_in_flight or int(settings.WEBHOOK_MAX_IN_FLIGHT),
        )
        _set_subscriptions(endpoint, specs)
        _audit(
            actor,
            "webhook_endpoint.create",
            [endpoint.pk],
            f"created webhook endpoint {endpoint.pk} ({_host(url)})",
            {"host": _host(url), "event_types": sorted({s.event_type for s in specs})},
        )
    return SavedEndpoint(endpoint=endpoint, secret=clear)


def _host(url: str) -> str:
    """What the trail keeps of an endpoint's URL: its host (a path or query may hold a token)."""
    return urlsplit(url).hostname or ""


def _audit(
    actor: audit.Actor | None,
    action: str,
    endpoint_ids: Sequence[int],
    summary: str,
    detail: dict[str, Any] | None = None,
) -> None:
    """An audit entry for an endpoint write, inside the write's transaction. Never a secret."""
    audit.record(
        actor=actor,
        action=action,
        summary=summary,
        targets=[audit.Target(kind="webhook_endpoint", object_id=i) for i in endpoint_ids],
        detail=detail,
    )


def _check_secret(secret: str) -> None:
    try:
        raw = _secret_bytes(secret)
    except ValueError as exc:
        raise exceptions.InvalidInput(
            f"a secret is {SECRET_PREFIX}<base64>", reason="invalid_secret"
        ) from exc
    if not secret.startswith(SECRET_PREFIX) or not 24 <= len(raw) <= 64:
        raise exceptions.InvalidInput(
            f"a secret is {SECRET_PREFIX} and 24 to 64 bytes in base64", reason="invalid_secret"
        )


def get_endpoint(*, endpoint_id: int) -> WebhookEndpoint:
    found = WebhookEndpoint.objects.prefetch_related("subscriptions").filter(id=endpoint_id)
    endpoint = found.first()
    if endpoint is None:
        raise exceptions.NotFound(f"webhook endpoint {endpoint_id} not found")
    return endpoint


def list_endpoints(*, limit: int = 100, offset: int = 0) -> tuple[list[WebhookEndpoint], int]:
    endpoints = WebhookEndpoint.objects.prefetch_related("subscriptions").order_by("id")
    return list(endpoints[offset : offset + limit]), endpoints.count()


def update_endpoint(
    *,
    endpoint_id: int,
    url: str | None = None,
    description: str | None = None,
    subscriptions: Iterable[SubscriptionSpec] | None = None,
    max_in_flight: int | None = None,
    actor: audit.Actor | None = None,
) -> WebhookEndpoint:
    """Change an endpoint's URL (SSRF-checked), description, subscriptions or in-flight bound.
    Own durable transaction, audited (`webhook_endpoint.change`, naming the fields given, if any);
    messages already written keep going to it."""
    specs = _check_subscriptions(subscriptions) if subscriptions is not None else None
    if url is not None:
        egress.check_url(url)
    with transaction.atomic(durable=True):
        endpoint = get_endpoint(endpoint_id=endpoint_id)
        if url is not None:
            endpoint.url = url
        if description is not None:
            endpoint.description = description
        if max_in_flight is not None:
            endpoint.max_in_flight = max_in_flight
        endpoint.save()
        if specs is not None:
            _set_subscriptions(endpoint, specs)
        given = {
            "url": url,
            "description": description,
            "subscriptions": specs,
            "max_in_flight": max_in_flight,
        }
        fields = sorted(k for k, v in given.items() if v is not None)
        if fields:
            _audit(
                actor,
                "webhook_endpoint.change",
                [endpoint_id],
                f"changed webhook endpoint {endpoint_id}: {', '.join(fields)}",
                {"fields": fields, "host": _host(endpoint.url)},
            )
    return get_endpoint(endpoint_id=endpoint_id)


def delete_endpoint(*, endpoint_id: int, actor: audit.Actor | None = None) -> None:
    """Delete an endpoint, its subscriptions and the messages owed to it. Own transaction,
    audited (`webhook_endpoint.delete`)."""
    with transaction.atomic(durable=True):
        deleted, _ = WebhookEndpoint.objects.filter(id=endpoint_id).delete()
        if not deleted:
            raise exceptions.NotFound(f"webhook endpoint {endpoint_id} not found")
        _audit(
            actor,
            "webhook_endpoint.delete",
            [endpoint_id],
            f"deleted webhook endpoint {endpoint_id}",
        )


def rotate_secret(
    *, endpoint_id: int, overlap: timedelta | None = None, actor: audit.Actor | None = None
) -> SavedEndpoint:
    """Give the endpoint a new secret (returned once, in clear); the current one keeps signing
    beside it for `overlap` (WEBHOOK_SECRET_OVERLAP_SECONDS), so receivers can switch without
    refusing a message: during it every message carries two signatures. Own transaction."""
    if overlap is None:
        overlap = timedelta(seconds=float(settings.WEBHOOK_SECRET_OVERLAP_SECONDS))
    clear = generate_secret()
    with transaction.atomic(durable=True):
        endpoint = get_endpoint(endpoint_id=endpoint_id)
        # The current secret keeps signing through the overlap: it must decrypt, and so must
        # what is stored, before the new one is written (issue 38).
        encryption.decrypt(endpoint.secret)
        encryption.check_key_reads_stored()
        endpoint.previous_secret = endpoint.secret
        endpoint.previous_secret_expires_at = timezone.now() + overlap
        endpoint.secret = encryption.encrypt(clear) or ""
        endpoint.save()
        _audit(
            actor,
            "webhook_endpoint.rotate_secret",
            [endpoint_id],
            f"rotated the secret of webhook endpoint {endpoint_id}",
            {"previous_secret_expires_at": endpoint.previous_secret_expires_at.isoformat()},
        )
    return SavedEndpoint(endpoint=endpoint, secret=clear)


def set_state(
    *,
    endpoint_ids: Iterable[int],
    state: EndpointState,
    reason: str = "",
    actor: audit.Actor | None = None,
) -> int:
    """Pause, resume (active) or disable endpoints; returns how many changed. A resumed
    endpoint's pending messages are sent from where they were (nothing was dropped while it was
    paused or disabled). One UPDATE, and an audit entry (`webhook_endpoint.<state>`, naming the
    endpoints that changed; the delivery's 410 disable is the system's) when any did."""
    with transaction.atomic():
        changed = list(
            WebhookEndpoint.objects.filter(id__in=list(endpoint_ids))
            .exclude(state=state)
            .values_list("id", flat=True)
        )
        if not changed:
            return 0
        n = (
            WebhookEndpoint.objects.filter(id__in=changed)
            .exclude(state=state)
            .update(state=state, state_reason=reason, updated_at=timezone.now())
        )
        if state == EndpointState.ACTIVE:  # its pending messages may be due: wake the delivery
            wakeups.wake(wakeups.WEBHOOKS)
        _audit(
            actor,
            f"webhook_endpoint.{EndpointState(state).value}",
            changed,
            f"webhook endpoints {', '.join(map(str, changed))} {EndpointState(state).value}"
            + (f": {reason}" if reason else ""),
        )
    return n


# --- writing messages (inside the caller's transaction) ---------------------------------------


def _iso(moment: datetime | None) -> str | None:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ") if moment else None


def body(*, event_type: str, data: dict[str, Any], now: datetime) -> str:
    """A message body: `{"type", "timestamp", "data"}` (the Standard Webhooks convention), as
    compact JSON text: the bytes stored, signed and sent are these."""
    return json.dumps(
        {"type": event_type, "timestamp": _iso(now), "data": data},
        separators=(",", ":"),
        default=str,
    )


def write_messages(
    *, event_type: str, items: Sequence[tuple[str, dict[str, Any]]], now: datetime
) -> int:
    """Write the messages of `items` ((pattern key, data) pairs) to every endpoint subscribed
    to `event_type` whose pattern matches the key. Runs inside the caller's transaction, so the
    messages commit with what they report; one statement per call, none when `items` is empty.
    Returns the number written."""
    return webhooks_sql.write_messages(
        event_type=event_type,
        items=[(key, body(event_type=event_type, data=data, now=now)) for key, data in items],
        now=now,
    )


def write_outbox_parked(rows: Sequence[AssetEventQueue], *, now: datetime) -> int:
    """The `outbox.parked` messages of rows just parked (keyed by their source dag_id). Inside
    the park's transaction; one statement, none without rows."""
    return write_messages(
        event_type=WebhookEventType.OUTBOX_PARKED,
        items=[
            (
                row.source_dag_id,
                {
                    "outbox_row_id": row.id,
                    "dag_id": row.source_dag_id,
                    "dag_run_id": row.source_run_id,
                    "task_id": row.source_task_id,
                    "map_index": row.source_map_index,
                    "try_number": row.try_number,
                    "attempts": row.attempts,
                    "last_error": (row.last_error or "").split("\n", 1)[0][:300],
                    "park_reason": row.park_reason,
                },
            )
            for row in rows
        ],
        now=now,
    )


def write_run_finished(*, dag_run_id: int, now: datetime) -> int:
    """The `dag_run.succeeded` / `dag_run.failed` message of a run that just finished. Inside
    the finish's transaction; one statement."""
    return webhooks_sql.write_run_finished_message(dag_run_id=dag_run_id, now=now)
