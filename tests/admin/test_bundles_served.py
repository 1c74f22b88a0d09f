"""Issue 44: a Dag whose bundle no running worker serves says so, on its page and in
`/healthz`, instead of its TIs waiting (or bouncing) unseen."""

from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from assets_app.operations import bundles
from tests.factories import DagFactory

pytestmark = pytest.mark.django_db


def _unserved() -> list[tuple[str, str, bool]]:
    body = Client().get("/healthz").json()["unserved_dags"]
    assert body["within_seconds"] == bundles.SERVED_WITHIN.total_seconds() == 600
    assert body["count"] == len(body["dags"])
    return [(d["dag_id"], d["bundle_name"], d["last_claim_at"] is not None) for d in body["dags"]]


def test_healthz_names_the_dags_whose_bundle_no_worker_claimed_for_lately():
    DagFactory(dag_id="a1", bundle_name="team-a")
    DagFactory(dag_id="b1", bundle_name="team-b")
    DagFactory(dag_id="b_paused", bundle_name="team-b", is_paused=True)
    DagFactory(dag_id="json_defined")  # no bundle: any worker naming none runs it
    assert _unserved() == [("a1", "team-a", False), ("b1", "team-b", False)]

    bundles.record_claim(hostname="w", bundles=["team-a"])
    assert _unserved() == [("b1", "team-b", False)]
    long_ago = timezone.now() - bundles.SERVED_WITHIN - timedelta(seconds=1)
    bundles.record_claim(hostname="w", bundles=["team-b"], now=long_ago)
    assert _unserved() == [("b1", "team-b", True)]


def test_the_dag_page_says_whether_a_worker_serves_its_bundle(staff_client):
    dag = DagFactory(dag_id="a1", bundle_name="team-a")
    page = staff_client.get(reverse("admin:assets_app_dag_change", args=[dag.pk]))
    assert page.status_code == 200
    assert b"no worker serves it" in page.content and b"--bundle team-a" in page.content
    bundles.record_claim(hostname="host-7", bundles=["team-a"])
    page = staff_client.get(reverse("admin:assets_app_dag_change", args=[dag.pk]))
    assert b"no worker serves it" not in page.content
    assert b"served: last claim" in page.content and b"host-7" in page.content
