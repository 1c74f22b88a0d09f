"""Issue 26, point 1: `POST /execution/dags/sync` is a deploy door, not a worker door.

The shared worker key (claiming work) can no longer rewrite Dags; the sync takes the deploy key
(DAG_SYNC_KEY) or an API token whose user holds `add_dag` and `change_dag`; an operator's pause
is reversed only by a credential that may pause; `fileloc` is a relative path inside the bundle.
"""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from assets_app.api.public_auth import create_api_token
from assets_app.models import AuditEntry, Dag, Task
from tests.proof.conftest import app_table_counts

DOC = {"dag_id": "lp_dag", "tasks": [{"task_id": "a"}, {"task_id": "b"}]}


def _sync(client, key, files, **extra):
    return client.post(
        "/execution/dags/sync",
        {"files": files, **extra},
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"} if key else {},
    )


@pytest.fixture
def keys(settings):
    settings.WORKER_API_KEY = "worker-key-" + "w" * 30
    settings.DAG_SYNC_KEY = "deploy-key-" + "d" * 30
    return settings


def _user_token(*perms: str) -> str:
    user = get_user_model().objects.create_user("deployer", password="x")
    user.user_permissions.set(Permission.objects.filter(codename__in=perms))
    return create_api_token(username="deployer", name="deploy")[1]


@pytest.mark.django_db
def test_worker_api_key_cannot_rewrite_dags(client, keys):
    assert (
        _sync(client, keys.DAG_SYNC_KEY, [{"file": "a.py", "definitions": [DOC]}]).status_code
        == 200
    )
    before = app_table_counts()
    rewrite = {"dag_id": "lp_dag", "tasks": []}
    refused = _sync(client, keys.WORKER_API_KEY, [{"file": "a.py", "definitions": [rewrite]}])
    assert refused.status_code == 403, refused.content
    assert refused.json()["detail"]["reason"] == "invalid_sync_credential"
    assert app_table_counts() == before
    assert Task.objects.filter(dag_id="lp_dag").count() == 2


@pytest.mark.django_db
def test_api_token_needs_add_and_change_dag(client, keys):
    files = [{"file": "a.py", "definitions": [DOC]}]
    viewer = _user_token("view_dag", "change_dag")
    refused = _sync(client, viewer, files)
    assert refused.status_code == 403
    assert refused.json()["detail"]["reason"] == "permission_denied"
    assert not Dag.objects.filter(dag_id="lp_dag").exists()
    get_user_model().objects.filter(username="deployer").delete()
    deployer = _user_token("add_dag", "change_dag")
    assert _sync(client, deployer, files).status_code == 200
    assert Dag.objects.filter(dag_id="lp_dag").exists()


@pytest.mark.django_db
def test_operator_pause_is_kept_unless_the_credential_may_pause(client, keys):
    files = [{"file": "a.py", "definitions": [{**DOC, "is_paused": False}]}]
    assert _sync(client, keys.DAG_SYNC_KEY, files).status_code == 200
    Dag.objects.filter(dag_id="lp_dag").update(is_paused=True)
    # The worker key may not pause (nor sync) at all: the operator's pause holds.
    refused = _sync(client, keys.WORKER_API_KEY, files, apply_pause=True)
    assert refused.status_code == 403
    assert Dag.objects.get(dag_id="lp_dag").is_paused is True
    # A token that may add and change Dags (PATCH /api/v2/dags/{id} pauses with change_dag)
    # keeps the pause unless it asks to apply the files' own.
    deployer = _user_token("add_dag", "change_dag")
    assert _sync(client, deployer, files).status_code == 200
    assert Dag.objects.get(dag_id="lp_dag").is_paused is True
    assert _sync(client, deployer, files, apply_pause=True).status_code == 200
    assert Dag.objects.get(dag_id="lp_dag").is_paused is False


@pytest.mark.django_db
@pytest.mark.parametrize(
    "fileloc",
    [
        "../../../../etc/passwd",
        "/etc/passwd",
        "dags/../../outside.py",
        "..",
        "..\\..\\x.py",
        "dags\\x.py",
        "C:/x.py",
        "//host/share/x.py",
        "a/./b.py",
        "a//b.py",
        "a\tb.py",
    ],
)
def test_fileloc_outside_the_bundle_is_refused(client, keys, fileloc):
    before = app_table_counts()
    refused = _sync(client, keys.DAG_SYNC_KEY, [{"file": fileloc, "definitions": [DOC]}])
    assert refused.status_code == 422, refused.content
    assert refused.json()["detail"]["reason"] == "invalid_fileloc"
    assert app_table_counts() == before


@pytest.mark.django_db
def test_relative_fileloc_in_a_subfolder_is_kept(client, keys):
    done = _sync(client, keys.DAG_SYNC_KEY, [{"file": "team/a.py", "definitions": [DOC]}])
    assert done.status_code == 200, done.content
    assert Dag.objects.get(dag_id="lp_dag").fileloc == "team/a.py"


@pytest.mark.django_db
def test_sync_is_audited_with_its_credential(client, keys):
    assert (
        _sync(client, keys.DAG_SYNC_KEY, [{"file": "a.py", "definitions": [DOC]}]).status_code
        == 200
    )
    entry = AuditEntry.objects.get(action="sync_dags")
    assert entry.via == "api" and entry.actor_name == "deploy key"
    deployer = _user_token("add_dag", "change_dag")
    changed = {**DOC, "tasks": [{"task_id": "a"}]}
    assert _sync(client, deployer, [{"file": "a.py", "definitions": [changed]}]).status_code == 200
    latest = AuditEntry.objects.filter(action="sync_dags").latest("at")
    assert latest.actor_name == "deployer"
    # An unchanged sync writes nothing, and records nothing.
    count = AuditEntry.objects.count()
    assert _sync(client, deployer, [{"file": "a.py", "definitions": [changed]}]).status_code == 200
    assert AuditEntry.objects.count() == count
