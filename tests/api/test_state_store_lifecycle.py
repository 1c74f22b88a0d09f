"""The state store's life cycle (issue 42), as Airflow 3.3.2's: clearing a TI or its run keeps
its task state keys (a retry or a rerun reattaches), deleting the run deletes them, deleting an
asset deletes its keys; and racing writers of one key end with one row."""

import threading

import pytest
from django.db import connection

from assets_app.models import AssetStateStore, DagRun, TaskStateStore, TIState
from assets_app.runtime import state_store
from assets_app.scheduling import runs
from tests.factories import AssetFactory, DagRunFactory, TaskInstanceFactory


def _scope(ti) -> state_store.TaskScope:
    return state_store.task_scope(ti_id=ti.id)


@pytest.mark.django_db(transaction=True)
def test_clearing_a_ti_and_its_run_keeps_its_keys_and_the_next_try_reads_them(worker_api):
    """Airflow's `clear_task_instances` leaves `task_state_store` alone (the example
    `example_task_state_store`: the retry reattaches to the job the first try submitted)."""
    ti = TaskInstanceFactory(state=TIState.FAILED, task_id="run_job")
    state_store.set_task_value(scope=_scope(ti), key="job_id", value="job-1")

    cleared = runs.clear_task_instances(dag_run_id=ti.dag_run_id)
    assert cleared.cleared
    ti.refresh_from_db()
    assert ti.try_number == 2
    runs.clear_dag_run(dag_id=ti.dag_id, run_id=ti.run_id, dry_run=False)

    ti.refresh_from_db()
    got = worker_api.request("GET", f"/store/ti/{ti.id}/job_id", ti_id=ti.id)
    assert got.status_code == 200
    assert got.json() == {"value": "job-1"}


@pytest.mark.django_db
def test_deleting_a_run_deletes_its_keys_and_an_asset_its_keys():
    ti = TaskInstanceFactory(running=True)
    other = TaskInstanceFactory(running=True, dag_run=DagRunFactory(dag=ti.dag_run.dag))
    state_store.set_task_value(scope=_scope(ti), key="k", value=1)
    state_store.set_task_value(scope=_scope(other), key="k", value=2)
    asset = AssetFactory()
    state_store.set_asset_value(
        asset=asset, key="w", value="x", writer=state_store.API_WRITER, actor=None
    )

    DagRun.objects.filter(pk=ti.dag_run_id).delete()
    assert list(TaskStateStore.objects.values_list("value", flat=True)) == ["2"]
    asset.delete()
    assert not AssetStateStore.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_racing_writers_of_one_key_end_with_one_row():
    """Eight threads write the same task key and the same asset key at once (real PostgreSQL
    connections): no error, one row each, holding one of the values written."""
    ti = TaskInstanceFactory(running=True)
    asset = AssetFactory()
    scope = _scope(ti)
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def write(n: int) -> None:
        try:
            barrier.wait()
            state_store.set_task_value(scope=scope, key="k", value=n)
            state_store.set_asset_value(
                asset=asset, key="k", value=n, writer=state_store.API_WRITER, actor=None
            )
        except BaseException as error:  # reported below
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert TaskStateStore.objects.count() == 1
    assert int(TaskStateStore.objects.get().value) in range(8)
    assert AssetStateStore.objects.count() == 1
