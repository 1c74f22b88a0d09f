"""assets_app.cluster.broker.ListeningORM: NOTIFY on enqueue, a bounded LISTEN instead of
polling."""

import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone
from django_q.models import OrmQ

from assets_app.cluster.broker import ListeningORM, channel_for, listen

pytestmark = pytest.mark.django_db(transaction=True)


def test_enqueue_notifies_the_cluster_channel():
    broker = ListeningORM(list_key="test-notify")
    with listen("test-notify") as listener:
        broker.enqueue("payload")
        received = list(listener.notifies(timeout=5, stop_after=1))
    assert [n.channel for n in received] == [channel_for("test-notify")]


def test_an_empty_dequeue_waits_until_an_enqueue_wakes_it(settings):
    settings.Q_CLUSTER_IDLE_WAIT_SECONDS = 0.1
    broker = ListeningORM(list_key="test-wake")
    assert broker.dequeue() is None  # opens the LISTEN connection
    settings.Q_CLUSTER_IDLE_WAIT_SECONDS = 20
    woke: list[float] = []

    def idle_cluster():
        started = time.monotonic()
        assert broker.dequeue() is None
        woke.append(time.monotonic() - started)

    thread = threading.Thread(target=idle_cluster)
    thread.start()
    time.sleep(0.5)
    task_id = ListeningORM(list_key="test-wake").enqueue("wake up")
    thread.join(timeout=25)
    assert woke and 0.4 < woke[0] < 5, woke  # woken by the NOTIFY, not the 20 s bound
    assert [pk for pk, _ in broker.dequeue()] == [task_id]
    broker._close_listener()


def test_an_empty_dequeue_is_bounded_and_a_lost_listener_is_reopened(settings):
    settings.Q_CLUSTER_IDLE_WAIT_SECONDS = 0.3
    broker = ListeningORM(list_key="test-bound")
    started = time.monotonic()
    assert broker.dequeue() is None
    assert 0.25 < time.monotonic() - started < 5
    first = broker._listener
    first.close()  # the listening connection dropped
    assert broker.dequeue() is None
    assert broker._listener is not None and broker._listener is not first
    task_id = broker.enqueue("after the drop")
    assert [pk for pk, _ in broker.dequeue()] == [task_id]
    broker._close_listener()


def test_a_dead_clusters_task_is_taken_again_when_its_lock_expires_not_an_idle_wait_later(
    settings,
):
    """A task whose cluster was SIGKILLed mid-run sends no NOTIFY when its lock expires
    (`Q_CLUSTER_RETRY` after its start): the empty dequeue's wait ends at that expiry."""
    settings.Q_CLUSTER_IDLE_WAIT_SECONDS = 20
    broker = ListeningORM(list_key="test-expiry")
    task_id = broker.enqueue("killed mid-run")
    OrmQ.objects.filter(id=task_id).update(lock=timezone.now() + timedelta(seconds=1))
    started = time.monotonic()
    assert broker.dequeue() is None  # taken by the dead cluster: waits for its lock
    waited = time.monotonic() - started
    assert 0.8 < waited < 5, waited  # the lock's expiry, not the 20 s idle bound
    assert [pk for pk, _ in broker.dequeue()] == [task_id]
    broker._close_listener()
