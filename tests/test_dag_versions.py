"""Dag versions (Airflow's `dag_version`, issue 49): one per synced definition change, none for
an unchanged sync; a run's `dag_versions` is the version in force when it was last queued; the
details' `latest_dag_version` the newest."""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from assets_app.api.public_auth import create_api_token
from assets_app.catalog import dags as dag_reads
from assets_app.definitions import sync as definitions
from assets_app.models import Dag, DagVersion
from tests.factories import DagRunFactory

pytestmark = pytest.mark.django_db


def _sync(description: str, *dag_ids: str) -> None:
    documents = [
        {"dag_id": d, "description": description, "tasks": [{"task_id": "t"}]} for d in dag_ids
    ]
    definitions.sync_definitions(
        dags=[d for doc in documents for d in definitions.parse_document(doc, file="f.json")]
    )


def _numbers(dag_id: str) -> list[int]:
    return list(
        DagVersion.objects.filter(dag_id=dag_id)
        .order_by("version_number")
        .values_list("version_number", flat=True)
    )


def test_a_version_per_definition_change_and_none_for_an_unchanged_sync():
    _sync("one", "a", "b")
    assert _numbers("a") == [1] and _numbers("b") == [1]
    _sync("one", "a", "b")
    assert _numbers("a") == [1]
    _sync("two", "a")
    assert _numbers("a") == [1, 2] and _numbers("b") == [1]


def test_runs_carry_the_version_in_force_when_queued_and_the_details_the_latest():
    get_user_model().objects.create_user("ops", password="pw", is_superuser=True)
    _, key = create_api_token(username="ops", name="test")
    api = Client(headers={"Authorization": f"Bearer {key}"})
    _sync("one", "a")
    v1 = DagVersion.objects.get(dag_id="a")
    DagVersion.objects.filter(pk=v1.pk).update(created_at=timezone.now() - timedelta(hours=2))
    dag = Dag.objects.get(dag_id="a")
    old = DagRunFactory(dag=dag, run_id="old", queued_at=timezone.now() - timedelta(hours=1))
    _sync("two", "a")
    new = DagRunFactory(dag=dag, run_id="new", queued_at=timezone.now() + timedelta(seconds=1))
    assert {r: v.version_number for r, v in dag_reads.versions_of_runs([old, new]).items()} == {
        old.pk: 1,
        new.pk: 2,
    }
    runs = api.get("/api/v2/dags/a/dagRuns", {"order_by": "run_after"}).json()["dag_runs"]
    numbers = {r["dag_run_id"]: [v["version_number"] for v in r["dag_versions"]] for r in runs}
    assert numbers == {"old": [1], "new": [2]}
    one = api.get("/api/v2/dags/a/dagRuns/old").json()
    assert [v["version_number"] for v in one["dag_versions"]] == [1]
    details = api.get("/api/v2/dags/a/details").json()
    assert details["latest_dag_version"]["version_number"] == 2
