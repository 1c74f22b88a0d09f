import pytest
from django.db import IntegrityError, transaction

from assets_app.models import AssetEventQueue, DagRunAssetEvent

from .factories import (
    AssetEventFactory,
    AssetEventQueueFactory,
    AssetFactory,
    DagRunFactory,
    TaskInstanceFactory,
)

pytestmark = pytest.mark.django_db


def test_outbox_refuses_a_second_row_for_the_same_ti_try():
    row = AssetEventQueueFactory()
    with pytest.raises(IntegrityError), transaction.atomic():
        AssetEventQueueFactory(ti_id=row.ti_id, try_number=row.try_number)
    AssetEventQueueFactory(ti_id=row.ti_id, try_number=row.try_number + 1)
    assert AssetEventQueue.objects.filter(ti_id=row.ti_id).count() == 2


def test_event_idempotency_key_is_unique_per_ti_try_asset_ordinal():
    ti = TaskInstanceFactory(succeeded=True)
    asset = AssetFactory()
    AssetEventFactory(asset=asset, source_ti_id=ti.id, source_try_number=1, source_ordinal=0)
    with pytest.raises(IntegrityError), transaction.atomic():
        AssetEventFactory(asset=asset, source_ti_id=ti.id, source_try_number=1, source_ordinal=0)
    AssetEventFactory(asset=asset, source_ti_id=ti.id, source_try_number=1, source_ordinal=1)


def test_an_event_is_consumed_at_most_once_per_dag():
    event = AssetEventFactory()
    first = DagRunFactory()
    second = DagRunFactory(dag=first.dag)
    DagRunAssetEvent.objects.create(dag_run=first, dag=first.dag, asset_event=event)
    with pytest.raises(IntegrityError), transaction.atomic():
        DagRunAssetEvent.objects.create(dag_run=second, dag=second.dag, asset_event=event)
    other_dag_run = DagRunFactory()
    DagRunAssetEvent.objects.create(dag_run=other_dag_run, dag=other_dag_run.dag, asset_event=event)


def test_ti_state_and_pid_are_checked_by_the_database():
    with pytest.raises(IntegrityError), transaction.atomic():
        TaskInstanceFactory(state="bogus")
    with pytest.raises(IntegrityError), transaction.atomic():
        TaskInstanceFactory(pid=-5)


def test_outbox_payloads_are_compressed_with_lz4_on_postgresql():
    """Migration 0010: every success writes a ~19 kB payload; lz4 costs less CPU than pglz."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attcompression FROM pg_attribute WHERE attrelid = %s::regclass "
            "AND attname = 'payload'",
            [AssetEventQueue._meta.db_table],
        )
        assert cursor.fetchone() == ("l",)
