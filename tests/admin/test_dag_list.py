"""Issue 45: the Dag list says "active" / "paused" in words, shows the last run's state and
the tags (with a tag filter), and its import-error badge is readable; its state badge pauses
and unpauses, and a button triggers a run (POSTs of the list's form, CSRF-checked,
permission-checked and audited)."""

import json
import re
from datetime import timedelta

from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from assets_app.models import AuditEntry, Dag, DagImportError, DagRun
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
    assert 'class="aes-badge aes-badge-ok aes-toggle"' in row and ">active</button>" in row
    assert 'data-state="failed"' in row  # the latest run's state, not the older success
    assert f'<a class="aes-tag" href="{DAGS}?tag=daily">daily</a>' in row
    paused = page[page.index(">paused_dag<") :]
    assert (
        'class="aes-badge aes-badge-paused aes-toggle"' in paused and ">paused</button>" in paused
    )
    filtered = staff_client.get(DAGS, {"tag": "finance"}).content.decode()
    assert ">active_dag<" in filtered and ">paused_dag<" not in filtered


def test_the_import_error_badge_is_white_on_red(staff_client):
    DagFactory(dag_id="broken", fileloc="etl/broken.py", bundle_name="dags-folder")
    DagImportError.objects.create(
        filename="etl/broken.py", timestamp=timezone.now(), stack_trace="SyntaxError"
    )
    page = staff_client.get(DAGS).content.decode()
    assert 'class="aes-badge aes-badge-bad"' in page and ">import error</a>" in page
    assert "a.aes-badge, a.aes-badge:link, a.aes-badge:visited" in page  # not link-coloured


def csrf_client(django_user_model, *perms):
    """A logged-in staff client that enforces CSRF, as a browser meets the list."""
    user = django_user_model.objects.create_user("lister", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=["view_dag", *perms]))
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def token_of(page: str) -> str:
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)


def test_the_state_badge_pauses_and_unpauses_with_csrf_audited(django_user_model):
    DagFactory(dag_id="etl", is_paused=False)
    client = csrf_client(django_user_model, "change_dag")
    page = client.get(DAGS).content.decode()
    start = page.index('id="changelist-form"')
    form = page[start : page.index("</form>", start)]
    pause = reverse("admin:assets_app_dag_pause", args=["etl"])
    # The badge is a button of the list's own form (which carries the CSRF token).
    assert f'formaction="{pause}" name="is_paused" value="1"' in form
    assert client.post(pause, {"is_paused": "1"}).status_code == 403  # no CSRF token
    assert not Dag.objects.get().is_paused and not AuditEntry.objects.exists()
    response = client.post(
        pause, {"is_paused": "1", "csrfmiddlewaretoken": token_of(page)}, HTTP_REFERER=DAGS + "?q=e"
    )
    assert response.status_code == 302 and response.url == DAGS + "?q=e"
    assert Dag.objects.get().is_paused
    # Idempotent: a second pause (a double click) changes nothing and is still accepted.
    client.post(pause, {"is_paused": "1", "csrfmiddlewaretoken": token_of(page)})
    assert Dag.objects.get().is_paused
    page = client.get(DAGS).content.decode()
    assert f'formaction="{pause}" name="is_paused" value="0"' in page
    client.post(pause, {"is_paused": "0", "csrfmiddlewaretoken": token_of(page)})
    assert not Dag.objects.get().is_paused
    entries = list(AuditEntry.objects.order_by("id").values_list("action", "actor_name", "via"))
    assert entries == [
        ("dag.pause", "lister", "admin"),
        ("dag.pause", "lister", "admin"),
        ("dag.unpause", "lister", "admin"),
    ]
    bad = client.post(pause, {"is_paused": "yes", "csrfmiddlewaretoken": token_of(page)})
    assert bad.status_code == 400 and not Dag.objects.get().is_paused


def test_the_trigger_button_starts_an_audited_run_and_a_dag_with_params_opens_its_form(
    django_user_model,
):
    DagFactory(dag_id="etl")
    DagFactory(dag_id="with_params", params=json.dumps({"day": {"default": 1}}))
    client = csrf_client(django_user_model, "add_dagrun")
    page = client.get(DAGS).content.decode()
    trigger = reverse("admin:assets_app_dag_trigger", args=["etl"])
    assert f'formaction="{trigger}" name="from_list" value="1"' in page
    form = reverse("admin:assets_app_dag_trigger", args=["with_params"])
    assert f'<a href="{form}" class="aes-trigger"' in page
    assert client.post(trigger, {"from_list": "1"}).status_code == 403  # no CSRF token
    assert not DagRun.objects.exists()
    response = client.post(
        trigger, {"from_list": "1", "csrfmiddlewaretoken": token_of(page)}, HTTP_REFERER=DAGS
    )
    assert response.status_code == 302 and response.url == DAGS
    run = DagRun.objects.get()
    assert (run.dag_id, run.conf, run.triggering_user_name) == ("etl", {}, "lister")
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.actor_name, entry.via) == ("dag_run.trigger", "lister", "admin")
    # No pause toggle without change_dag: the badge is plain, the POST refused.
    assert 'name="is_paused"' not in page
    pause = reverse("admin:assets_app_dag_pause", args=["etl"])
    refused = client.post(pause, {"is_paused": "1", "csrfmiddlewaretoken": token_of(page)})
    assert refused.status_code == 403 and not Dag.objects.get(pk="etl").is_paused


def test_a_viewer_gets_neither_button(django_user_model):
    DagFactory(dag_id="etl")
    page = csrf_client(django_user_model).get(DAGS).content.decode()
    assert ">etl<" in page and "formaction=" not in page and 'class="aes-trigger"' not in page
    assert '<span class="aes-badge aes-badge-ok">active</span>' in page
