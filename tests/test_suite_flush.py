"""The suite's own flush (tests/conftest.py): a transactional test's teardown deletes the rows of
the tables a test wrote and truncates only the big ones, and leaves every table empty, as
Django's one TRUNCATE of every table did (1.6 s a test; the suite has hundreds)."""

import pytest
from django.core.management import call_command
from django.db import connection

from assets_app.models import Asset
from tests import conftest
from tests.factories import AssetEventFactory, DagRunFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _non_empty() -> dict[str, int]:
    tables = _tables()
    with connection.cursor() as cursor:
        counts = {}
        for table in tables:
            cursor.execute(f"SELECT count(*) FROM {connection.ops.quote_name(table)}")
            counts[table] = cursor.fetchone()[0]
    return {table: count for table, count in counts.items() if count}


def _tables() -> list[str]:
    return connection.introspection.django_table_names(only_existing=True, include_views=False)


def test_the_flush_deletes_the_rows_of_the_tables_a_test_wrote_and_leaves_the_others():
    AssetEventFactory()  # an asset, a task instance's run and Dag: rows in several tables
    DagRunFactory()
    written = _non_empty()
    assert len(written) > 3
    statements = connection.ops.sql_flush(None, _tables())
    assert sorted(statements) == sorted(
        ["SET CONSTRAINTS ALL DEFERRED"]
        + [f"DELETE FROM {connection.ops.quote_name(table)}" for table in written]
    )

    call_command("flush", verbosity=0, interactive=False, inhibit_post_migrate=True)

    assert _non_empty() == {}


def test_the_flush_truncates_a_big_table_and_what_refers_to_it():
    AssetEventFactory()
    big = conftest._TRUNCATE_FROM_ROWS
    Asset.objects.bulk_create(Asset(name=f"bulk-{i}", uri=f"s3://b/{i}") for i in range(big))
    statements = connection.ops.sql_flush(None, _tables())
    asset = connection.ops.quote_name(Asset._meta.db_table)
    assert f"TRUNCATE {asset} CASCADE" in statements
    assert f"DELETE FROM {asset}" not in statements

    call_command("flush", verbosity=0, interactive=False, inhibit_post_migrate=True)

    assert _non_empty() == {}
