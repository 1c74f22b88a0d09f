"""The queue watchers' consumer process (`manage.py watch_queues`, the Procfile's `watcher`).

One thread per enabled watcher, each with its own AMQP connection (pika's BlockingConnection)
and its own database connection. A thread declares its queue (durable), sets `basic_qos` to
the watcher's prefetch and consumes with manual acknowledgements: each delivery goes to
`watchers.handle_message` (one durable transaction) and is acknowledged only after that
returned, so after its commit. A process killed between the commit and the ack leaves the
message unacknowledged: the broker delivers it again (to this watcher's next consumer, or to
another running one) and its dedup row turns it into a duplicate, acknowledged and not
registered again. Any number of these processes may consume one queue at once: the broker
spreads deliveries over them (at most `prefetch` unacknowledged each), and the dedup row's
unique insert makes a concurrent redelivery wait and then write nothing.

The broker going away (a restart, a network cut) ends the connection: the thread logs it and
reconnects with capped exponential backoff and jitter (`ASSET_WATCHER_RECONNECT_BASE_SECONDS`
doubling to `..._CAP_SECONDS`); messages it had not acknowledged are redelivered. A database
that is away or full while a message is handled is treated the same way (not acknowledged,
reconnect after the backoff, which only a handled message resets); any other refusal of the
database parks the message (`handle`), so one message cannot stop a queue (issue 38). Every
`ASSET_WATCHER_CHECK_SECONDS` each thread stores its queue's depth (a passive queue_declare: the
lag gauge), re-reads its routes, and stops when its watcher was disabled or
deleted, or reconnects when its broker URL, queue or prefetch changed; the main thread starts
threads for watchers enabled since.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence

import pika
import pika.exceptions
from django.conf import settings
from django.db import DatabaseError, connections

from ..models import QueueWatcher
from ..sql.errors import database_unavailable_reason
from . import messages as watchers

logger = logging.getLogger(__name__)

# Called after a message's transaction returned and before its ack (tests put a crash here).
BeforeAck = Callable[[watchers.Outcome], None]


def broker_url_of(watcher: QueueWatcher) -> str:
    return watcher.broker_url or settings.ASSET_WATCHER_BROKER_URL


def connection_parameters(url: str) -> pika.URLParameters:
    params = pika.URLParameters(url)
    params.connection_attempts = 1
    params.socket_timeout = 5
    params.blocked_connection_timeout = 60
    if "heartbeat=" not in url:
        params.heartbeat = 30
    return params


class _Consumer:
    """One watcher's consuming loop (`consume`)."""

    def __init__(
        self,
        *,
        watcher_id: int,
        stop: threading.Event,
        before_ack: BeforeAck | None,
        max_messages: int | None,
    ) -> None:
        self.watcher_id = watcher_id
        self.stop = stop
        self.before_ack = before_ack
        self.max_messages = max_messages
        self.handled = 0
        self.backoff = settings.ASSET_WATCHER_RECONNECT_BASE_SECONDS

    def run(self) -> int:
        while not self.stop.is_set():
            try:
                if not self._session():
                    break
            except (pika.exceptions.AMQPError, OSError) as exc:
                self._wait(f"broker connection lost ({type(exc).__name__}: {exc})")
            except DatabaseError as exc:
                connections["default"].close()
                self._wait(f"database error ({type(exc).__name__}: {exc})")
            except Exception as exc:
                # A bug met by one message: not acknowledged, so redelivered after the backoff
                # (logged with its traceback each time), and the other watchers go on.
                logger.exception("watcher %s: unexpected error", self.watcher_id)
                connections["default"].close()
                self._wait(f"unexpected error ({type(exc).__name__})")
        return self.handled

    def _wait(self, why: str) -> None:
        delay = random.uniform(self.backoff / 2, self.backoff)
        logger.warning(
            "watcher %s: %s; reconnecting in %.1f s", self.watcher_id, why.strip(), delay
        )
        self.stop.wait(delay)
        self.backoff = min(settings.ASSET_WATCHER_RECONNECT_CAP_SECONDS, self.backoff * 2)

    def _done(self) -> bool:
        return self.stop.is_set() or (
            self.max_messages is not None and self.handled >= self.max_messages
        )

    def _session(self) -> bool:
        """Connect and consume until told to stop (False: do not reconnect) or until the
        watcher's connection settings changed (True: reconnect now). Raises on a lost broker
        or database."""
        watcher = QueueWatcher.objects.filter(pk=self.watcher_id, enabled=True).first()
        if watcher is None:
            logger.info("watcher %s: disabled or deleted; stopping", self.watcher_id)
            return False
        config = (broker_url_of(watcher), watcher.queue, watcher.prefetch)
        connection = pika.BlockingConnection(connection_parameters(config[0]))
        try:
            channel = connection.channel()
            channel.queue_declare(queue=watcher.queue, durable=True)
            channel.basic_qos(prefetch_count=watcher.prefetch)
            logger.info(
                "watcher %s: consuming queue %r (prefetch %d)",
                watcher.name,
                watcher.queue,
                watcher.prefetch,
            )
            table = watchers.route_table(watcher_id=watcher.pk)
            check_every = settings.ASSET_WATCHER_CHECK_SECONDS
            next_check = time.monotonic() + check_every
            watchers.record_queue_depth(
                watcher_id=watcher.pk,
                depth=channel.queue_declare(queue=watcher.queue, passive=True).method.message_count,
            )
            for method, properties, body in channel.consume(
                watcher.queue, auto_ack=False, inactivity_timeout=0.5
            ):
                if self._done():
                    return False
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + check_every
                    declared = channel.queue_declare(queue=watcher.queue, passive=True)
                    watchers.record_queue_depth(
                        watcher_id=watcher.pk, depth=declared.method.message_count
                    )
                    fresh = QueueWatcher.objects.filter(pk=watcher.pk, enabled=True).first()
                    if fresh is None:
                        return False
                    if (broker_url_of(fresh), fresh.queue, fresh.prefetch) != config:
                        return True
                    table = watchers.route_table(watcher_id=watcher.pk)
                if method is None:  # inactivity_timeout: nothing arrived
                    self.backoff = settings.ASSET_WATCHER_RECONNECT_BASE_SECONDS
                    continue
                outcome = handle(
                    table,
                    watchers.Delivery(
                        routing_key=method.routing_key or "",
                        body=body,
                        message_id=properties.message_id,
                        headers=properties.headers,
                    ),
                )
                if self.before_ack is not None:
                    self.before_ack(outcome)
                channel.basic_ack(delivery_tag=method.delivery_tag)
                self.handled += 1
                # Only a handled message ends a run of failures: a connection that fails on
                # its first message again keeps backing off.
                self.backoff = settings.ASSET_WATCHER_RECONNECT_BASE_SECONDS
                if self._done():
                    return False
            return True
        finally:
            if connection.is_open:
                with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                    connection.close()


def handle(table: watchers.RouteTable, delivery: watchers.Delivery) -> watchers.Outcome:
    """`watchers.handle_message`, where a database error is an outage (raised: not acknowledged,
    reconnect after the backoff) only when the database is really away or full
    (`sql.errors.database_unavailable_reason`); any other refusal parks the message
    (`watchers.park_refused`) so that one message cannot stop the queue."""
    try:
        return watchers.handle_message(table=table, delivery=delivery)
    except DatabaseError as exc:
        if database_unavailable_reason(exc) is not None:
            raise
        logger.warning(
            "watcher %s: the database refused a message (%s: %s); parking it",
            table.watcher_name,
            type(exc).__name__,
            watchers.storable_text(str(exc))[:500],
        )
        return watchers.park_refused(table=table, delivery=delivery, error=exc)


def consume(
    *,
    watcher_id: int,
    stop: threading.Event,
    before_ack: BeforeAck | None = None,
    max_messages: int | None = None,
) -> int:
    """Consume one watcher's queue until `stop` is set, the watcher is disabled or deleted, or
    `max_messages` were acknowledged; reconnects after broker or database errors. Returns how
    many messages it acknowledged. Closes this thread's database connections when it ends."""
    try:
        return _Consumer(
            watcher_id=watcher_id, stop=stop, before_ack=before_ack, max_messages=max_messages
        ).run()
    finally:
        connections.close_all()


def run(*, names: Sequence[str] = (), stop: threading.Event) -> None:
    """The process: a consuming thread per enabled watcher (of `names`, when given), started
    as watchers become enabled (checked every ASSET_WATCHER_CHECK_SECONDS), until `stop`."""
    threads: dict[int, threading.Thread] = {}
    while not stop.is_set():
        try:
            for watcher in watchers.consumable_watchers(names=names):
                thread = threads.get(watcher.pk)
                if thread is None or not thread.is_alive():
                    thread = threading.Thread(
                        target=consume,
                        kwargs={"watcher_id": watcher.pk, "stop": stop},
                        name=f"watcher-{watcher.name}",
                        daemon=True,
                    )
                    thread.start()
                    threads[watcher.pk] = thread
        except DatabaseError as exc:
            logger.warning("watchers: database error (%s); retrying", exc)
            connections["default"].close()
        stop.wait(settings.ASSET_WATCHER_CHECK_SECONDS)
    for thread in threads.values():
        thread.join(timeout=10)
