"""Issue 45: the Dag list says "active" / "paused" in words, shows the last run's state and
the tags (with a tag filter), and its import-error badge is readable."""

from datetime import timedelta

from django.urls import reverse
from django.utils import timezone

from assets_app.models import DagImportError
from tests.factories import DagFactory, DagRunFactory

DAGS = reverse("admin:assets_app_dag_changelist")


def test_the_list_shows_pause_last_run_state_and_tags(staff_client):
    now = timezone.now()
    active = DagFactory(dag_id="active_dag", is_paused=False, tags=["finance", "daily"])
    DagFactory(dag_id="paused_dag", is_paused=True, tags=["daily"])
    DagRunFactory(dag=active, run_id="old", state="success", run_after=now - timedelta(days=1))
    DagRunFactory(dag=active, run_id="new", state="failed", run_after=now)
    page = staff_client.get(DAGS).content.decode()
    assert "icon-no.svg" not in page and "icon-yes.svg" not in page
    row = page[page.index(">active_dag<") : page.index("</tr>", page.index(">active_dag<"))]
    assert '<span class="aes-badge aes-badge-ok">active</span>' in row
    assert 'data-state="failed"' in row  # the latest run's state, not the older success
    assert f'<a class="aes-tag" href="{DAGS}?tag=daily">daily</a>' in row
    paused = page[page.index(">paused_dag<") :]
    assert '<span class="aes-badge aes-badge-paused">paused</span>' in paused
    filtered = staff_client.get(DAGS, {"tag": "finance"}).content.decode()
    assert ">active_dag<" in filtered and ">paused_dag<" not in filtered


def test_the_import_error_badge_is_white_on_red(staff_client):
    DagFactory(dag_id="broken", fileloc="etl/broken.py")
    DagImportError.objects.create(
        filename="etl/broken.py", timestamp=timezone.now(), stack_trace="SyntaxError"
    )
    page = staff_client.get(DAGS).content.decode()
    assert 'class="aes-badge aes-badge-bad"' in page and ">import error</a>" in page
    assert "a.aes-badge, a.aes-badge:link, a.aes-badge:visited" in page  # not link-coloured
