"""requeue_parked: progress on long runs, a summary table by Dag, and --json for scripts."""

import json
from io import StringIO

import pytest
from django.core.management import call_command

from assets_app.management.commands import requeue_parked
from assets_app.models import AssetEventQueue
from tests.factories import AssetEventQueueFactory

pytestmark = pytest.mark.django_db


def run(*args):
    out, err = StringIO(), StringIO()
    call_command("requeue_parked", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_summary_table_by_dag():
    AssetEventQueueFactory(source_dag_id="ingest", parked=True)
    AssetEventQueueFactory(source_dag_id="ingest", parked=True)
    AssetEventQueueFactory(source_dag_id="clean", parked=True)
    out, _ = run("--all", "--dry-run")
    assert "dry run: would requeue 3 parked rows" in out
    assert f"{'clean':<40} {1:>8} {1:>14}" in out
    assert f"{'ingest':<40} {2:>8} {2:>14}" in out
    out, _ = run("--all")
    assert "requeued 3 parked rows" in out
    assert f"{'ingest':<40} {2:>8} {2:>14}" in out
    assert not AssetEventQueue.objects.filter(parked_at__isnull=False).exists()


def test_json_output():
    rows = [AssetEventQueueFactory(source_dag_id="ingest", parked=True) for _ in range(2)]
    AssetEventQueueFactory(source_dag_id="ingest")  # not parked: not selected
    out, _ = run("--dag", "ingest", "--json")
    assert json.loads(out) == {
        "dry_run": False,
        "selected": 2,
        "requeued": 2,
        "skipped": 0,
        "requeued_ids": [r.id for r in rows],
        "not_parked_ids": [],
        "skipped_ids": [],
        "by_dag": {"ingest": {"parked": 2, "requeued": 2}},
    }


def test_progress_in_chunks(monkeypatch):
    monkeypatch.setattr(requeue_parked, "CHUNK", 2)
    for _ in range(5):
        AssetEventQueueFactory(parked=True)
    out, err = run("--all")
    assert err.splitlines() == ["  ... 2/5 rows", "  ... 4/5 rows", "  ... 5/5 rows"]
    assert "requeued 5 parked rows" in out
