"""The Human-in-the-loop admin page (issue 42): an operator sees what a waiting task asks and
answers it there; the answer goes through the same domain function as the public API's (the
TI queued again with it, audited with the operator), a second answer changes nothing, and a
user without `change_hitldetail` cannot answer."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from assets_app.models import AuditEntry, HITLDetail, TIState
from tests.api.conftest import WorkerClient
from tests.api.snapshots import db_snapshot
from tests.api.test_hitl import _parked

pytestmark = pytest.mark.django_db


def _login(username: str, *codenames: str, superuser: bool = False) -> Client:
    model = get_user_model()
    if superuser:
        user = model.objects.create_superuser(username, password="pw")
    else:
        user = model.objects.create_user(username, password="pw", is_staff=True)
        for codename in codenames:
            user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


def test_an_operator_answers_on_the_admin_page():
    ti = _parked(WorkerClient())
    admin = _login("ops", superuser=True)
    url = reverse("admin:assets_app_hitldetail_change", args=[ti.id])
    listed = admin.get(reverse("admin:assets_app_hitldetail_changelist"))
    assert listed.status_code == 200
    assert b"Ship it?" in listed.content
    page = admin.get(url)
    assert page.status_code == 200
    assert b"Approve" in page.content

    answered = admin.post(url, {"answer": ["Approve"], "answer_params": "{}"})

    assert answered.status_code == 302, answered.content[-2000:]
    ti.refresh_from_db()
    assert ti.state == TIState.QUEUED
    assert ti.next_kwargs["event"]["chosen_options"] == ["Approve"]
    assert HITLDetail.objects.get(ti=ti).responded_by["name"] == "ops"
    entry = AuditEntry.objects.get(action="hitl_respond")
    assert (entry.actor_name, entry.via) == ("ops", "admin")
    # A second answer (a stale page) changes nothing.
    before = db_snapshot()
    admin.post(url, {"answer": ["Reject"], "answer_params": "{}"})
    assert db_snapshot() == before


def test_a_viewer_cannot_answer():
    ti = _parked(WorkerClient())
    viewer = _login("viewer", "view_hitldetail")
    url = reverse("admin:assets_app_hitldetail_change", args=[ti.id])
    assert viewer.get(url).status_code == 200
    before = db_snapshot()

    refused = viewer.post(url, {"answer": ["Approve"], "answer_params": "{}"})

    assert refused.status_code == 403
    assert db_snapshot() == before
