"""Invariant 7 on every multi-row insert of unique keys two transactions may share (issue 50),
checked on the statement: the INSERT that writes them is captured and its rows must come in
the one global order (`registration.outlets.in_lock_order`: new assets by (name, uri), new
aliases by name, alias -> asset links by (alias, asset), ADRQ rows by (target Dag, event)).
Two transactions inserting some of the same keys wait for each other key by key; in one order
that is a queue, in two a deadlock, which no test should have to wait for.

Covered elsewhere on their own statements' rows (`ORDER BY id`, ids from a sequence in
insertion order): ADRQ rows on every path (`tests/api/test_adrq_lock_order.py`, which finds the
writers in the source) and alias -> asset links (`tests/test_registration.py`). Multi-row inserts
whose keys no other transaction can hold are not ordered and not checked: a new event's alias
links (`AssetAliasEvent`: the event is this transaction's), a new run's TIs and consumed links
(the run is), a new event's webhook messages (so is the event); a mapped task's expansion is
guarded by its own lock on the waiting TIs (`tests/concurrency/test_mapping_race.py`).

Keys are given in an order that is neither sorted nor reversed, so a set's order, the input's
order or a reverse sort shows.
"""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from assets_app.definitions import sync as definitions
from assets_app.models import Asset, AssetAlias
from assets_app.registration import outlets as registration
from tests.asset_flow import alias_event, alias_outlet, payload

pytestmark = pytest.mark.django_db

# Neither sorted nor reverse-sorted (nor a likely set order of short strings).
NAMES = ["k_asset", "c_asset", "x_asset", "a_asset", "q_asset", "f_asset"]


def inserts_into(model, queries) -> list[str]:
    table = model._meta.db_table
    return [
        q["sql"]
        for q in queries
        if re.match(rf'\s*INSERT INTO "?{table}"?[\s(]', q["sql"], re.IGNORECASE)
    ]


def order_in(statement: str, keys: list[str]) -> list[str]:
    """`keys` in the order they first appear in one captured statement (as whole words: a
    VALUES list's literals or the arrays of Django's `UNNEST` bulk insert)."""
    found = {}
    for key in keys:
        match = re.search(rf"(?<![\w]){re.escape(key)}(?![\w])", statement)
        found[key] = match.start() if match else -1
    missing = [key for key, at in found.items() if at < 0]
    assert not missing, f"{missing} not in the statement: {statement[:300]}"
    return sorted(keys, key=found.__getitem__)


def one_insert(model, queries) -> str:
    statements = inserts_into(model, queries)
    assert len(statements) == 1, statements  # one statement: its rows' order is the lock order
    return statements[0]


def test_a_registration_inserts_its_new_assets_in_one_statement_in_lock_order():
    outlets = [{"name": n, "uri": f"s3://b/{n}", "type": "Asset"} for n in NAMES]
    with CaptureQueriesContext(connection) as captured:
        registration.register_payload(payload=payload(outlets=outlets))
    statement = one_insert(Asset, captured.captured_queries)
    assert order_in(statement, NAMES) == sorted(NAMES)
    assert Asset.objects.count() == len(NAMES)


def test_a_registration_inserts_its_new_aliases_in_one_statement_in_lock_order():
    aliases = [f"alias_{n}" for n in NAMES]
    with CaptureQueriesContext(connection) as captured:
        registration.register_payload(
            payload=payload(
                outlets=[alias_outlet(a) for a in aliases],
                outlet_events=[alias_event(a, "t", "s3://b/t") for a in aliases],
            )
        )
    statement = one_insert(AssetAlias, captured.captured_queries)
    assert order_in(statement, aliases) == sorted(aliases)


def test_a_definition_sync_inserts_its_new_assets_and_aliases_in_lock_order():
    """The sync creates the assets and aliases its Dags name, as a drain does: the same keys, so
    the same order (by name; names and uris are each unique, so (name, uri) sorts the same)."""
    aliases = [f"alias_{n}" for n in NAMES]
    document = {
        "dag_id": "producer",
        "tasks": [
            {"task_id": f"t{i}", "outlets": [name], "outlet_aliases": [alias]}
            for i, (name, alias) in enumerate(zip(NAMES, aliases, strict=True))
        ],
    }
    with CaptureQueriesContext(connection) as captured:
        definitions.sync_documents(documents=[("producer.json", document)])
    assert order_in(one_insert(Asset, captured.captured_queries), NAMES) == sorted(NAMES)
    assert order_in(one_insert(AssetAlias, captured.captured_queries), aliases) == sorted(aliases)
