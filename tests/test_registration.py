import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from assets_app.guards import exceptions
from assets_app.models import (
    Asset,
    AssetAlias,
    AssetAliasAsset,
    AssetAliasEvent,
    AssetDagRunQueue,
    AssetEvent,
)
from assets_app.operations import metrics
from assets_app.registration import outlets as registration
from tests.asset_flow import (
    alias_event,
    alias_outlet,
    asset_event,
    asset_outlet,
    payload,
    scheduled_dag,
)
from tests.factories import AssetFactory

pytestmark = pytest.mark.django_db


def queue_rows() -> list[tuple[str, int, int]]:
    return list(
        AssetDagRunQueue.objects.order_by("id").values_list(
            "target_dag_id", "asset_event_id", "asset_id"
        )
    )


def test_declared_outlet_without_outlet_events_gets_one_event_with_source_fields():
    asset = AssetFactory(name="orders", uri="s3://b/orders")
    ti_id = uuid.uuid4()
    result = registration.register_payload(
        payload=payload(
            outlets=[asset_outlet(asset)],
            ti_id=ti_id,
            try_number=3,
            dag_id="etl",
            run_id="r1",
            task_id="load",
            map_index=2,
        )
    )
    event = AssetEvent.objects.get()
    assert result.event_ids == (event.id,)
    assert result.events_written == 1
    assert result.ignored_outlet_events == 0
    assert (
        event.asset_id,
        event.extra,
        event.source_dag_id,
        event.source_run_id,
        event.source_task_id,
        event.source_map_index,
        event.source_ti_id,
        event.source_try_number,
        event.source_ordinal,
    ) == (asset.id, {}, "etl", "r1", "load", 2, ti_id, 3, 0)


def test_one_event_per_outlet_event_entry_with_its_extra_and_ordinal():
    orders = AssetFactory(name="orders")
    customers = AssetFactory(name="customers")
    result = registration.register_payload(
        payload=payload(
            outlets=[asset_outlet(orders), asset_outlet(customers)],
            outlet_events=[asset_event(orders, {"n": 1}), asset_event(orders, {"n": 2})],
        )
    )
    rows = list(
        AssetEvent.objects.order_by("id").values_list("asset__name", "extra", "source_ordinal")
    )
    assert rows == [("orders", {"n": 1}, 0), ("orders", {"n": 2}, 1), ("customers", {}, 0)]
    assert result.events_written == 3


def test_outlet_events_for_undeclared_assets_and_aliases_are_ignored_and_counted(
    django_capture_on_commit_callbacks,
):
    declared = AssetFactory(name="declared")
    other = AssetFactory(name="other")
    with django_capture_on_commit_callbacks(execute=True):
        result = registration.register_payload(
            payload=payload(
                outlets=[asset_outlet(declared)],
                outlet_events=[
                    asset_event(other, {"x": 1}),
                    alias_event("undeclared-alias", "new-asset", "s3://new"),
                ],
            )
        )
    assert result.ignored_outlet_events == 2
    assert list(AssetEvent.objects.values_list("asset__name", flat=True)) == ["declared"]
    assert not Asset.objects.filter(name="new-asset").exists()
    assert metrics.value(metrics.OUTLET_EVENTS_IGNORED) == 2
    assert metrics.value(metrics.EVENTS_WRITTEN) == 1


def test_alias_emission_links_alias_creates_asset_and_records_alias_on_event():
    scheduled_dag("on_alias", {"alias": "cleaned"})
    result = registration.register_payload(
        payload=payload(
            outlets=[alias_outlet("cleaned")],
            outlet_events=[
                alias_event(
                    "cleaned", "fresh", "s3://b/fresh", {"rows": 7}, dest_asset_extra={"o": 1}
                )
            ],
        )
    )
    asset = Asset.objects.get(name="fresh")
    alias = AssetAlias.objects.get(name="cleaned")
    assert (asset.uri, asset.extra) == ("s3://b/fresh", {"o": 1})
    event = AssetEvent.objects.get()
    assert (event.asset_id, event.extra) == (asset.id, {"rows": 7})
    assert list(AssetAliasAsset.objects.values_list("alias_id", "asset_id")) == [
        (alias.id, asset.id)
    ]
    assert list(AssetAliasEvent.objects.values_list("alias_id", "asset_event_id")) == [
        (alias.id, event.id)
    ]
    assert queue_rows() == [("on_alias", event.id, asset.id)]
    assert result.dag_ids == frozenset({"on_alias"})


def test_same_asset_and_extra_through_two_aliases_is_one_event_with_both_aliases():
    result = registration.register_payload(
        payload=payload(
            outlets=[alias_outlet("a1"), alias_outlet("a2")],
            outlet_events=[
                alias_event("a1", "t", "s3://t", {"k": 1}),
                alias_event("a2", "t", "s3://t", {"k": 1}),
                alias_event("a2", "t", "s3://t", {"k": 2}),
            ],
        )
    )
    assert result.events_written == 2
    first, second = result.event_ids
    assert sorted(
        AssetAliasEvent.objects.filter(asset_event_id=first).values_list("alias__name", flat=True)
    ) == ["a1", "a2"]
    assert list(
        AssetAliasEvent.objects.filter(asset_event_id=second).values_list("alias__name", flat=True)
    ) == ["a2"]
    assert list(AssetEvent.objects.order_by("id").values_list("source_ordinal", flat=True)) == [
        0,
        1,
    ]


def test_alias_links_are_inserted_in_lock_order():
    """Invariant 7 on the alias -> asset links: two registrations linking some of the same
    pairs wait for each other pair by pair, so one statement inserts them sorted by (alias,
    asset). Ids come from a sequence as rows are inserted: `ORDER BY id` is the statement's
    row order. Emitted in neither sorted nor reverse order, through several aliases each."""
    aliases = ["a3", "a0", "a2", "a1"]
    targets = ["t2", "t4", "t0", "t3", "t1"]
    registration.register_payload(
        payload=payload(
            outlets=[alias_outlet(a) for a in aliases],
            outlet_events=[
                alias_event(a, t, f"s3://b/{t}", {"via": a}) for t in targets for a in aliases
            ],
        )
    )
    links = list(AssetAliasAsset.objects.order_by("id").values_list("alias_id", "asset_id"))
    assert len(links) == len(aliases) * len(targets)
    assert links == sorted(links), "alias -> asset links were not inserted in lock order"


def test_adrq_rows_for_direct_and_alias_dags_paused_included_sorted_by_dag_then_event():
    orders = AssetFactory(name="orders")
    scheduled_dag("z_direct", "orders")
    scheduled_dag("a_paused", {"all": ["orders", "other"]}, is_paused=True)
    scheduled_dag("m_alias", {"alias": "via"})
    scheduled_dag("unrelated", "other")
    result = registration.register_payload(
        payload=payload(
            outlets=[asset_outlet(orders), alias_outlet("via")],
            outlet_events=[
                asset_event(orders, {"n": 1}),
                asset_event(orders, {"n": 2}),
                alias_event("via", orders.name, orders.uri, {"n": 3}),
            ],
        )
    )
    e1, e2, e3 = result.event_ids
    assert queue_rows() == [
        ("a_paused", e1, orders.id),
        ("a_paused", e2, orders.id),
        ("a_paused", e3, orders.id),
        ("m_alias", e3, orders.id),
        ("z_direct", e1, orders.id),
        ("z_direct", e2, orders.id),
        ("z_direct", e3, orders.id),
    ]
    assert result.queued_rows == 7
    assert result.dag_ids == frozenset({"a_paused", "m_alias", "z_direct"})


def test_re_registration_writes_nothing_and_does_not_requeue_consumed_events():
    orders = AssetFactory(name="orders")
    scheduled_dag("down", "orders")
    body = payload(
        outlets=[asset_outlet(orders), alias_outlet("al")],
        outlet_events=[alias_event("al", "x", "s3://x")],
    )
    first = registration.register_payload(payload=body)
    AssetDagRunQueue.objects.all().delete()  # the scheduler consumed them
    again = registration.register_payload(payload=body)
    assert again.event_ids == first.event_ids
    assert (again.events_written, again.queued_rows) == (0, 0)
    assert AssetEvent.objects.count() == 2
    assert AssetAliasEvent.objects.count() == 1
    assert AssetDagRunQueue.objects.count() == 0


def test_a_new_try_of_the_same_ti_is_a_new_event():
    orders = AssetFactory(name="orders")
    ti_id = uuid.uuid4()
    registration.register_payload(
        payload=payload(outlets=[asset_outlet(orders)], ti_id=ti_id, try_number=1)
    )
    registration.register_payload(
        payload=payload(outlets=[asset_outlet(orders)], ti_id=ti_id, try_number=2)
    )
    assert sorted(AssetEvent.objects.values_list("source_try_number", flat=True)) == [1, 2]


def test_asset_whose_name_is_taken_with_another_uri_is_an_error_and_writes_nothing():
    AssetFactory(name="orders", uri="s3://one")
    with pytest.raises(registration.RegistrationError, match="conflicts"):
        registration.register_payload(
            payload=payload(outlets=[{"name": "orders", "uri": "s3://two", "type": "Asset"}])
        )
    assert AssetEvent.objects.count() == 0


def test_malformed_payload_is_a_registration_error():
    with pytest.raises(registration.RegistrationError, match="source"):
        registration.register_payload(payload={"outlets": []})


def count_queries(body_count: int, outlets_per_payload: int) -> int:
    assets = [AssetFactory(name=f"q-{i}") for i in range(outlets_per_payload)]
    bodies = [
        payload(
            outlets=[asset_outlet(a) for a in assets] + [alias_outlet("qa")],
            outlet_events=[asset_event(assets[0], {"i": i}), alias_event("qa", "qx", "s3://qx")],
        )
        for i in range(body_count)
    ]
    with CaptureQueriesContext(connection) as ctx:
        registration.register_payloads(payloads=bodies)
    return len(ctx.captured_queries)


def test_query_count_is_flat_in_payloads_and_outlets():
    scheduled_dag("qd", "q-0")
    scheduled_dag("qd_alias", {"alias": "qa"})
    AssetAlias.objects.get_or_create(name="qa")
    AssetFactory(name="qx", uri="s3://qx")
    small = count_queries(1, 1)
    large = count_queries(200, 30)
    # 8, and the bounded Dags' registration fences taken before the events (invariant 16).
    assert small == large == 9


def test_external_event_gets_from_rest_api_and_idempotency_key_returns_first_event():
    orders = AssetFactory(name="orders")
    scheduled_dag("down", "orders")
    key = registration.IdempotencyKey.of(key="k-1", scope="user:1", body={"a": 1})
    first, created = registration.register_external_event(
        asset=orders, extra={"a": 1}, idempotency=key
    )
    again, created_again = registration.register_external_event(
        asset=orders, extra={"a": 1}, idempotency=key
    )
    assert (created, created_again) == (True, False)
    assert again.id == first.id
    assert first.extra == {"a": 1, "from_rest_api": True}
    assert queue_rows() == [("down", first.id, orders.id)]
    reused = registration.IdempotencyKey.of(key="k-1", scope="user:1", body={"a": 2})
    with pytest.raises(exceptions.InvalidInput, match="already used") as refused:
        registration.register_external_event(asset=orders, extra={"a": 2}, idempotency=reused)
    assert refused.value.reason == "idempotency_key_reused"
    elsewhere = registration.IdempotencyKey.of(key="k-1", scope="token:7", body={"a": 2})
    third, created_third = registration.register_external_event(
        asset=orders, extra={"a": 2}, idempotency=elsewhere
    )
    assert created_third and third.id != first.id


def test_an_asset_key_longer_than_the_column_is_a_registration_error():
    long_name = "n" * 1501
    with pytest.raises(registration.RegistrationError, match="longer than 1500"):
        registration.register_payload(
            payload=payload(outlets=[{"name": long_name, "uri": "u", "type": "Asset"}])
        )
    assert not Asset.objects.filter(uri="u").exists()


def test_outlets_declared_by_reference_resolve_to_the_existing_asset():
    """`Asset.ref(name=...)` / `Asset.ref(uri=...)` in the Airflow SDK arrive as AssetNameRef /
    AssetUriRef outlets: the event goes to the asset they name, whose other key differs."""
    by_name = AssetFactory(name="orders", uri="s3://bucket/orders")
    by_uri = AssetFactory(name="customers", uri="s3://bucket/customers")
    scheduled_dag("downstream", {"all": [{"name": "orders", "uri": "s3://bucket/orders"}]})
    result = registration.register_payload(
        payload=payload(
            outlets=[
                {"name": "orders", "type": "AssetNameRef"},
                {"uri": "s3://bucket/customers", "type": "AssetUriRef"},
            ],
            outlet_events=[asset_event(by_name, {"rows": 3})],
        )
    )
    events = AssetEvent.objects.filter(id__in=result.event_ids)
    assert sorted(events.values_list("asset_id", "extra")) == sorted(
        [(by_name.id, {"rows": 3}), (by_uri.id, {})]
    )
    assert list(AssetDagRunQueue.objects.values_list("target_dag_id", "asset_id")) == [
        ("downstream", by_name.id)
    ]
    assert Asset.objects.count() == 2


def test_a_reference_to_no_known_asset_is_skipped_not_failed():
    known = AssetFactory(name="known", uri="s3://bucket/known")
    result = registration.register_payload(
        payload=payload(
            outlets=[
                {"name": "nowhere", "type": "AssetNameRef"},
                {"name": "known", "uri": "s3://bucket/known", "type": "Asset"},
            ]
        )
    )
    assert list(
        AssetEvent.objects.filter(id__in=result.event_ids).values_list("asset_id", flat=True)
    ) == [known.id]
    assert not Asset.objects.filter(name="nowhere").exists()
