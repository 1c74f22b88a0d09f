"""The operator path in a real browser: dashboard -> parked row -> requeue -> drain -> events.

Headless Chromium (Debian's `chromium` package) driven by Playwright's Python package through
`executable_path`, so no browser download is needed. Outside CI the test skips when Chromium or
Playwright is missing; with CI=true it must run.
"""

import os
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
import requests
from django.conf import settings
from django.db import connections
from django.utils import timezone

from assets_app import heartbeats, outbox
from assets_app.models import AssetEvent, AssetEventQueue, DagRun, DagRunType
from tests.factories import AssetEventQueueFactory, AssetFactory, DagFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# The README's screenshot; refreshed by `UPDATE_SCREENSHOTS=1 bin/test -m browser` (otherwise the
# test writes to its tmp_path so a test run leaves the work tree clean).
DOCS_SCREENSHOT = Path(settings.BASE_DIR) / "docs" / "dashboard.png"


def _playwright():
    missing = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing = "the playwright package is not installed (pip install -r requirements.txt)"
        sync_playwright = None
    if missing is None and not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        missing = f"{CHROMIUM} is missing (apt-get install -y chromium)"
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"browser test must run in CI: {missing}")
        pytest.skip(missing)
    return sync_playwright


def history() -> None:
    """An hour of activity so the dashboard chart has something to show."""
    now = timezone.now()
    heartbeats.record(component="scheduler", ok=True, detail={"dags_checked": 1})
    asset = AssetFactory(name="customers", uri="s3://lake/raw/customers")
    AssetEvent.objects.bulk_create(
        [
            AssetEvent(asset=asset, timestamp=now - timedelta(minutes=m, seconds=s))
            for m in range(0, 60, 2)
            for s in range(0, 60, 60 // (1 + (m * 7) % 5))
        ]
    )
    consumer = DagFactory(dag_id="daily_report")
    for m in range(0, 60, 6):
        run = DagRun.objects.create(
            dag=consumer, run_id=f"asset_triggered__{m}", run_type=DagRunType.ASSET_TRIGGERED
        )
        DagRun.objects.filter(pk=run.pk).update(created_at=now - timedelta(minutes=m))


def test_operator_requeues_a_parked_row_and_sees_its_events(
    live_server, monkeypatch, django_user_model, tmp_path
):
    sync_playwright = _playwright()
    screenshot = (
        DOCS_SCREENSHOT if os.environ.get("UPDATE_SCREENSHOTS") == "1" else tmp_path / "dash.png"
    )
    # Playwright's sync API runs an event loop in this thread; the ORM calls below are still
    # plain synchronous calls made between browser steps.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    django_user_model.objects.create_superuser(username="operator", password="s3cret-pw")
    history()
    orders = AssetFactory(name="orders", uri="s3://lake/raw/orders")
    row = AssetEventQueueFactory(parked=True, source_dag_id="ingest", source_task_id="fetch_orders")
    row.payload = {
        **row.payload,
        "outlets": [{"name": orders.name, "uri": orders.uri, "type": "Asset"}],
        "outlet_events": [
            {"dest_asset_key": {"name": orders.name, "uri": orders.uri}, "extra": {"rows": 42}}
        ],
    }
    row.last_error = "OperationalError: the database went away\nTraceback ..."
    row.last_error_type = "django.db.utils.OperationalError"
    row.save()

    # Worker API traffic (unauthenticated probes: 401s) for the dashboard's latency tile.
    for name in ("orders", "customers", "payments"):
        probe = requests.get(f"{live_server.url}/execution/assets/by-name", params={"name": name})
        assert probe.status_code == 401

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1360, "height": 900})
        page.goto(f"{live_server.url}/admin/dashboard/")
        assert "/admin/login/" in page.url
        page.fill("#id_username", "operator")
        page.fill("#id_password", "s3cret-pw")
        page.click("input[type=submit]")
        page.wait_for_url("**/admin/dashboard/")
        assert page.inner_text("#tile-parked .aes-value") == "1"

        page.click("#tile-parked")
        page.wait_for_url("**status=parked**")
        listing = page.inner_text("#result_list")
        assert "ingest.fetch_orders" in listing
        assert "OperationalError: the database went away" in listing
        page.check(f"input[name=_selected_action][value='{row.pk}']")
        page.select_option("select[name=action]", "requeue_now")
        page.click("button[name=index]")
        assert f"Requeued 1 outbox row(s): {row.pk}." in page.inner_text("ul.messagelist")

        result = outbox.drain(time_budget=5)
        assert (result.registered, result.failed) == (1, 0)

        page.goto(f"{live_server.url}/admin/assets_app/asseteventqueue/")
        assert "0 asset event outbox rows" in page.inner_text("#changelist")
        assert not AssetEventQueue.objects.exists()

        page.goto(f"{live_server.url}/admin/assets_app/asset/{orders.pk}/change/")
        events = page.inner_text(".field-recent_events")
        assert "ingest.fetch_orders" in events
        assert '"rows": 42' in events

        page.goto(f"{live_server.url}/admin/dashboard/")
        assert page.inner_text("#tile-parked .aes-value") == "0"
        assert "over 3 requests" in page.inner_text("#tile-latency")
        screenshot.parent.mkdir(exist_ok=True)
        page.screenshot(path=str(screenshot), full_page=True)
        browser.close()
        # ORM calls inside the Playwright block ran in its greenlet with their own connection;
        # close it so the test database can be dropped at the end of the session.
        connections.close_all()
    assert screenshot.stat().st_size > 10_000
