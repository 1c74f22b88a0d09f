"""Every admin page renders for staff with a query count that does not grow with the rows."""

import uuid

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils import timezone

from assets_app.models import (
    AssetDagRunQueue,
    AssetEvent,
    AssetEventQueue,
    DagRunAssetEvent,
    DagRunType,
    DagScheduleAssetReference,
    TaskOutletAssetReference,
)
from tests.factories import (
    AssetEventFactory,
    AssetFactory,
    DagFactory,
    DagRunFactory,
    TaskFactory,
)

from .conftest import populate

MODELS = sorted(
    (model for model in admin.site._registry if model._meta.app_label == "assets_app"),
    key=lambda model: model._meta.model_name,
)

# Queries of one changelist page for a logged-in superuser: session + user, then the page's own
# (count, rows, one per related-object filter). Pinned: a new per-row query shows up here.
EXPECTED = {
    "apitoken": 5,
    "revokedtoken": 5,  # issue 49: logged-out login tokens
    "dagcode": 5,  # issue 45: the DAG files' source as synced
    "asset": 6,
    "connection": 5,
    "renderedtaskfields": 5,
    "taskreschedule": 5,
    "variable": 5,
    "xcom": 6,
    "assetalias": 6,
    "assetaliasasset": 6,
    "assetaliasevent": 6,
    "assetdagrunqueue": 6,
    # Issue 48: big tables read the planner's row estimate first (then count when small).
    "assetevent": 6,
    "asseteventqueue": 7,
    "auditentry": 9,
    "audittarget": 6,
    "backfill": 5,
    "backfilldagrun": 5,
    "componentheartbeat": 5,
    "dag": 6,  # issue 45: the tag filter reads the tags of every Dag
    "dagimporterror": 5,
    "dagrun": 8,
    "hitldetail": 5,
    "pool": 6,
    "dagrunassetevent": 6,
    "dagschedulealiasreference": 6,
    "dagscheduleassetreference": 6,
    "metriccounter": 6,
    "task": 6,
    "taskinstance": 6,
    "tasklogchunk": 8,
    "taskoutletaliasreference": 5,
    "taskoutletassetreference": 5,
    "taskupstream": 6,
    "tasksetuplink": 6,
    # Issue 29 (deliveries: the endpoint filter and the date hierarchy add a query each).
    "freshnesspolicy": 5,
    "webhookattempt": 5,
    "webhookdelivery": 8,
    "webhookendpoint": 5,
    "webhooksubscription": 5,
    # Issue 28: queue watchers.
    "queuewatcher": 5,
    "watchermessage": 5,
    "watcherroute": 5,
    # Issue 42: the state store (the task keys' Dag filter adds a query).
    "taskstatestore": 6,
    "assetstatestore": 5,
    # Issue 42: triggers (their waiting TIs prefetched).
    "trigger": 5,
    # Issue 39: Dag callback requests (their runs joined).
    "dagcallbackrequest": 5,
    # Issue 49: Dag versions and favorites; issue 44: the bundles workers serve.
    "dagversion": 5,
    "dagfavorite": 5,
    "workerbundle": 5,
}

APPEND_ONLY = (
    "assetevent",
    "assetaliasevent",
    "assetaliasasset",
    "dagrunassetevent",
    "metriccounter",
    "componentheartbeat",
    "auditentry",
    "audittarget",
    "tasklogchunk",
    "dagimporterror",
    "dagcode",
    "dagcallbackrequest",
    "revokedtoken",
    "dagversion",
    "dagfavorite",
    "workerbundle",
)


def changelist(model):
    return reverse(f"admin:assets_app_{model._meta.model_name}_changelist")


def test_every_model_is_registered():
    missing = [
        model.__name__
        for model in apps.get_app_config("assets_app").get_models()
        if model not in admin.site._registry
    ]
    assert missing == []
    assert sorted(EXPECTED) == [model._meta.model_name for model in MODELS]


@pytest.mark.parametrize("name", APPEND_ONLY)
def test_append_only_tables_are_read_only(rf, admin_user, name):
    model = apps.get_model("assets_app", name)
    model_admin = admin.site._registry[model]
    request = rf.get("/")
    request.user = admin_user
    assert model_admin.has_view_permission(request)
    assert not model_admin.has_add_permission(request)
    assert not model_admin.has_change_permission(request)
    assert not model_admin.has_delete_permission(request)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m._meta.model_name)
def test_changelist_query_count_is_flat(staff_client, model, django_assert_num_queries):
    populate(1)
    with django_assert_num_queries(EXPECTED[model._meta.model_name]):
        response = staff_client.get(changelist(model))
    assert response.status_code == 200
    populate(6)
    with django_assert_num_queries(EXPECTED[model._meta.model_name]):
        response = staff_client.get(changelist(model))
    assert response.status_code == 200
    assert response.context["cl"].result_count >= 6 or model._meta.model_name in (
        "componentheartbeat",
        "assetalias",
    )


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m._meta.model_name)
def test_change_page_renders(staff_client, model):
    populate(2)
    obj = model.objects.order_by("pk").first()
    response = staff_client.get(
        reverse(f"admin:assets_app_{model._meta.model_name}_change", args=[quote(obj.pk)])
    )
    assert response.status_code == 200


def bulk_outbox(n: int) -> None:
    now = timezone.now()
    rows = []
    for i in range(n):
        ti_id = uuid.uuid4()
        rows.append(
            AssetEventQueue(
                ti_id=ti_id,
                try_number=1,
                source_dag_id=f"dag_{i % 7}",
                source_run_id=f"manual__{i}",
                source_task_id=f"task_{i % 13}",
                payload={"outlets": [{"name": "a", "uri": "a", "type": "Asset"}], "source": {}},
                attempts=i % 11,
                last_error="ValueError: boom\nTraceback ..." if i % 3 else "",
                last_error_type="builtins.ValueError" if i % 3 else "",
                parked_at=now if i % 5 == 0 else None,
            )
        )
    AssetEventQueue.objects.bulk_create(rows, batch_size=2000)


def bulk_events_and_adrq(n: int) -> None:
    asset = AssetFactory()
    dag = DagFactory(schedule={"asset": {"name": asset.name, "uri": asset.uri}})
    events = AssetEvent.objects.bulk_create(
        [
            AssetEvent(asset=asset, source_dag_id="producer", source_task_id="t", extra={"i": i})
            for i in range(n)
        ],
        batch_size=2000,
    )
    AssetDagRunQueue.objects.bulk_create(
        [AssetDagRunQueue(target_dag=dag, asset_event=e, asset=asset) for e in events],
        batch_size=2000,
    )


@pytest.mark.parametrize(
    ("model", "fill", "queries"),
    [
        (AssetEventQueue, bulk_outbox, EXPECTED["asseteventqueue"]),
        (AssetEvent, bulk_events_and_adrq, EXPECTED["assetevent"]),
        (AssetDagRunQueue, bulk_events_and_adrq, EXPECTED["assetdagrunqueue"]),
    ],
    ids=["outbox", "events", "adrq"],
)
def test_ten_thousand_rows_first_page(
    staff_client, model, fill, queries, django_assert_num_queries
):
    fill(10_000)
    with django_assert_num_queries(queries):
        response = staff_client.get(changelist(model))
    assert response.status_code == 200
    assert len(response.context["cl"].result_list) == 100
    # The filtered views too (status filter on the outbox, consumed filter on events).
    if model is AssetEventQueue:
        response = staff_client.get(changelist(model) + "?status=parked")
        assert response.context["cl"].result_count == 2000
        response = staff_client.get(changelist(model) + "?status=backing_off")
        assert response.status_code == 200
    if model is AssetEvent:
        response = staff_client.get(changelist(model) + "?consumed=no")
        assert len(response.context["cl"].result_list) == 100


def test_asset_and_dag_pages_show_events_runs_producers_and_consumers(
    staff_client, django_assert_num_queries
):
    asset = AssetFactory(name="orders")
    producer = DagFactory(dag_id="producer")
    consumer = DagFactory(
        dag_id="consumer", schedule={"asset": {"name": "orders", "uri": asset.uri}}
    )

    task = TaskFactory(dag=producer, task_id="extract")
    TaskOutletAssetReference.objects.create(task=task, asset=asset)
    DagScheduleAssetReference.objects.create(dag=consumer, asset=asset)

    def add_consumed_events(k):
        run = DagRunFactory(dag=consumer, run_type=DagRunType.ASSET_TRIGGERED)
        for _ in range(k):
            event = AssetEventFactory(
                asset=asset, source_dag_id="producer", source_task_id="extract"
            )
            DagRunAssetEvent.objects.create(dag_run=run, dag=consumer, asset_event=event)
        return run

    run = add_consumed_events(1)
    asset_url = reverse("admin:assets_app_asset_change", args=[asset.pk])
    dag_url = reverse("admin:assets_app_dag_change", args=["consumer"])
    # Warm the session and the ContentType cache (the change form's history link).
    staff_client.get(asset_url)
    staff_client.get(dag_url)
    # 11: issue 29's freshness line reads the asset's policy (one query, flat).
    with django_assert_num_queries(11):
        page = staff_client.get(asset_url).content.decode()
    assert "producer</a>.extract" in page
    assert ">consumer</a>" in page
    assert f"consumer / {run.run_id}" in page
    # 9: issue 45's task graph and task order share one read of the Dag's shape (its tasks,
    # their upstream links; the groups are the Dag's own field).
    with django_assert_num_queries(9):
        page = staff_client.get(dag_url).content.decode()
    assert run.run_id in page and "orders #" in page
    run_page = staff_client.get(reverse("admin:assets_app_dagrun_change", args=[run.pk]))
    consumed = run.consumed_events.get()
    assert f'<a href="/admin/assets_app/assetevent/{consumed.pk}/change/">#{consumed.pk}</a>' in (
        run_page.content.decode()
    )

    for _ in range(5):
        add_consumed_events(8)
    with django_assert_num_queries(11):
        assert staff_client.get(asset_url).status_code == 200
    with django_assert_num_queries(9):
        assert staff_client.get(dag_url).status_code == 200


def test_links_to_a_dag_whose_id_looks_quoted_open_its_page(staff_client):
    """The change view unquotes its path ("_20" is a space there): a Dag `etl_2024` is reached
    only through a quoted link, as admin_link and the templates build it."""
    from assets_app.admin.base import admin_link

    dag = DagFactory(dag_id="etl_2024")
    href = admin_link(dag).split('"')[1]
    response = staff_client.get(href)
    assert response.status_code == 200
    assert response.context["original"].pk == "etl_2024"
