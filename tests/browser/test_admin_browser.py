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
from django.contrib.admin.utils import quote
from django.db import connections, transaction
from django.utils import timezone

from assets_app.definitions import sources
from assets_app.definitions import sync as definitions
from assets_app.models import Asset, AssetEvent, AssetEventQueue, Dag, DagRun, DagRunType, Task
from assets_app.operations import heartbeats, observability
from assets_app.outbox import drain
from assets_app.scheduling import runs
from assets_app.task_state import finishing, starting, success
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
        missing = "the playwright package is not installed (pip install -r requirements-dev.lock)"
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

    # Worker API traffic (unauthenticated probes: 401s) for the dashboard's latency tile. The
    # histogram is this process's memory: earlier tests in the run may have counted requests.
    counted = sum(series.count for series in observability.latency_histograms())
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

        result = drain.drain(time_budget=5)
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
        assert f"over {counted + 3} requests" in page.inner_text("#tile-latency")
        screenshot.parent.mkdir(exist_ok=True)
        page.screenshot(path=str(screenshot), full_page=True)
        browser.close()
        # ORM calls inside the Playwright block ran in its greenlet with their own connection;
        # close it so the test database can be dropped at the end of the session.
        connections.close_all()
    assert screenshot.stat().st_size > 10_000


LINEAGE_SHOT, GRID_SHOT, RUN_SHOT, CODE_SHOT = (
    Path(settings.BASE_DIR) / "docs" / name
    for name in ("lineage.png", "grid.png", "run.png", "dag_code.png")
)


# The DAG file a worker would have synced for clean_orders (the code view's screenshot).
CODE = '''"""Clean the raw orders into the lake's cleaned zone (<b>daily</b>)."""
from airflow.sdk import DAG, Asset, task

orders = Asset("orders", uri="s3://lake/raw/orders")
cleaned = Asset("cleaned_orders", uri="s3://lake/clean/orders")

with DAG("clean_orders", schedule=[orders], tags=["lake"]):

    @task(outlets=[cleaned])
    def clean():
        print("cleaning orders & payments")

    clean()
'''


def _shot(path: Path, tmp_path: Path) -> Path:
    return path if os.environ.get("UPDATE_SCREENSHOTS") == "1" else tmp_path / path.name


def _run_ingest(*, orders_uri: str, fail: str | None = None) -> DagRun:
    """A manual run of the example `ingest` Dag whose tasks succeed through the worker-facing
    domain functions; `fetch_orders` reports `orders` at `orders_uri`."""
    run = runs.trigger_dag(dag_id="ingest")
    now = timezone.now()
    for ti in run.task_instances.order_by("task_id"):
        ti.refresh_from_db()  # a TI created waiting is at try 0 until it is queued
        starting.start(
            ti_id=ti.id,
            try_number=ti.try_number,
            hostname="worker-1",
            unixname="airflow",
            pid=4242,
            start_date=now,
        )
        if ti.task_id == fail:
            finishing.finish(
                ti_id=ti.id, try_number=ti.try_number, state="failed", end_date=timezone.now()
            )
            continue
        name = ti.task_id.removeprefix("fetch_")
        uri = orders_uri if name == "orders" else f"s3://lake/raw/{name}"
        success.succeed(
            ti_id=ti.id,
            try_number=ti.try_number,
            end_date=timezone.now() + timedelta(seconds=3),
            task_outlets=[{"name": name, "uri": uri, "type": "Asset"}],
            outlet_events=[],
        )
    return run


def test_operator_follows_lineage_finds_a_parked_output_fixes_it_and_sees_the_audit(
    live_server, monkeypatch, django_user_model, tmp_path
):
    sync_playwright = _playwright()
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    django_user_model.objects.create_superuser(username="operator", password="s3cret-pw")
    definitions.sync_dags(paths=[Path(settings.BASE_DIR) / "examples" / "dags"])
    with transaction.atomic():  # the source a worker's sync would have stored (issue 45)
        sources.record_sources([sources.cut(Dag.objects.get(dag_id="clean_orders").fileloc, CODE)])
    for fail in ("fetch_payments", None, None):
        _run_ingest(orders_uri="s3://lake/raw/orders", fail=fail)
        drain.drain(time_budget=5)
    # The producer moved its orders: the worker now reports another uri for the same name.
    broken = _run_ingest(orders_uri="s3://lake/v2/orders")
    result = drain.drain(time_budget=5)
    assert result.parked == 1
    row = AssetEventQueue.objects.get()
    orders = Asset.objects.get(name="orders")

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(f"{live_server.url}/admin/login/?next=/admin/assets_app/dag/lineage/")
        page.fill("#id_username", "operator")
        page.fill("#id_password", "s3cret-pw")
        page.click("input[type=submit]")
        page.wait_for_url("**/dag/lineage/")
        assert page.locator(".aes-node").count() >= 9
        page.screenshot(path=str(_shot(LINEAGE_SHOT, tmp_path)), full_page=True)

        # Follow the asset to its consumer.
        page.fill("input[name=asset]", "orders")
        page.click("#lineage-filter input[type=submit]")
        page.wait_for_url("**asset=orders**")
        keys = page.eval_on_selector_all(".aes-node", "ns => ns.map(n => n.dataset.key)")
        assert "dag:clean_orders" in keys and f"asset:{orders.pk}" in keys
        page.click(".aes-node[data-key='dag:clean_orders']")
        page.wait_for_url(f"**/dag/{quote('clean_orders')}/change/")
        # Issue 45: its file's code as synced, escaped and numbered, read only.
        page.click("#content-main .object-tools a:has-text('Code')")
        code = page.locator("#dag-code .aes-source-line")
        assert code.count() == CODE.count("\n")
        assert code.first.inner_text().rstrip("\n") == CODE.splitlines()[0]
        assert "<b>" in page.inner_text("#dag-code")  # shown as text, not markup
        page.locator("#dag-code").scroll_into_view_if_needed()
        page.screenshot(path=str(_shot(CODE_SHOT, tmp_path)))
        page.click("text=Runs grid")
        page.wait_for_url("**/clean_orders/grid/")
        assert page.locator("#run-grid .aes-cell[data-state]").count() >= 3

        page.goto(f"{live_server.url}/admin/assets_app/dag/ingest/grid/")
        assert page.locator("#run-grid .aes-cell[data-state=failed]").count() == 1
        page.screenshot(path=str(_shot(GRID_SHOT, tmp_path)), full_page=True)
        # Issue 45: the failed TI's page opens on its log (tabs per try), above its fields;
        # its run's page shows the failed TI above the run's fields.
        # Issue 45: the cells are drawn from each row's compact string; a hovered cell's title
        # is written then (task · state · try · duration · run id).
        failed_cell = page.locator("#run-grid .aes-cell[data-state=failed]")
        failed_cell.hover()
        title = failed_cell.locator("xpath=..").get_attribute("title") or ""
        assert title.startswith("fetch_payments · failed · try ") and " s · " in title, title
        page.click("#run-grid .aes-cell[data-state=failed]")
        page.wait_for_url("**/taskinstance/**/change/")
        log_top = page.locator("#task-log").bounding_box()["y"]
        assert log_top < page.locator(".field-dag_run_link").bounding_box()["y"]
        assert page.locator("#task-log .aes-log-label").count() >= 1
        page.click(".field-dag_run_link a")
        page.wait_for_url("**/dagrun/**/change/")
        assert "fetch_payments" in page.inner_text("#run-failed")

        # The run whose output parked says so, and links to the row.
        page.goto(f"{live_server.url}/admin/assets_app/dagrun/{broken.pk}/change/")
        warning = page.inner_text("#outputs-warning")
        assert "fetch_orders" in warning and "is parked" in warning
        page.screenshot(path=str(_shot(RUN_SHOT, tmp_path)), full_page=True)
        page.click(f"#outputs-warning a[href$='/asseteventqueue/{row.pk}/change/']")
        page.wait_for_url(f"**/asseteventqueue/{row.pk}/change/")
        reason = page.inner_text("#park-reason")
        assert "s3://lake/v2/orders" in reason and "Correct the stored asset's uri" in reason
        assert "permanent" in page.inner_text("#attempt-history").lower()

        # The fix: the stored asset's uri, from the link in the reason.
        page.click(f"#park-reason a[href$='/asset/{orders.pk}/change/']")
        page.wait_for_url(f"**/asset/{orders.pk}/change/")
        page.fill("input[name=uri]", "s3://lake/v2/orders")
        page.click("input[name=_save]")
        page.wait_for_url("**/assets_app/asset/")

        page.goto(f"{live_server.url}/admin/assets_app/asseteventqueue/{row.pk}/change/")
        page.click("button:has-text('Requeue now')")
        assert f"Requeued 1 outbox row(s): {row.pk}." in page.inner_text("ul.messagelist")
        result = drain.drain(time_budget=5)
        assert (result.registered, result.failed) == (1, 0)
        page.goto(f"{live_server.url}/admin/assets_app/dagrun/{broken.pk}/change/")
        assert page.locator("#outputs-warning").count() == 0
        assert "orders #" in page.inner_text("#run-task-instances")

        page.goto(f"{live_server.url}/admin/assets_app/auditentry/?via__exact=admin")
        audit_list = page.inner_text("#result_list")
        assert "outbox.requeue" in audit_list and "asset.change_uri" in audit_list
        assert "operator" in audit_list
        browser.close()
        connections.close_all()
    for shot in (LINEAGE_SHOT, GRID_SHOT, RUN_SHOT, CODE_SHOT):
        assert _shot(shot, tmp_path).stat().st_size > 10_000


LIST_PAGES = (
    "asseteventqueue",
    "dagrun",
    "taskinstance",
    "auditentry",
    "dag",
    "assetevent",
    "assetdagrunqueue",
    "asset",
    "task",
)


def test_list_pages_fit_a_1400_px_window(live_server, monkeypatch, django_user_model):
    """Long Dag, task and run ids and long errors wrap or clip: no column is cut off."""
    from tests.admin.conftest import populate

    sync_playwright = _playwright()
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    django_user_model.objects.create_superuser(username="operator", password="s3cret-pw")
    populate(3)
    dag = DagFactory(dag_id="a_rather_long_dag_identifier_for_the_ingest_of_orders")
    Task.objects.create(dag=dag, task_id="fetch_orders_from_the_warehouse_in_full")
    for _ in range(2):
        runs.trigger_dag(dag_id=dag.dag_id)
    for _ in range(3):
        AssetEventQueueFactory(
            parked=True,
            source_dag_id=dag.dag_id,
            source_task_id="fetch_orders_from_the_warehouse_in_full",
            source_run_id="manual__2026-12-01T11:36:54.243574+00:00_yscny8yg",
            last_error="RegistrationError: asset name='orders' uri='s3://lake/v2/orders' "
            "conflicts with an existing asset that has the same name or uri but not both",
            last_error_kind="permanent",
        )
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(f"{live_server.url}/admin/login/")
        page.fill("#id_username", "operator")
        page.fill("#id_password", "s3cret-pw")
        page.click("input[type=submit]")
        page.wait_for_url("**/admin/")
        widths = {}
        for name in LIST_PAGES:
            page.goto(f"{live_server.url}/admin/assets_app/{name}/")
            widths[name] = page.evaluate(
                "[document.querySelector('#result_list').scrollWidth,"
                " document.querySelector('#changelist .results').clientWidth,"
                " document.documentElement.scrollWidth]"
            )
        browser.close()
        connections.close_all()
    too_wide = {n: w for n, w in widths.items() if w[0] > w[1] or w[2] > 1400}
    assert too_wide == {}
