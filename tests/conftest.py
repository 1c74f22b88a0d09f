"""Suite-wide: PostgreSQL only, the proof figures of every worker, the serial group.

`bin/test` runs the suite on pytest-xdist workers (`--dist loadgroup`). The scenarios of
`tests/proof/` and `tests/concurrency/` (real servers, SIGKILLs, timing figures) form one group,
run one after another on one worker, so two of them never compete for the machine's cores; the
rest is spread over the workers beside them, with the proof modules that run in-process and
measure nothing (IN_PROCESS_PROOFS: the fuzzers, the bad-input cases, the auth and permission
matrices, a third of the group's time), which made the serial worker the suite's long pole.
"""

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from django.db import connection
from django.db.backends.postgresql.operations import DatabaseOperations

FIGURES_DIR_ENV = "TEST_FIGURES_DIR"
_FIGURES_OWNED = pytest.StashKey[str]()
SERIAL_FOLDERS = ("proof", "concurrency")
IN_PROCESS_PROOFS = {
    "test_fuzz_apis.py",
    "test_bad_input.py",
    "test_auth_matrix.py",
    "test_permission_matrix.py",
}


def pytest_configure(config):
    # The controller (or a plain run) makes the folder; xdist workers inherit it by environment,
    # and so does a pytest a test starts (test_readme_commands runs `bin/test --collect-only`).
    if not hasattr(config, "workerinput") and FIGURES_DIR_ENV not in os.environ:
        os.environ[FIGURES_DIR_ENV] = tempfile.mkdtemp(prefix="asset-events-figures-")
        config.stash[_FIGURES_OWNED] = os.environ[FIGURES_DIR_ENV]


def pytest_unconfigure(config):
    # Only the run that made the folder removes it: a nested run removing its parent's folder
    # made the parent's next record_figure fail (FileNotFoundError, seen with -n 2).
    folder = config.stash.get(_FIGURES_OWNED, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
        del os.environ[FIGURES_DIR_ENV]


# A transactional test's teardown empties every table (Django's `flush`). Django does it with one
# TRUNCATE of all ~60 tables, which makes new files for each table and index: 1.6 s a test on
# this machine, the largest single cost of the suite (hundreds of transactional tests). A DELETE
# of a table of a few rows costs microseconds, so the suite's flush deletes, and truncates only
# the tables a test filled (the bursts' 100,000 events: a DELETE of those would be slow and leave
# them dead). Same end state: every table empty, sequences untouched (as Django's flush without
# reset_sequences), every foreign key deferrable (checked at commit, when all rows are gone).
_TRUNCATE_FROM_ROWS = 5000
_django_sql_flush = DatabaseOperations.sql_flush


def _sql_flush_deleting(self, style, tables, *, reset_sequences=False, allow_cascade=False):
    if reset_sequences or not tables:
        return _django_sql_flush(
            self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
        )
    quote = self.quote_name
    probe = " UNION ALL ".join(
        f"SELECT {i}, (SELECT count(*) FROM (SELECT 1 FROM {quote(table)}"
        f" LIMIT {_TRUNCATE_FROM_ROWS}) AS r)"
        for i, table in enumerate(tables)
    )
    with self.connection.cursor() as cursor:
        cursor.execute(probe)
        rows = {tables[i]: count for i, count in cursor.fetchall() if count}
    big = [table for table, count in rows.items() if count >= _TRUNCATE_FROM_ROWS]
    sql = ["SET CONSTRAINTS ALL DEFERRED"]
    if big:
        sql.append(f"TRUNCATE {', '.join(quote(table) for table in big)} CASCADE")
    sql += [f"DELETE FROM {quote(table)}" for table in rows if table not in big]
    return sql


DatabaseOperations.sql_flush = _sql_flush_deleting


def record_figure(line: str) -> None:
    """Append one figure (one JSON line) to this process's file of the run's figures folder."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(Path(os.environ[FIGURES_DIR_ENV]) / f"{worker}.jsonl", "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(item.fspath)
        if path.parent.name in SERIAL_FOLDERS and path.name not in IN_PROCESS_PROOFS:
            item.add_marker(pytest.mark.xdist_group("serial"))


def pytest_terminal_summary(terminalreporter, config):
    if hasattr(config, "workerinput"):
        return
    folder = Path(os.environ[FIGURES_DIR_ENV])
    lines = [
        json.loads(raw)
        for path in sorted(folder.glob("*.jsonl"))
        for raw in path.read_text(encoding="utf-8").splitlines()
    ]
    if lines:
        terminalreporter.section("proof suite figures")
        for line in lines:
            terminalreporter.write_line(line)


def _needs_database(item: pytest.Item) -> bool:
    fixtures = getattr(item, "fixturenames", ())
    return item.get_closest_marker("django_db") is not None or "django_db_setup" in fixtures


@pytest.fixture(autouse=True, scope="session")
def _postgresql_only(request, django_db_blocker):
    """The suite proves PostgreSQL behaviour (locks, SKIP LOCKED): refuse any other database.
    A session of tests that need none (the timetable corpus) creates no test database."""
    if not any(_needs_database(item) for item in request.session.items):
        return
    request.getfixturevalue("django_db_setup")
    with django_db_blocker.unblock():
        if connection.vendor != "postgresql":
            pytest.exit(
                "tests need PostgreSQL: set DATABASE_URL=postgres://postgres@127.0.0.1:5432/"
                "asset_events (bin/test does this)",
                returncode=2,
            )


@pytest.fixture(autouse=True, scope="session")
def _fast_password_hashes():
    """Users made and logged in by the in-process tests hash with 1,000 PBKDF2 iterations
    (tests/hashers.py): the same algorithm, readable by the servers the tests start."""
    from django.conf import settings
    from django.contrib.auth import hashers

    settings.PASSWORD_HASHERS = ["tests.hashers.FastPBKDF2PasswordHasher"]
    hashers.get_hashers.cache_clear()
    hashers.get_hashers_by_algorithm.cache_clear()
