"""Queue watchers (issue 28): RabbitMQ messages -> asset events, exactly once per message.

A watcher consumes one queue; its routes say which assets a message produces an event of (a
routing-key glob and/or a JSON body field equal to a value; a message produces one event per
asset of the union of the routes it matches, so one queue feeds many assets). The consumer
process (`watcher_consumer`, `manage.py watch_queues`) hands each delivery to
`handle_message` and acknowledges it only after that returned, i.e. after its transaction
committed:

- registered: ONE durable transaction inserts the (watcher, message_id) row first (its unique
  constraint is the dedup guard), then the events through `registration.register_external_events`
  (the public API's insert and ADRQ queueing, rows in lock order), and the scheduler is nudged
  after commit. A redelivery (the consumer died between commit and ack, or a second consumer
  got it back) finds the row and writes nothing: it is acknowledged as a duplicate;
- parked: a body that is not UTF-8 JSON, passes a JSON limit, or matches no route is recorded
  (its row, state parked, with the reason, the body, routing key and headers) and nothing else is
  written; it is acknowledged too. `requeue_parked` routes parked messages again under the rules
  of then (after an operator added a route) and registers the ones that now match.

A message without a `message_id` property gets a derived one, `sha256:` + the hex sha256 of its
routing key, a NUL byte and its body: a re-published identical message is the same message.

Each event's extra: `{"from_queue": <watcher name>, "message_id": ..., "routing_key": ...,
"payload": <the JSON body>}` plus `"headers"` when the message had any (as Airflow's watcher
events carry `from_trigger` and the trigger's payload).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from fnmatch import fnmatchcase
from typing import Any, Literal

from django.conf import settings
from django.db import DataError, transaction
from django.utils import timezone

from ..guards import encryption, exceptions, limits, masking
from ..models import MessageState, ParkReason, QueueWatcher, WatcherMessage, WatcherRoute
from ..models.watchers import MESSAGE_ID_MAX_LENGTH
from ..operations import audit, metrics
from ..registration import outlets as registration
from ..sql import locks
from ..sql import watchers as watchers_sql

logger = logging.getLogger(__name__)

_MISSING = object()


@dataclass(frozen=True)
class Delivery:
    """One message as the broker gave it: what routing and the event need."""

    routing_key: str
    body: bytes
    message_id: str | None = None
    headers: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Route:
    pattern: str
    body_field: str
    body_value: str
    asset_ids: frozenset[int]

    def matches(self, *, routing_key: str, payload: Any) -> bool:
        if not fnmatchcase(routing_key, self.pattern):
            return False
        if not self.body_field:
            return True
        value = _field(payload, self.body_field)
        if value is _MISSING:
            return False
        text = value if isinstance(value, str) else json.dumps(value)
        return text == self.body_value


@dataclass(frozen=True)
class RouteTable:
    """A watcher's routes as of when they were read (`route_table`)."""

    watcher_id: int
    watcher_name: str
    routes: tuple[Route, ...]

    def assets_for(self, *, routing_key: str, payload: Any) -> frozenset[int]:
        found: set[int] = set()
        for route in self.routes:
            if route.matches(routing_key=routing_key, payload=payload):
                found |= route.asset_ids
        return frozenset(found)


@dataclass(frozen=True)
class Outcome:
    """What `handle_message` did with one delivery (the consumer acks in every case)."""

    kind: Literal["registered", "duplicate", "parked"]
    message_id: str
    event_ids: tuple[int, ...] = ()
    reason: str = ""


@dataclass(frozen=True)
class RequeueResult:
    registered: tuple[int, ...]  # message row ids now registered
    still_parked: tuple[int, ...]


class _Unparseable(Exception):
    def __init__(self, reason: ParkReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _field(payload: Any, path: str) -> Any:
    value = payload
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def route_table(*, watcher_id: int) -> RouteTable:
    """The watcher's routes and their assets, read now (two queries)."""
    watcher = QueueWatcher.objects.get(pk=watcher_id)
    links: dict[int, set[int]] = {}
    for route_id, asset_id in WatcherRoute.assets.through.objects.filter(
        watcherroute__watcher_id=watcher_id
    ).values_list("watcherroute_id", "asset_id"):
        links.setdefault(route_id, set()).add(asset_id)
    routes = tuple(
        Route(
            pattern=r.routing_key_pattern,
            body_field=r.body_field,
            body_value=r.body_value,
            asset_ids=frozenset(links.get(r.pk, ())),
        )
        for r in WatcherRoute.objects.filter(watcher_id=watcher_id).order_by("id")
    )
    return RouteTable(watcher_id=watcher.pk, watcher_name=watcher.name, routes=routes)


def message_id_of(*, delivery: Delivery) -> tuple[str, bool]:
    """(message id, derived?): the message's own `message_id` (`sha256:<hex>` of it when it is
    longer than 255 characters or holds a NUL byte, which PostgreSQL's text cannot store), else
    `sha256:<hex>` of the routing key, a NUL byte and the body."""
    if delivery.message_id:
        if len(delivery.message_id) <= MESSAGE_ID_MAX_LENGTH and "\x00" not in delivery.message_id:
            return delivery.message_id, False
        # Its own digest (a prefix could be shared by two ids; a NUL cannot be stored).
        own = delivery.message_id.encode("utf-8", "surrogatepass")
        return "sha256:" + hashlib.sha256(own).hexdigest(), False
    digest = hashlib.sha256(delivery.routing_key.encode() + b"\0" + delivery.body).hexdigest()
    return f"sha256:{digest}", True


def _json_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Headers as JSON (AMQP header values may be bytes, datetimes, decimals): a value JSON
    cannot hold becomes its text."""
    if not headers:
        return {}
    return json.loads(json.dumps(dict(headers), default=str))


def _parse(body: bytes) -> Any:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Unparseable(ParkReason.NOT_UTF8, f"body is not UTF-8: {exc}") from exc
    try:
        payload = json.loads(text)
    except ValueError as exc:
        raise _Unparseable(ParkReason.NOT_JSON, f"body is not JSON: {exc}") from exc
    _check_storable(payload, field="payload")
    return payload


def storable_text(value: str) -> str:
    """`value` with each NUL byte written as the four characters `\\x00` (PostgreSQL's text
    and jsonb cannot hold a NUL): what a parked row keeps of a routing key or a detail."""
    return value.replace("\x00", "\\x00")


def _unstorable(delivery: Delivery) -> _Unparseable | None:
    """Why the database cannot keep this message as it is, before anything is parsed: a body
    over MAX_REQUEST_BODY_BYTES (the HTTP door's bound), a NUL byte in its message id or its
    routing key. None when it can."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if limit is not None and len(delivery.body) > limit:
        return _Unparseable(
            ParkReason.TOO_LARGE,
            f"body of {len(delivery.body)} bytes is over the bound of {limit} bytes "
            "(MAX_REQUEST_BODY_BYTES); its body is not kept",
        )
    for field, value in (
        ("message id", delivery.message_id),
        ("routing key", delivery.routing_key),
    ):
        if value and "\x00" in value:
            return _Unparseable(
                ParkReason.UNSTORABLE,
                f"its {field} '{storable_text(value)}' holds a NUL byte, which the database "
                "cannot store",
            )
    return None


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def _check_storable(value: Any, *, field: str) -> None:
    """The JSON limits every door applies (depth, width), and no NUL character (PostgreSQL's
    jsonb cannot hold one; the HTTP API refuses them too): else the message is parked."""
    try:
        limits.check_json(value, field=field)
    except exceptions.InvalidInput as exc:
        raise _Unparseable(ParkReason.INVALID_BODY, exc.message) from exc
    if _has_nul(value):
        raise _Unparseable(ParkReason.INVALID_BODY, f"{field} holds a NUL character")


def _extra(
    *, watcher_name: str, message_id: str, routing_key: str, payload: Any, headers: dict[str, Any]
) -> dict[str, Any]:
    extra: dict[str, Any] = {
        "from_queue": watcher_name,
        "message_id": message_id,
        "routing_key": routing_key,
        "payload": payload,
    }
    if headers:
        extra["headers"] = headers
    return extra


def handle_message(*, table: RouteTable, delivery: Delivery) -> Outcome:
    """Register one delivered message (or park it), exactly once per (watcher, message id).

    Its own durable transaction; the caller acknowledges the message after this returns, and
    must not when it raises (a database error: the broker redelivers it later). Idempotent: a
    message whose row exists (registered or parked) writes nothing and returns "duplicate"."""
    message_id, derived = message_id_of(delivery=delivery)
    headers = _json_headers(delivery.headers)
    try:
        _check_storable(headers, field="headers")
    except _Unparseable:
        headers = {"unstorable": True}  # kept out of the row; the body decides
    refused = _unstorable(delivery)
    if refused is not None:
        return _park(
            table=table,
            delivery=delivery,
            message_id=message_id,
            derived=derived,
            headers=headers,
            reason=refused.reason,
            detail=refused.detail,
        )
    try:
        payload = _parse(delivery.body)
    except _Unparseable as exc:
        return _park(
            table=table,
            delivery=delivery,
            message_id=message_id,
            derived=derived,
            headers=headers,
            reason=exc.reason,
            detail=exc.detail,
        )
    asset_ids = table.assets_for(routing_key=delivery.routing_key, payload=payload)
    if not asset_ids:
        return _park(
            table=table,
            delivery=delivery,
            message_id=message_id,
            derived=derived,
            headers=headers,
            reason=ParkReason.UNROUTABLE,
            detail=f"no route of watcher {table.watcher_name!r} matches routing key "
            f"{delivery.routing_key!r} and this body",
        )
    extra = _extra(
        watcher_name=table.watcher_name,
        message_id=message_id,
        routing_key=delivery.routing_key,
        payload=payload,
        headers=headers,
    )
    try:
        return _register(
            table=table,
            delivery=delivery,
            message_id=message_id,
            derived=derived,
            headers=headers,
            asset_ids=asset_ids,
            extra=extra,
        )
    except DataError as exc:
        # A value this database refuses that the checks above did not foresee: parked, not
        # redelivered for ever (the transaction rolled back, nothing of it was written).
        return park_refused(table=table, delivery=delivery, error=exc)


def park_refused(*, table: RouteTable, delivery: Delivery, error: Exception) -> Outcome:
    """The last resort for a message the database refused while it is up (not an outage:
    `sql.errors.database_unavailable_reason` is None): parked with what can surely be stored
    (its id, routing key and detail NUL-free, no headers; the body kept unless it is over the
    bound), so the consumer acknowledges it instead of taking it for ever again."""
    message_id, derived = message_id_of(delivery=delivery)
    oversized = _unstorable(delivery)
    return _park(
        table=table,
        delivery=delivery,
        message_id=message_id,
        derived=derived,
        headers={},
        reason=ParkReason.UNSTORABLE,
        detail=f"the database refused it: {type(error).__name__}: {error}",
        keep_body=not (oversized is not None and oversized.reason == ParkReason.TOO_LARGE),
    )


def _register(
    *,
    table: RouteTable,
    delivery: Delivery,
    message_id: str,
    derived: bool,
    headers: dict[str, Any],
    asset_ids: frozenset[int],
    extra: dict[str, Any],
) -> Outcome:
    with transaction.atomic(durable=True):
        now = timezone.now()
        row_id = watchers_sql.insert_message(
            watcher_id=table.watcher_id,
            message_id=message_id,
            message_id_derived=derived,
            state=MessageState.REGISTERED,
            reason="",
            detail="",
            routing_key=delivery.routing_key[:255],
            headers=headers,
            body=None,
            now=now,
        )
        if row_id is None:
            metrics.incr(metrics.WATCHER_DUPLICATES)
            return Outcome(kind="duplicate", message_id=message_id)
        written = registration.register_external_events(
            asset_ids=sorted(asset_ids), extra=extra, now=now
        )
        WatcherMessage.objects.filter(pk=row_id).update(event_ids=list(written.event_ids))
        metrics.incr(metrics.WATCHER_REGISTERED)
    return Outcome(kind="registered", message_id=message_id, event_ids=written.event_ids)


def _park(
    *,
    table: RouteTable,
    delivery: Delivery,
    message_id: str,
    derived: bool,
    headers: dict[str, Any],
    reason: ParkReason,
    detail: str,
    keep_body: bool | None = None,
) -> Outcome:
    """Park one message (its own durable transaction): its routing key and detail written
    NUL-free (`storable_text`), its body kept for a requeue unless it is over the bound
    (`keep_body` None: kept unless the reason is TOO_LARGE; a parked row always has a body,
    empty then)."""
    if keep_body is None:
        keep_body = reason != ParkReason.TOO_LARGE
    with transaction.atomic(durable=True):
        row_id = watchers_sql.insert_message(
            watcher_id=table.watcher_id,
            message_id=message_id,
            message_id_derived=derived,
            state=MessageState.PARKED,
            reason=reason,
            detail=storable_text(detail)[:2000],
            routing_key=storable_text(delivery.routing_key)[:255],
            headers=headers,
            body=delivery.body if keep_body else b"",
            now=timezone.now(),
        )
        if row_id is None:
            metrics.incr(metrics.WATCHER_DUPLICATES)
            return Outcome(kind="duplicate", message_id=message_id)
        metrics.incr(metrics.WATCHER_PARKED)
    logger.warning(
        "watcher %s parked message %s: %s (%s)",
        table.watcher_name,
        message_id,
        reason,
        storable_text(detail)[:2000],
    )
    return Outcome(kind="parked", message_id=message_id, reason=str(reason))


def requeue_parked(*, ids: Sequence[int], actor: audit.Actor | None = None) -> RequeueResult:
    """Route the parked messages `ids` again under their watchers' current routes: a message
    that now parses and matches gets its events (as `handle_message` would have registered it)
    and becomes registered (its body dropped); one that does not stays parked with the new
    reason and one more `requeues`. One durable transaction; the rows are locked FOR UPDATE SKIP
    LOCKED (`locks.lock_parked_watcher_messages`: a message another requeue holds is skipped,
    as is one no longer parked). Audited when it locked anything."""
    with transaction.atomic(durable=True):
        rows = locks.lock_parked_watcher_messages(ids)
        tables: dict[int, RouteTable] = {}
        registered: list[int] = []
        still: list[int] = []
        now = timezone.now()
        for row in rows:
            table = tables.get(row.watcher_id)
            if table is None:
                table = tables[row.watcher_id] = route_table(watcher_id=row.watcher_id)
            body = bytes(row.body or b"")
            reason: ParkReason | None
            if row.reason in (ParkReason.UNSTORABLE, ParkReason.TOO_LARGE):
                # The same message cannot become storable: it stays as it was parked.
                reason, detail = ParkReason(row.reason), row.detail
            else:
                reason, detail = _reroute(row=row, table=table, body=body, now=now)
            if reason is None:
                registered.append(row.pk)
                continue
            WatcherMessage.objects.filter(pk=row.pk).update(
                reason=reason, detail=detail[:2000], requeues=row.requeues + 1
            )
            still.append(row.pk)
        if rows:
            metrics.incr(metrics.WATCHER_REGISTERED, len(registered))
            audit.record(
                actor=actor,
                action="watcher_message.requeue",
                summary=f"requeued parked queue messages {audit.ids_text(r.pk for r in rows)}: "
                f"{len(registered)} registered, {len(still)} still parked",
                targets=[audit.Target(kind="watcher_message", object_id=r.pk) for r in rows],
                detail={"registered": registered, "still_parked": still},
            )
    return RequeueResult(registered=tuple(registered), still_parked=tuple(still))


def _reroute(
    *, row: WatcherMessage, table: RouteTable, body: bytes, now: datetime
) -> tuple[ParkReason | None, str]:
    """Register `row` (locked, parked) if it now parses and routes: (None, ""); else the park
    reason and detail. In the caller's transaction."""
    try:
        payload = _parse(body)
    except _Unparseable as exc:
        return exc.reason, exc.detail
    asset_ids = table.assets_for(routing_key=row.routing_key, payload=payload)
    if not asset_ids:
        return ParkReason.UNROUTABLE, (
            f"no route of watcher {table.watcher_name!r} matches routing key "
            f"{row.routing_key!r} and this body (requeued)"
        )
    extra = _extra(
        watcher_name=table.watcher_name,
        message_id=row.message_id,
        routing_key=row.routing_key,
        payload=payload,
        headers=dict(row.headers or {}),
    )
    written = registration.register_external_events(
        asset_ids=sorted(asset_ids), extra=extra, now=now
    )
    WatcherMessage.objects.filter(pk=row.pk).update(
        state=MessageState.REGISTERED,
        reason="",
        detail="",
        body=None,
        event_ids=list(written.event_ids),
        registered_at=now,
        requeues=row.requeues + 1,
    )
    return None, ""


def requeue_all_parked(
    *, watcher_names: Sequence[str] = (), actor: audit.Actor | None = None, batch: int = 500
) -> RequeueResult:
    """`requeue_parked` over every parked message (of `watcher_names` when given), in batches
    of `batch` ids, one transaction each."""
    qs = WatcherMessage.objects.filter(state=MessageState.PARKED).order_by("id")
    if watcher_names:
        qs = qs.filter(watcher__name__in=list(watcher_names))
    registered: list[int] = []
    still: list[int] = []
    after = 0
    while True:
        ids = list(qs.filter(id__gt=after).values_list("id", flat=True)[:batch])
        if not ids:
            break
        result = requeue_parked(ids=ids, actor=actor)
        registered += result.registered
        still += result.still_parked
        after = ids[-1]
    return RequeueResult(registered=tuple(registered), still_parked=tuple(still))


# --- configuration and the consumer's bookkeeping ----------------------------------------------


def consumable_watchers(*, names: Sequence[str] = ()) -> list[QueueWatcher]:
    """The enabled watchers (those named, when `names` is given), by name."""
    qs = QueueWatcher.objects.filter(enabled=True).order_by("name")
    if names:
        qs = qs.filter(name__in=list(names))
    return list(qs)


def unknown_watcher_names(*, names: Sequence[str]) -> list[str]:
    known = set(QueueWatcher.objects.filter(name__in=list(names)).values_list("name", flat=True))
    return sorted(set(names) - known)


def record_queue_depth(*, watcher_id: int, depth: int | None) -> None:
    """Store the depth a consumer's periodic check saw (the lag gauge). One UPDATE, autocommit."""
    QueueWatcher.objects.filter(pk=watcher_id).update(
        queue_depth=depth, depth_checked_at=timezone.now()
    )


def config_snapshot(watcher: QueueWatcher) -> dict[str, Any]:
    """A watcher's configuration as the audit trail records it (the URL without its password)."""
    return {
        "name": watcher.name,
        "broker_url": masking.url_without_password(watcher.broker_url),
        "queue": watcher.queue,
        "enabled": watcher.enabled,
        "prefetch": watcher.prefetch,
        "routes": [
            {
                "routing_key_pattern": r.routing_key_pattern,
                "body_field": r.body_field,
                "body_value": r.body_value,
                "assets": sorted(r.assets.values_list("name", flat=True)),
            }
            for r in watcher.routes.order_by("id")
        ],
    }


def save_watcher(
    *,
    write: Callable[[], QueueWatcher],
    watcher_id: int | None,
    actor: audit.Actor | None = None,
) -> QueueWatcher:
    """Save a watcher's configuration (`write`: the admin's form and route formset saves) and
    audit it, before and after, in one durable transaction."""
    with transaction.atomic(durable=True):
        # A broker URL's password is written encrypted (`models.fields`): the key first.
        encryption.check_key_reads_stored()
        before = None
        if watcher_id is not None:
            old = QueueWatcher.objects.filter(pk=watcher_id).first()
            before = config_snapshot(old) if old else None
        watcher = write()
        after = config_snapshot(watcher)
        audit.record(
            actor=actor,
            action="queue_watcher.create" if before is None else "queue_watcher.update",
            summary=f"{'created' if before is None else 'changed'} queue watcher {watcher.name}",
            targets=[audit.Target(kind="queue_watcher", object_id=watcher.pk)],
            detail={"before": before, "after": after},
        )
    return watcher


def delete_watchers(*, ids: Sequence[int], actor: audit.Actor | None = None) -> int:
    """Delete watchers (their routes and message rows with them). Audited; durable."""
    with transaction.atomic(durable=True):
        watchers = list(QueueWatcher.objects.filter(pk__in=list(ids)).order_by("id"))
        if not watchers:
            return 0
        snapshots = [config_snapshot(w) for w in watchers]
        QueueWatcher.objects.filter(pk__in=[w.pk for w in watchers]).delete()
        audit.record(
            actor=actor,
            action="queue_watcher.delete",
            summary=f"deleted queue watchers {', '.join(w.name for w in watchers)}",
            targets=[audit.Target(kind="queue_watcher", object_id=w.pk) for w in watchers],
            detail={"before": snapshots},
        )
    return len(watchers)
