"""The real RabbitMQ of these machines (localhost:5672, guest/guest) for tests and benchmarks:
publish persistent messages to a durable queue, read its depth, delete it. Plain Python (pika,
no Django): the benchmarks import it too."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator
from typing import Any

import pika

URL = os.environ.get("ASSET_WATCHER_BROKER_URL", "amqp://guest:guest@localhost:5672/%2F")


@contextlib.contextmanager
def channel() -> Iterator[Any]:
    connection = pika.BlockingConnection(pika.URLParameters(URL))
    try:
        yield connection.channel()
    finally:
        with contextlib.suppress(Exception):
            connection.close()


def message(
    body: Any,
    *,
    routing_key: str = "",
    message_id: str | None = None,
    headers: dict[str, Any] | None = None,
) -> tuple[str, bytes, pika.BasicProperties]:
    """A message to `publish`: a body (bytes as they are, anything else as JSON)."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    props = pika.BasicProperties(
        delivery_mode=pika.DeliveryMode.Persistent,
        message_id=message_id,
        headers=headers,
        content_type="application/json",
    )
    return routing_key, raw, props


def publish(queue: str, messages: Iterable[tuple[str, bytes, pika.BasicProperties]]) -> int:
    """Publish to `queue` (declared durable) through a topic exchange of the same name bound
    with `#` (so a consumer sees each message's own routing key), with publisher confirms:
    when this returns the broker has every message."""
    count = 0
    with channel() as ch:
        ch.confirm_delivery()
        ch.queue_declare(queue=queue, durable=True)
        ch.exchange_declare(exchange=queue, exchange_type="topic", durable=True)
        ch.queue_bind(queue=queue, exchange=queue, routing_key="#")
        for routing_key, body, props in messages:
            ch.basic_publish(
                exchange=queue, routing_key=routing_key, body=body, properties=props, mandatory=True
            )
            count += 1
    return count


def depth(queue: str) -> int:
    """Messages ready in `queue` (not counting those delivered and not acknowledged)."""
    with channel() as ch:
        return ch.queue_declare(queue=queue, passive=True).method.message_count


def delete(queue: str) -> None:
    with channel() as ch:
        ch.queue_delete(queue=queue)
        ch.exchange_delete(exchange=queue)
