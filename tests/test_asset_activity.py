"""Which declared assets are inactive (`catalog.asset_activity`, Airflow 3.3.2's `asset_active`
rule) and the TI inlet/outlet check built on it (`runtime.requests.inactive_assets`), through the
real sync of definition documents."""

import pytest

from assets_app.catalog import asset_activity
from assets_app.catalog.asset_activity import AssetKey
from assets_app.definitions import sync as definitions
from assets_app.models import Asset, AssetAliasAsset, Dag, DagImportError, Task
from assets_app.runtime import requests as task_runtime
from tests.factories import (
    AssetAliasFactory,
    AssetFactory,
    DagRunFactory,
    TaskFactory,
    TaskInstanceFactory,
)

pytestmark = pytest.mark.django_db

URI = "s3://output/1.txt"


def _sync(*documents: dict) -> definitions.SyncResult:
    return definitions.sync_documents(documents=[(f"{d['dag_id']}.py", d) for d in documents])


def _dag(dag_id: str, **task: object) -> dict:
    return {"dag_id": dag_id, "tasks": [{"task_id": dag_id, **task}]}


def _inactive(dag_id: str) -> list[dict[str, str]]:
    run = DagRunFactory(dag=Dag.objects.get(dag_id=dag_id))
    ti = TaskInstanceFactory(dag_run=run, task_id=dag_id, running=True)
    return task_runtime.inactive_assets(ti_id=ti.id)


def test_airflows_inlet_event_extra_example_reads_an_inactive_asset():
    """`example_outlet_event_extra` produces Asset(name="test-asset", uri=URI),
    `example_inlet_event_extra` reads Asset(URI) (its name is its uri): the uri is held, so the
    reader's inlet is inactive and its task fails as on Airflow; the producer's outlet is not.
    Both Dags sync: Airflow loads them and fails the task, it refuses neither."""
    result = _sync(
        _dag("producer", outlets=[{"name": "test-asset", "uri": URI}]),
        _dag("reader", inlets=[URI]),
    )
    assert set(result.dag_ids) == {"producer", "reader"}
    assert not DagImportError.objects.exists()
    assert Task.objects.get(task_id="reader").inlets == [[URI, URI]]
    # The inlet is kept as declared, not stored as an asset.
    assert list(Asset.objects.values_list("name", "uri")) == [("test-asset", URI)]
    assert _inactive("reader") == [{"name": URI, "uri": URI, "type": "Asset"}]
    assert _inactive("producer") == []


def test_an_inlet_nothing_conflicts_with_is_active():
    """An inlet only a consumer declares (Airflow stores and activates it), and an inlet a
    producer's outlet declares with the same name and uri."""
    _sync(
        _dag("producer", outlets=["made"]),
        _dag("reader", inlets=["made", {"name": "alone", "uri": "file:///alone"}]),
    )
    assert Task.objects.get(task_id="reader").inlets == [
        ["made", "made"],
        ["alone", "file:///alone"],
    ]
    assert _inactive("reader") == []


def test_a_conflict_by_name_is_inactive_and_each_once():
    AssetFactory(name="orders", uri="s3://a/orders")
    TaskFactory(dag__dag_id="holder", task_id="holder").outlet_assets.add(
        Asset.objects.get(name="orders")
    )
    _sync(
        _dag(
            "reader",
            inlets=[
                {"name": "orders", "uri": "s3://b/orders"},
                {"name": "orders", "uri": "s3://b/orders"},
                "fine",
            ],
        )
    )
    assert Task.objects.get(task_id="reader").inlets == [
        ["orders", "s3://b/orders"],
        ["fine", "fine"],
    ]
    assert _inactive("reader") == [{"name": "orders", "uri": "s3://b/orders", "type": "Asset"}]


def test_an_orphan_does_not_hold_its_name_and_uri():
    """Airflow's scheduler deactivates an asset no Dag references (`_update_asset_orphanage`)
    and activates the newcomer; a reference by a schedule, an outlet, another task's inlet or
    an alias association keeps it active."""
    held = AssetFactory(name="old", uri=URI)
    newcomer = AssetKey(name="new", uri=URI)
    assert asset_activity.inactive([newcomer]) == []
    other = TaskFactory(inlets=[["old", URI]])
    assert asset_activity.inactive([newcomer]) == [newcomer]
    other.delete()
    AssetAliasAsset.objects.create(alias=AssetAliasFactory(), asset=held)
    assert asset_activity.inactive([newcomer]) == [newcomer]
    AssetAliasAsset.objects.all().delete()
    _sync(
        {"dag_id": "consumer", "schedule": {"name": "old", "uri": URI}, "tasks": [{"task_id": "t"}]}
    )
    assert asset_activity.inactive([newcomer]) == [newcomer]


def test_a_resync_of_the_same_inlets_changes_nothing_and_a_new_inlet_replaces_them():
    document = _dag("reader", inlets=["a", {"name": "b", "uri": "s3://b"}])
    _sync(document)
    again = _sync(document)
    assert (again.tasks_updated, again.tasks_unchanged) == (0, 1)
    changed = _sync(_dag("reader", inlets=["c"]))
    assert changed.tasks_updated == 1
    assert Task.objects.get(task_id="reader").inlets == [["c", "c"]]


def test_the_check_reads_a_fixed_number_of_queries(django_assert_num_queries):
    AssetFactory(name="held", uri="s3://held")
    TaskFactory(dag__dag_id="holder", task_id="holder").outlet_assets.add(
        Asset.objects.get(name="held")
    )
    few = [AssetKey(name="x", uri="s3://held")]
    many = [AssetKey(name=f"x{i}", uri="s3://held") for i in range(50)]
    many += [AssetKey(name="held", uri=f"s3://other{i}") for i in range(50)]
    # The holders, then schedule, outlet and alias references.
    with django_assert_num_queries(4):
        assert asset_activity.inactive(few) == few
    with django_assert_num_queries(4):
        assert asset_activity.inactive(many) == sorted(many)
    # An orphan holder adds the inlet lookup: five at most.
    AssetFactory(name="lonely", uri="s3://lonely")
    with django_assert_num_queries(5):
        assert asset_activity.inactive([AssetKey(name="y", uri="s3://lonely")]) == []
