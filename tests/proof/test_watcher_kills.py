"""Crash: SIGKILL queue-watcher consumers while they register a queue's messages (issue 28).

MESSAGES persistent messages on one durable queue of the real RabbitMQ, routed over 25 assets:
routing key `a<k>` goes to asset k, and every seventh message also matches a body-field route
to assets 0 and 24 (so some messages produce three events). Two real `manage.py watch_queues`
processes consume the queue; one of them, chosen at random, is SIGKILLed (its whole process
group, a host dying) KILLS times, each time after the registrations have moved on, at a random
moment, and restarted. The full size also restarts the broker (`rabbitmqctl stop_app;
start_app`) in the middle: the consumers reconnect with backoff and the messages survive.

Then: every message has exactly one dedup row, registered, and exactly one event on each of
its routed assets, none on any other; one ADRQ row per event of asset 0 for the Dag scheduled
on it; the queue is empty. Redeliveries that the dedup row turned into no-ops are counted
(`watcher_messages_duplicate`).

CI runs 1,000 messages and 4 kills; WATCHER_PROOF_FULL=1 runs the issue's size: 10,000
messages, 20 kills and the broker restart (WATCHER_PROOF_MESSAGES / _KILLS to change).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from collections import defaultdict

import pytest

from assets_app.models import AssetDagRunQueue, AssetEvent, MessageState, WatcherMessage
from assets_app.operations import metrics
from tests import rabbitmq
from tests.factories import AssetFactory, QueueWatcherFactory, WatcherRouteFactory
from tests.servers import Server

from .conftest import figure, make_scheduled_dag, wait_until

ASSETS = 25
CONSUMERS = 2


def _routed(n: int) -> set[int]:
    """Asset indexes message `n` is routed to."""
    return {n % ASSETS} | ({0, ASSETS - 1} if n % 7 == 0 else set())


def _restart_broker() -> None:
    subprocess.run(["rabbitmqctl", "stop_app"], check=True, capture_output=True, timeout=120)
    time.sleep(1.0)
    subprocess.run(["rabbitmqctl", "start_app"], check=True, capture_output=True, timeout=120)


def _scenario(service_env, tmp_path, *, messages: int, kills: int, broker_restart: bool) -> None:
    assets = [AssetFactory(name=f"watched-{k}") for k in range(ASSETS)]
    dag = make_scheduled_dag("on_watched_0", {"all": ["watched-0"]})
    watcher = QueueWatcherFactory(prefetch=50)
    for k, asset in enumerate(assets):
        WatcherRouteFactory(watcher=watcher, routing_key_pattern=f"a{k}", assets=[asset])
    WatcherRouteFactory(
        watcher=watcher, body_field="fanout", body_value="yes", assets=[assets[0], assets[-1]]
    )
    duplicates_before = metrics.value(metrics.WATCHER_DUPLICATES)
    started = time.monotonic()
    rabbitmq.publish(
        watcher.queue,
        (
            rabbitmq.message(
                {"n": n, **({"fanout": "yes"} if n % 7 == 0 else {})},
                routing_key=f"a{n % ASSETS}",
                message_id=f"msg-{n}",
            )
            for n in range(messages)
        ),
    )
    published = time.monotonic()

    env = {
        **service_env,
        "ASSET_WATCHER_CHECK_SECONDS": "1",
        "ASSET_WATCHER_RECONNECT_BASE_SECONDS": "0.2",
        "ASSET_WATCHER_RECONNECT_CAP_SECONDS": "2",
        "LOG_LEVEL": "INFO",
    }
    argv = [sys.executable, "manage.py", "watch_queues", "--watcher", watcher.name]
    consumers = [Server(argv, env, tmp_path / f"watcher-{i}.log") for i in range(CONSUMERS)]
    done = lambda: WatcherMessage.objects.filter(watcher=watcher).count()  # noqa: E731
    seen_at_kills: list[int] = []
    restarted_broker_at = None
    try:
        for consumer in consumers:
            consumer.start()
        step = max(1, messages // (kills + 2))
        for kill in range(kills):
            floor = done() + step // 2
            wait_until(lambda f=floor: done() >= f, timeout=120)
            time.sleep(random.uniform(0.0, 0.3))
            if broker_restart and restarted_broker_at is None and kill == kills // 2:
                restarted_broker_at = done()
                _restart_broker()
            victim = random.choice(consumers)
            victim.kill()
            seen_at_kills.append(done())
            victim.start()
        wait_until(lambda: done() >= messages, timeout=600, interval=0.2)
        wait_until(lambda: rabbitmq.depth(watcher.queue) == 0, timeout=60)
        finished = time.monotonic()
    finally:
        for consumer in consumers:
            consumer.kill()
        logs = "".join(c.log_path.read_text(errors="replace") for c in consumers)
        rabbitmq.delete(watcher.queue)

    if restarted_broker_at is not None:
        # The consumer that was not killed then saw the broker go and came back on its own.
        assert "broker connection lost" in logs and "reconnecting in" in logs, logs[-4000:]
    # Exactly one row per message, all registered.
    rows = WatcherMessage.objects.filter(watcher=watcher)
    assert rows.count() == messages
    assert set(rows.values_list("state", flat=True)) == {MessageState.REGISTERED}, logs[-4000:]
    # Exactly one event on each routed asset, none elsewhere.
    asset_index = {a.pk: k for k, a in enumerate(assets)}
    got: dict[str, list[int]] = defaultdict(list)
    for message_id, asset_id in AssetEvent.objects.values_list("extra__message_id", "asset_id"):
        got[message_id].append(asset_index[asset_id])
    assert len(got) == messages
    wrong = {
        m: sorted(a)
        for m, a in got.items()
        if sorted(a) != sorted(_routed(int(m.removeprefix("msg-"))))
    }
    assert not wrong, dict(list(wrong.items())[:10])
    expected_events = sum(len(_routed(n)) for n in range(messages))
    assert AssetEvent.objects.count() == expected_events
    # Queued once for the Dag on asset 0, per event of asset 0.
    assert AssetDagRunQueue.objects.filter(target_dag=dag).count() == len(
        [n for n in range(messages) if 0 in _routed(n)]
    )
    duplicates = metrics.value(metrics.WATCHER_DUPLICATES) - duplicates_before
    restart = "" if restarted_broker_at is None else f", broker restarted at {restarted_broker_at}"
    figure(
        f"watcher kills: {messages} messages over {ASSETS} assets on one queue, {CONSUMERS} "
        f"consumers, {kills} SIGKILLs (at {seen_at_kills[0]} ... {seen_at_kills[-1]} "
        f"registered)"
        f"{restart}: {expected_events} events, each message exactly once on each routed asset; "
        f"{duplicates} redeliveries were no-ops; published in {published - started:.1f} s, "
        f"registered in {finished - published:.1f} s"
    )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_sigkilled_consumers_register_every_message_once(service_env, tmp_path):
    _scenario(
        service_env,
        tmp_path,
        messages=int(os.environ.get("WATCHER_PROOF_MESSAGES", 1000)),
        kills=int(os.environ.get("WATCHER_PROOF_KILLS", 4)),
        broker_restart=False,
    )


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("WATCHER_PROOF_FULL"),
    reason="the issue's size (10,000 messages, 20 kills, a broker restart): WATCHER_PROOF_FULL=1",
)
@pytest.mark.django_db(transaction=True)
def test_issue_size_10000_messages_20_kills_and_a_broker_restart(service_env, tmp_path):
    _scenario(service_env, tmp_path, messages=10_000, kills=20, broker_restart=True)
