"""Small things an operator notices: the front door, the icon, the console, the time zone."""

import pytest
from django.test import Client
from django.urls import reverse
from gunicorn.glogging import Logger

from project.gunicorn_logging import QuietClaimsLogger

pytestmark = pytest.mark.django_db


def test_root_leads_to_the_admin_and_the_favicon_exists(client):
    assert client.get("/").url == "/admin/"
    icon = client.get("/favicon.ico")
    assert icon.status_code == 301 and icon.url.endswith("assets_app/favicon.svg")


class _Req:
    def __init__(self, path):
        self.path = path


class _Resp:
    def __init__(self, status):
        self.status = f"{status} OK"
        self.status_code = status


@pytest.mark.parametrize(
    ("path", "status", "logged"),
    [
        ("/execution/workloads/claim", 200, False),
        ("/execution/workloads/claim", 401, True),
        ("/execution/task-instances/x/run", 200, True),
        ("/admin/", 200, True),
    ],
)
def test_claim_polls_stay_out_of_the_access_log(monkeypatch, path, status, logged):
    written = []
    monkeypatch.setattr(Logger, "access", lambda self, resp, *args: written.append(resp))
    logger = object.__new__(QuietClaimsLogger)  # its config does not matter here
    logger.access(_Resp(status), _Req(path), {}, None)
    assert bool(written) is logged


def test_times_show_their_zone_and_follow_the_operators_choice(staff_client):
    from tests.factories import DagFactory, DagRunFactory

    run = DagRunFactory(dag=DagFactory(dag_id="d"))
    url = reverse("admin:assets_app_dagrun_change", args=[run.pk])
    assert " UTC</div>" in staff_client.get(url).content.decode()
    bad = staff_client.post(reverse("operator_timezone"), {"timezone": "Mars/Olympus"}, follow=True)
    assert "Unknown time zone" in bad.content.decode()
    staff_client.post(reverse("operator_timezone"), {"timezone": "Asia/Tokyo", "next": url})
    page = staff_client.get(url).content.decode()
    assert " JST</div>" in page and 'id="tz-link">Asia/Tokyo<' in page


def test_index_groups_what_operators_use_and_hides_link_tables(staff_client):
    page = staff_client.get(reverse("admin:index")).content.decode()
    assert 'id="aes-index"' in page
    assert "Dag schedule asset references" not in page
    assert "Task outlet asset references" not in page
    assert "Audit entries" in page
    # Still reachable by URL.
    url = reverse("admin:assets_app_dagscheduleassetreference_changelist")
    assert staff_client.get(url).status_code == 200


def test_a_dag_cannot_be_deleted_from_the_admin(staff_client):
    from tests.factories import DagFactory, TaskFactory

    dag = DagFactory(dag_id="d")
    TaskFactory(dag=dag)
    page = staff_client.get(reverse("admin:assets_app_dag_change", args=[dag.pk])).content.decode()
    assert "deletelink" not in page
    assert (
        staff_client.post(reverse("admin:assets_app_dag_delete", args=[dag.pk])).status_code == 403
    )


def test_other_clients_get_no_staff_pages(db):
    assert Client().get(reverse("operator_timezone")).status_code == 302
