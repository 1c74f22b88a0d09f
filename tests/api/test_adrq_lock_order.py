"""Invariant 7 on every path that writes ADRQ rows: they are inserted in the global lock order
(target_dag_id, asset_event_id).

ADRQ ids come from a sequence as rows are inserted, so `ORDER BY id` is the insertion order
(the order the unique index entries, and their locks, were taken). Each test gives the rows
several target Dags, created in an order that is not the sorted one, and several events, so an
unsorted insert (a set's order, creation order, or sorted by event first) shows.

The writers are found in the source (`test_every_adrq_writer_is_covered_here`): a new path that
writes ADRQ fails that test until it is added here.
"""

import ast
import json
import re
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from assets_app.api.public_auth import create_api_token
from assets_app.models import AssetDagRunQueue, AssetEvent, DagScheduleAssetReference
from assets_app.outbox import drain
from assets_app.registration import outlets as registration
from tests.asset_flow import asset_event, asset_outlet, outbox_row, payload, scheduled_dag
from tests.factories import AssetFactory, TaskInstanceFactory

from .test_execution_state import patch_state

pytestmark = pytest.mark.django_db

# Created in this order: neither sorted nor reverse-sorted.
TARGETS = ["m_dag", "c_dag", "x_dag", "a_dag", "q_dag", "f_dag", "z_dag", "k_dag"]
APP = Path(registration.__file__).resolve().parent.parent


def targets_on(asset_name: str) -> None:
    """The Dags of TARGETS scheduled on `asset_name`; none can run (paused, or waiting for an
    asset nobody produces), so the drain's scheduler pass leaves every ADRQ row in place."""
    for i, dag_id in enumerate(TARGETS):
        if i % 2:
            scheduled_dag(dag_id, asset_name, is_paused=True)
        else:
            scheduled_dag(dag_id, {"all": [asset_name, "never_produced"]})


def inserted() -> list[tuple[str, int]]:
    return list(
        AssetDagRunQueue.objects.order_by("id").values_list("target_dag_id", "asset_event_id")
    )


def assert_inserted_in_lock_order(*, events: int, transactions: int = 1) -> None:
    """The rows of `events` events for every Dag of TARGETS, written by `transactions`
    transactions of one event each (or one transaction), each in (target_dag_id, event) order."""
    rows = inserted()
    assert {dag for dag, _ in rows} == set(TARGETS)
    assert len({event for _, event in rows}) == events
    assert len(rows) == len(TARGETS) * events
    per_transaction = len(rows) // transactions
    for start in range(0, len(rows), per_transaction):
        written = rows[start : start + per_transaction]
        assert written == sorted(written), (
            "ADRQ rows were not inserted in (target_dag_id, asset_event_id) order"
        )


def test_drain_inserts_adrq_rows_in_lock_order():
    targets_on("hot")
    hot = AssetFactory(name="hot", uri="hot")
    for n in range(2):
        outbox_row(
            payload(
                outlets=[asset_outlet(hot)],
                outlet_events=[asset_event(hot, {"n": n, "k": k}) for k in range(2)],
            )
        )
    result = drain.drain_batch(batch_size=10)
    assert result.registered == 2
    assert_inserted_in_lock_order(events=4)


def test_registration_of_several_payloads_inserts_adrq_rows_in_lock_order():
    targets_on("hot")
    hot = AssetFactory(name="hot", uri="hot")
    registration.register_payloads(
        payloads=[
            payload(outlets=[asset_outlet(hot)], outlet_events=[asset_event(hot, {"n": n})])
            for n in range(3)
        ]
    )
    assert_inserted_in_lock_order(events=3)


def test_inline_success_inserts_adrq_rows_in_lock_order(worker_api, settings):
    settings.ASSET_REGISTRATION_MODE = "inline"
    targets_on("orders")
    ti = TaskInstanceFactory(running=True)
    body = {
        "state": "success",
        "end_date": "2026-01-01T00:00:00+00:00",
        "task_outlets": [{"name": "orders", "uri": "orders", "type": "Asset"}],
        "outlet_events": [
            {"dest_asset_key": {"name": "orders", "uri": "orders"}, "extra": {"n": n}}
            for n in range(3)
        ],
        "rendered_map_index": None,
    }
    assert patch_state(worker_api, ti, body).status_code == 204
    assert AssetEvent.objects.count() == 3
    assert_inserted_in_lock_order(events=3)


def test_public_api_event_inserts_adrq_rows_in_lock_order():
    targets_on("orders")
    asset = AssetFactory(name="orders", uri="orders")
    assert DagScheduleAssetReference.objects.filter(asset=asset).count() == len(TARGETS)
    get_user_model().objects.create_superuser("ops", password="pw")
    _, key = create_api_token(username="ops", name="test")
    client = Client(headers={"Authorization": f"Bearer {key}"})
    for n in range(2):
        response = client.post(
            "/api/v2/assets/events",
            data=json.dumps({"asset_id": asset.id, "extra": {"n": n}}),
            content_type="application/json",
        )
        assert response.status_code == 200, response.content
    # One transaction per request, each writing its event's rows sorted by Dag.
    assert_inserted_in_lock_order(events=2, transactions=2)


def _calls_in(tree: ast.AST, name: str) -> list[str]:
    """Names of the top-level functions of `tree` that call `name` (a function or attribute)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Call):
                    func = inner.func
                    called = getattr(func, "id", None) or getattr(func, "attr", None)
                    if called == name and node.name != name:
                        found.append(node.name)
    return found


def test_every_adrq_writer_is_covered_here():
    """ADRQ rows are inserted only by `registration._insert_queue_rows` (its statement is
    `sql.registration.insert_queue_rows`, which nothing else calls), called only by the two
    functions whose paths the tests above drive (register_payloads, through its step
    `_queue_for_dags`: drain, inline success and direct registration; `_queue_external_events`:
    the public API and the queue watchers, through `register_external_events`), each with
    `in_lock_order`.
    A new writer fails here until this file tests its order."""
    writers: dict[str, list[str]] = {}
    statement_callers: dict[str, list[str]] = {}
    for path in sorted(APP.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        source = path.read_text()
        tree = ast.parse(source)
        callers = _calls_in(tree, "_insert_queue_rows")
        if callers:
            writers[path.name] = sorted(set(callers))
        callers = _calls_in(tree, "insert_queue_rows")
        if callers:
            statement_callers[path.name] = sorted(set(callers))
        if path.relative_to(APP).as_posix() not in (
            "registration/outlets.py",
            "sql/registration.py",
        ):
            assert not re.search(r"(?<!class )AssetDagRunQueue\(", source), f"{path}: builds rows"
            assert "assets_app_assetdagrunqueue" not in source.lower(), f"{path}: raw ADRQ SQL"
            for call in ("create", "bulk_create", "get_or_create", "update_or_create"):
                assert f"AssetDagRunQueue.objects.{call}(" not in source, f"{path}: {call}"
    assert writers == {"outlets.py": ["_queue_external_events", "_queue_for_dags"]}
    assert statement_callers == {"outlets.py": ["_insert_queue_rows"]}
    source = (APP / "registration" / "outlets.py").read_text()
    assert source.count("_insert_queue_rows(") == 3  # the definition and the two calls
    assert "_insert_queue_rows(in_lock_order(queue_rows)" in source
    assert "rows = in_lock_order(\n        (dag_id, event_id, asset_id)\n" in source
