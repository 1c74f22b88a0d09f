import pytest
from django.db import connection


@pytest.fixture(autouse=True, scope="session")
def _postgresql_only(django_db_setup, django_db_blocker):
    """The suite proves PostgreSQL behaviour (locks, SKIP LOCKED): refuse any other database."""
    with django_db_blocker.unblock():
        if connection.vendor != "postgresql":
            pytest.exit(
                "tests need PostgreSQL: set DATABASE_URL=postgres://postgres@127.0.0.1:5432/"
                "asset_events (bin/test does this)",
                returncode=2,
            )
