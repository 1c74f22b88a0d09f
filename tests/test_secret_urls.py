"""Issue 38: viewers do not see the secrets a URL carries. A webhook URL may hold a password
(userinfo), a token in its path (Slack's /services/T/B/X) or its query (?token=); a watcher's
broker URL holds the broker's password. Operators who may change the row see it whole; a
view-only user (API token or admin) sees scheme, host and port, the rest as ***, and cannot
search on it."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from assets_app.api.public_auth import create_api_token
from assets_app.events_out import egress, webhooks
from assets_app.guards import masking
from assets_app.models import WebhookEventType
from tests.factories import QueueWatcherFactory

SECRET_URL = "https://bot:pa55word@hooks.example:8443/services/T00/B00/XyZsecret?token=t0k3n"

pytestmark = pytest.mark.django_db


def test_masked_url_keeps_scheme_host_and_port_only():
    assert masking.masked_url(SECRET_URL) == "https://bot:***@hooks.example:8443/***?***"
    assert masking.masked_url("https://hooks.example/") == "https://hooks.example/"
    assert masking.masked_url("http://[2001:db8::1]:81/x") == "http://[2001:db8::1]:81/***"


@pytest.fixture
def endpoint(monkeypatch):
    monkeypatch.setattr(egress, "check_url", lambda url: None)
    return webhooks.create_endpoint(
        url=SECRET_URL,
        subscriptions=[webhooks.SubscriptionSpec(WebhookEventType.values[0], "*")],
    ).endpoint


def _user(name, *codenames):
    user = get_user_model().objects.create_user(name, password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return user


def _api(user):
    return Client(
        headers={"Authorization": f"Bearer {create_api_token(username=user.username, name='t')[1]}"}
    )


def test_the_api_shows_a_viewer_the_masked_url_and_an_editor_the_whole(endpoint):
    viewer = _api(_user("viewer", "view_webhookendpoint"))
    editor = _api(_user("editor", "view_webhookendpoint", "change_webhookendpoint"))
    for client, url in ((viewer, masking.masked_url(SECRET_URL)), (editor, SECRET_URL)):
        assert client.get(f"/api/v2/webhooks/endpoints/{endpoint.pk}").json()["url"] == url
        listed = client.get("/api/v2/webhooks/endpoints").json()["endpoints"]
        assert [e["url"] for e in listed] == [url]


def test_the_admin_shows_a_viewer_no_secret_of_a_url_and_no_search_on_it(client, endpoint):
    watcher = QueueWatcherFactory(broker_url="amqp://ingest:br0kerpw@mq.example:5672/%2F")
    client.force_login(_user("viewer", "view_webhookendpoint", "view_queuewatcher"))
    pages = [
        client.get("/admin/assets_app/webhookendpoint/"),
        client.get(f"/admin/assets_app/webhookendpoint/{endpoint.pk}/change/"),
        client.get(f"/admin/assets_app/queuewatcher/{watcher.pk}/change/"),
    ]
    for page in pages:
        assert page.status_code == 200
        text = page.content.decode()
        for secret in ("pa55word", "XyZsecret", "t0k3n", "br0kerpw"):
            assert secret not in text
    assert "hooks.example:8443" in pages[0].content.decode()
    found = client.get("/admin/assets_app/webhookendpoint/", {"q": "XyZsecret"})
    assert found.status_code == 200 and "hooks.example" not in found.content.decode()
