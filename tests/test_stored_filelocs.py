"""Issue 38: a Dag's fileloc stored before the bundle path rule (`definitions.sync.check_fileloc`)
is cleared by migration 0033: "", what an unknown fileloc is (the claim already hands such a
fileloc to workers as "", 99ceae1); a fileloc the rule accepts is left as it is."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from assets_app.definitions import sync
from assets_app.guards import exceptions
from assets_app.models import Dag

BEFORE = [("assets_app", "0032_dag_next_dagrun_computed_at")]
AFTER = [("assets_app", "0033_clear_bad_filelocs")]

GOOD = ["etl.py", "dags/etl.py", "team-a/sub dir/report_v2.py", "a.b/c.py"]
BAD = [
    "/etc/passwd",  # absolute
    "//host/share/x.py",
    "/srv/dags/report.json",  # a JSON definition's absolute path, as `sync_dags` stores it
    "../outside.py",
    "dags/../../outside.py",
    "./etl.py",
    "dags//etl.py",
    "dags/",
    "C:evil.py",  # a drive
    "dags\\etl.py",
    "dags/\x01.py",  # a control character
]


def _refused(fileloc: str) -> bool:
    try:
        sync.check_fileloc(fileloc)
    except exceptions.InvalidInput:
        return True
    return False


def test_the_examples_are_what_the_rule_says():
    assert [f for f in GOOD if _refused(f)] == []
    assert [f for f in BAD if not _refused(f)] == []


@pytest.mark.django_db(transaction=True)
def test_the_migration_clears_every_stored_fileloc_the_path_rule_refuses():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    try:
        old = executor.loader.project_state(BEFORE).apps.get_model("assets_app", "Dag")
        stored = {f"dag_{i}": fileloc for i, fileloc in enumerate([*GOOD, *BAD, ""])}
        for dag_id, fileloc in stored.items():
            old.objects.create(dag_id=dag_id, fileloc=fileloc)
        executor = MigrationExecutor(connection)
        executor.migrate(AFTER)
    finally:
        MigrationExecutor(connection).migrate(executor.loader.graph.leaf_nodes())
    after = dict(Dag.objects.values_list("dag_id", "fileloc"))
    assert after == {
        dag_id: "" if fileloc in BAD else fileloc for dag_id, fileloc in stored.items()
    }
    # The same verdict as the rule's for every stored value.
    assert all((after[d] == "") == (f == "" or _refused(f)) for d, f in stored.items())
