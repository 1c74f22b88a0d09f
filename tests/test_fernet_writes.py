"""Issue 26, point 4: a Connection write under a FERNET_KEY that cannot read what is stored is
refused before it writes (503 `fernet_key_invalid`), so nothing is left encrypted under the wrong
key: once the right key is back, every Connection reads as before."""

import pytest
from cryptography.fernet import Fernet
from django.utils import timezone

from assets_app.guards import encryption
from assets_app.models import Connection
from assets_app.runtime import variables

RIGHT = Fernet.generate_key().decode()
WRONG = Fernet.generate_key().decode()


@pytest.fixture
def stored(settings):
    settings.FERNET_KEY = RIGHT
    variables.save_connection(conn_id="db", create=True, password="s3cret", extra='{"a": 1}')
    settings.FERNET_KEY = WRONG
    return settings


def _still_readable(settings):
    settings.FERNET_KEY = RIGHT
    for connection in Connection.objects.all():
        variables.reveal(connection)
    assert variables.get_connection(conn_id="db").password == "s3cret"


@pytest.mark.django_db
def test_update_under_the_wrong_key_writes_nothing(stored):
    with pytest.raises(encryption.SecretsUnreadable):
        variables.save_connection(conn_id="db", create=False, password="new")
    with pytest.raises(encryption.SecretsUnreadable):
        variables.update_connection(conn_id="db", changes={"password": "new"}, update_mask=None)
    _still_readable(stored)


@pytest.mark.django_db
def test_create_under_the_wrong_key_writes_nothing(stored):
    with pytest.raises(encryption.SecretsUnreadable):
        variables.save_connection(conn_id="other", create=True, password="p")
    assert not Connection.objects.filter(conn_id="other").exists()
    _still_readable(stored)


@pytest.mark.django_db
def test_public_api_answers_503_and_writes_nothing(client, stored):
    from django.contrib.auth import get_user_model

    from assets_app.api.public_auth import create_api_token

    get_user_model().objects.create_user("ops", password="pw", is_staff=True, is_superuser=True)
    key = create_api_token(username="ops", name="t")[1]
    response = client.post(
        "/api/v2/connections",
        {"connection_id": "other", "conn_type": "http", "password": "p"},
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )
    assert response.status_code == 503, response.content
    assert response.json()["detail"]["reason"] == "fernet_key_invalid"
    assert not Connection.objects.filter(conn_id="other").exists()
    _still_readable(stored)


@pytest.mark.django_db
def test_first_secret_and_the_right_key_write(settings):
    settings.FERNET_KEY = RIGHT
    variables.save_connection(conn_id="db", create=True, password="a")
    variables.update_connection(conn_id="db", changes={"password": "b"}, update_mask=None)
    assert variables.get_connection(conn_id="db").password == "b"


# --- issue 38: every encrypted write checks the key, webhook secrets included ----------------


@pytest.mark.django_db
def test_a_host_only_patch_under_the_wrong_key_writes_nothing(stored):
    """The PATCH's answer shows the Connection's extra (decrypted, masked): a host-only change
    under a wrong key used to commit and then answer 503."""
    with pytest.raises(encryption.SecretsUnreadable):
        variables.patch_connection(conn_id="db", sent={"host": "elsewhere"})
    stored.FERNET_KEY = RIGHT
    assert Connection.objects.get(conn_id="db").host is None
    _still_readable(stored)


@pytest.mark.django_db
def test_webhook_secrets_are_not_written_under_the_wrong_key(settings, monkeypatch):
    from assets_app.events_out import egress, webhooks
    from assets_app.models import WebhookEndpoint, WebhookEventType

    monkeypatch.setattr(egress, "check_url", lambda url: None)
    subscribed = [webhooks.SubscriptionSpec(WebhookEventType.values[0], "*")]
    settings.FERNET_KEY = RIGHT
    made = webhooks.create_endpoint(url="https://hooks.example/in", subscriptions=subscribed)
    settings.FERNET_KEY = WRONG
    with pytest.raises(encryption.SecretsUnreadable):
        webhooks.create_endpoint(url="https://hooks.example/other", subscriptions=subscribed)
    with pytest.raises(encryption.SecretsUnreadable):
        webhooks.rotate_secret(endpoint_id=made.endpoint.pk)
    assert WebhookEndpoint.objects.count() == 1
    settings.FERNET_KEY = RIGHT
    endpoint = WebhookEndpoint.objects.get()
    assert webhooks.active_secrets(endpoint, now=timezone.now()) == [made.secret]


@pytest.mark.django_db
def test_a_broker_password_is_not_written_under_the_wrong_key(stored):
    from assets_app.models import QueueWatcher
    from assets_app.watchers import messages as watchers

    def write():
        return QueueWatcher.objects.create(
            name="w", queue="q", broker_url="amqp://u:secret@mq.example/%2F"
        )

    with pytest.raises(encryption.SecretsUnreadable):
        watchers.save_watcher(write=write, watcher_id=None)
    assert not QueueWatcher.objects.exists()
    _still_readable(stored)
