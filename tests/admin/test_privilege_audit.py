"""Issue 38: granting what a user may do (permissions, groups, superuser) through the admin is
audited, with what was granted and what was taken away; a save that changes none of it is not."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission

from assets_app.models import AuditEntry

pytestmark = pytest.mark.django_db


def _form(user, **changes):
    data = {
        "username": user.username,
        "first_name": "",
        "last_name": "",
        "email": "",
        "is_active": "on",
        "date_joined_0": "2026-12-01",
        "date_joined_1": "10:00:00",
        "initial-date_joined_0": "2026-12-01",
        "initial-date_joined_1": "10:00:00",
        "user_permissions": [],
        "groups": [],
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def test_granting_permissions_and_superuser_in_the_admin_is_audited(admin_client):
    target = get_user_model().objects.create_user("ops2", password="pw")
    add_dag = Permission.objects.get(codename="add_dag")
    change_dag = Permission.objects.get(codename="change_dag")
    url = f"/admin/auth/user/{target.pk}/change/"

    response = admin_client.post(
        url,
        _form(target, user_permissions=[add_dag.pk, change_dag.pk], is_superuser="on"),
    )
    assert response.status_code == 302, response.content.decode()[-3000:]
    entry = AuditEntry.objects.get(action="privileges.change")
    assert entry.detail == {
        "granted": {
            "flags": ["is_superuser"],
            "permissions": ["assets_app.add_dag", "assets_app.change_dag"],
        },
        "revoked": {},
    }
    assert entry.actor_name == "admin" and entry.via == "admin"
    assert list(entry.targets.values_list("kind", "object_id")) == [("user", "ops2")]

    # Saved again unchanged: no entry; a permission taken away: one.
    admin_client.post(
        url, _form(target, user_permissions=[add_dag.pk, change_dag.pk], is_superuser="on")
    )
    assert AuditEntry.objects.filter(action="privileges.change").count() == 1
    admin_client.post(url, _form(target, user_permissions=[add_dag.pk], is_superuser="on"))
    latest = AuditEntry.objects.filter(action="privileges.change").order_by("-id").first()
    assert latest.detail == {"granted": {}, "revoked": {"permissions": ["assets_app.change_dag"]}}


def test_a_groups_permissions_changed_in_the_admin_are_audited(admin_client):
    group = Group.objects.create(name="dag-editors")
    change_dag = Permission.objects.get(codename="change_dag")
    response = admin_client.post(
        f"/admin/auth/group/{group.pk}/change/",
        {"name": "dag-editors", "permissions": [change_dag.pk]},
    )
    assert response.status_code == 302, response.content.decode()[-3000:]
    entry = AuditEntry.objects.get(action="privileges.change")
    assert entry.detail["granted"] == {"permissions": ["assets_app.change_dag"]}
    assert list(entry.targets.values_list("kind", "object_id")) == [("group", "dag-editors")]
