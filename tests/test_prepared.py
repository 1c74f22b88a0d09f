"""The success path's fixed statements are prepared on their connection
(`connection_sql.prepared_cursor`).

PostgreSQL lists a connection's prepared statements in `pg_prepared_statements`; psycopg names
its own `_pg3_N`. After a few successes on one connection the statements are there, and a
success still commits the same rows.
"""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from assets_app.models import AssetEventQueue, TIState
from assets_app.sql import connection as connection_sql
from assets_app.task_state import success

from .factories import AssetFactory, TaskInstanceFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _prepared_statements() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE name LIKE '\\_pg3\\_%'")
        return [row[0] for row in cursor.fetchall()]


def test_a_statement_run_twice_through_prepared_cursor_is_prepared(settings):
    settings.DATABASE_PREPARED_STATEMENTS = True
    for _ in range(3):
        with connection_sql.prepared_cursor() as cursor:
            cursor.execute("SELECT %s::int + 1", [41])
            assert cursor.fetchone() == (42,)
    assert any("+ 1" in text for text in _prepared_statements())


def test_switched_off_nothing_is_prepared(settings):
    settings.DATABASE_PREPARED_STATEMENTS = False
    for _ in range(3):
        with connection_sql.prepared_cursor() as cursor:
            cursor.execute("SELECT %s::int + 2", [40])
            assert cursor.fetchone() == (42,)
    assert not any("+ 2" in text for text in _prepared_statements())


def test_successes_prepare_their_statements_and_are_still_logged(settings):
    settings.DATABASE_PREPARED_STATEMENTS = True
    asset = AssetFactory()
    outlets = [{"name": asset.name, "uri": asset.uri, "type": "Asset"}]
    tis = [TaskInstanceFactory(state=TIState.RUNNING) for _ in range(4)]
    for ti in tis:
        with CaptureQueriesContext(connection) as queries:
            success.succeed(
                ti_id=ti.id,
                try_number=ti.try_number,
                end_date=timezone.now(),
                task_outlets=outlets,
                outlet_events=[],
            )
        # Query logging and execute wrappers see the prepared statements as any other.
        assert any("INSERT INTO" in q["sql"] for q in queries.captured_queries)
    texts = _prepared_statements()
    assert any(AssetEventQueue._meta.db_table in text and "INSERT" in text for text in texts)
    assert any("UPDATE" in text and '"try_number" = $' in text for text in texts)
    assert AssetEventQueue.objects.filter(ti_id__in=[ti.id for ti in tis]).count() == 4
