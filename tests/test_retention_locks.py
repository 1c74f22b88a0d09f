"""Retention and concurrent work, with real threads on PostgreSQL: a run or task instance that
another transaction holds (a clear, a worker) is skipped by the clean, never waited on and
never deleted under it; the next clean deletes it."""

import threading

import pytest
from django.db import connection, transaction

from assets_app.models import DagRun, TaskInstance
from assets_app.operations import retention
from tests.factories import DagFactory
from tests.test_retention import _policy, exists, old_run  # noqa: F401 (the policy fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def _holding(queryset):
    """Hold FOR UPDATE locks on `queryset`'s rows in another thread until released."""
    locked, release = threading.Event(), threading.Event()

    def hold():
        try:
            with transaction.atomic():
                list(queryset.select_for_update())
                locked.set()
                release.wait(30)
        finally:
            connection.close()

    thread = threading.Thread(target=hold)
    thread.start()
    assert locked.wait(10)
    return release, thread


@pytest.mark.parametrize("held", ["task_instance", "dag_run"])
def test_a_run_someone_holds_is_skipped_not_waited_on_and_deleted_by_the_next_clean(held):
    dag = DagFactory()
    run, tis = old_run(dag, tis=3)
    old_run(dag)  # the last run
    rows = (
        TaskInstance.objects.filter(pk=tis[1].pk)
        if held == "task_instance"
        else DagRun.objects.filter(pk=run.pk)
    )
    release, thread = _holding(rows)
    try:
        result = retention.clean(tables=["dag_run"])
    finally:
        release.set()
        thread.join()
    assert result.counts.get("dag_run", 0) == 0
    assert exists(DagRun, run.pk)
    assert TaskInstance.objects.filter(dag_run=run).count() == 3
    assert retention.clean(tables=["dag_run"]).counts["dag_run"] == 1
    assert not exists(DagRun, run.pk)
