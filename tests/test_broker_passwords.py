"""Issue 38: a watcher's broker password is stored encrypted (Fernet, as Connections'
passwords), read back clear by the consumer and the admin's editors; migration 0029 encrypts
the passwords stored before it."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from assets_app.models import QueueWatcher
from assets_app.watchers.consumer import broker_url_of
from tests.factories import QueueWatcherFactory

URL = "amqp://ingest:br0ker%2Fpw@mq.example:5672/%2F"


def _stored(pk: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT broker_url FROM assets_app_queuewatcher WHERE id = %s", [pk])
        return cursor.fetchone()[0]


@pytest.mark.django_db
def test_the_password_is_stored_encrypted_and_read_back_clear():
    watcher = QueueWatcherFactory(broker_url=URL)
    stored = _stored(watcher.pk)
    assert "br0ker" not in stored
    assert stored.startswith("amqp://ingest:fernet:") and stored.endswith("@mq.example:5672/%2F")
    assert QueueWatcher.objects.get(pk=watcher.pk).broker_url == URL
    assert broker_url_of(QueueWatcher.objects.get(pk=watcher.pk)) == URL
    # Without a password, and empty, the URL is stored as it is.
    plain = QueueWatcherFactory(broker_url="amqp://mq.example/%2F")
    assert _stored(plain.pk) == "amqp://mq.example/%2F"
    assert _stored(QueueWatcherFactory(broker_url="").pk) == ""


@pytest.mark.django_db(transaction=True)
def test_the_migration_encrypts_the_passwords_stored_before_it():
    before = [("assets_app", "0028_variables_encrypted")]
    after = [("assets_app", "0029_watcher_broker_password_encrypted")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    try:
        old = executor.loader.project_state(before).apps.get_model("assets_app", "QueueWatcher")
        made = old.objects.create(name="legacy", broker_url=URL, queue="q")
        assert _stored(made.pk) == URL
        MigrationExecutor(connection).migrate(after)
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert "br0ker" not in _stored(made.pk)
    assert QueueWatcher.objects.get(pk=made.pk).broker_url == URL
