"""`POST /api/v2/dags/{dag_id}/favorite` and `/unfavorite`, the `is_favorite` filter of
`GET /dags` and `is_favorite` of the details, as Airflow 3.3.2's `routes/public/dags.py`: per
user, 404 for an unknown Dag, 409 twice, audited."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from assets_app.api.public_auth import create_api_token
from assets_app.models import AuditEntry, DagFavorite
from tests.factories import DagFactory

pytestmark = pytest.mark.django_db


def _client(name: str) -> Client:
    get_user_model().objects.create_user(name, password="pw", is_superuser=True)
    _, key = create_api_token(username=name, name="test")
    return Client(headers={"Authorization": f"Bearer {key}"})


def _ids(client: Client, **params) -> list[str]:
    response = client.get("/api/v2/dags", params)
    assert response.status_code == 200, response.content
    return [d["dag_id"] for d in response.json()["dags"]]


def test_favorites_are_per_user_and_filter_the_dag_list():
    DagFactory(dag_id="a")
    DagFactory(dag_id="b")
    ann, bob = _client("ann"), _client("bob")
    assert ann.post("/api/v2/dags/a/favorite").status_code == 204
    assert _ids(ann, is_favorite="true") == ["a"]
    assert _ids(ann, is_favorite="false") == ["b"]
    assert _ids(bob, is_favorite="true") == []
    assert _ids(ann) == ["a", "b"]
    assert ann.get("/api/v2/dags/a/details").json()["is_favorite"] is True
    assert bob.get("/api/v2/dags/a/details").json()["is_favorite"] is False
    assert AuditEntry.objects.filter(action="favorite_dag", dag_id="a").count() == 1

    again = ann.post("/api/v2/dags/a/favorite")
    assert again.status_code == 409
    assert bob.post("/api/v2/dags/a/unfavorite").status_code == 409
    refused = bob.post("/api/v2/dags/a/unfavorite").json()["detail"]["message"]
    assert refused == "Dag is not marked as favorite"
    assert ann.post("/api/v2/dags/a/unfavorite").status_code == 204
    assert not DagFavorite.objects.exists()
    assert _ids(ann, is_favorite="true") == []


def test_an_unknown_dag_is_airflows_404():
    ann = _client("ann")
    for verb in ("favorite", "unfavorite"):
        response = ann.post(f"/api/v2/dags/nope/{verb}")
        assert response.status_code == 404
        assert response.json()["detail"]["message"] == "Dag with id 'nope' not found"
