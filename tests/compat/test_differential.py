"""The differential harness against Airflow itself (issue 39, `tools/differential.py`).

The slow test runs the corpus `differential_dags/` (trigger rules, retries, branching,
short-circuit, XCom passing, dynamic mapping, asset outlets with extra, setup and teardown tasks)
on stock Airflow 3.3.2
(scheduler + LocalExecutor, one start for the whole corpus) and on the service with
`bin/airflow-worker`, and asserts that every Dag was run on both sides and that no difference
is left undocumented (`tools/differential.json`). The quick tests pin the comparison itself:
what counts as a difference and what a documented divergence covers.
"""

import json
import os
import re

import psycopg
import pytest
from django.db import connection

from tools import differential as d

CORPUS = d.ROOT / "tests/compat/differential_dags"
CORPUS_DAGS = {
    "diff_assets",
    "diff_branching",
    "diff_fail_fast",
    "diff_mapping",
    "diff_mapping_group_over_mapped",
    "diff_mapping_second_order",
    "diff_mapping_zip_concat",
    "diff_mapping_zip_missing",
    "diff_retries",
    "diff_short_circuit",
    "diff_setup_teardown_fail_dagrun",
    "diff_setup_teardown_passes",
    "diff_setup_teardown_setup_fails",
    "diff_setup_teardown_teardown_fails",
    "diff_setup_teardown_work_fails",
    "diff_trigger_rules_fail_first",
    "diff_trigger_rules_skip_first",
    "diff_xcom_passing",
}
# The part the suite runs (issue 39: "CI runs a bounded part"): one Dag or more of each file,
# each semantic the corpus covers, about half its task instances. The whole corpus:
# DIFFERENTIAL_FULL=1, or `tools/differential.py tests/compat/differential_dags`.
CI_PART = {
    "diff_assets",
    "diff_branching",
    "diff_fail_fast",
    "diff_mapping",
    "diff_mapping_group_over_mapped",
    "diff_mapping_second_order",
    "diff_mapping_zip_missing",
    "diff_retries",
    "diff_short_circuit",
    "diff_setup_teardown_work_fails",
    "diff_trigger_rules_fail_first",
    "diff_xcom_passing",
}
FULL = os.environ.get("DIFFERENTIAL_FULL") == "1"


def _run(**fields) -> d.RunResult:
    base = {
        "state": "success",
        "tis": {"a": ["success", 1], "b[0]": ["success", 1]},
        "xcoms": {"a": {"x": [1, 2]}},
        "events": [["file:///o.csv", "o", {"rows": 3}]],
    }
    return d.RunResult(**{**base, **fields})


def test_equal_runs_have_no_difference():
    assert d.compare("dag", _run(), _run()) == []


def test_each_field_that_differs_is_one_difference_naming_dag_task_and_values():
    ours = _run(
        state="failed",
        tis={"a": ["failed", 2], "c": ["success", 1]},
        xcoms={"a": {"x": [1, 3]}},
        events=[["file:///o.csv", "o", {"rows": 4}]],
    )
    found = d.compare("dag", _run(), ours)
    assert {
        (f["task"], f["field"], json.dumps(f["airflow"]), json.dumps(f["ours"])) for f in found
    } == {
        ("", "run.state", '"success"', '"failed"'),
        ("a", "ti.state", '"success"', '"failed"'),
        ("a", "ti.try_number", "1", "2"),
        ("b[0]", "ti", '["success", 1]', "null"),
        ("c", "ti", "null", '["success", 1]'),
        ("a", "xcom.return_value", '{"x": [1, 2]}', '{"x": [1, 3]}'),
        (
            "",
            "asset_events",
            '[["file:///o.csv", "o", {"rows": 3}]]',
            '[["file:///o.csv", "o", {"rows": 4}]]',
        ),
    }
    assert all(f["dag"] == "dag" for f in found)


def test_a_divergence_documents_only_the_differences_it_names():
    entry = {"dag": "*", "task": "*", "field": "ti.try_number", "airflow": 0, "ours": 1}
    difference = {"dag": "x", "task": "t", "field": "ti.try_number", "airflow": 0, "ours": 1}
    assert d.documented(difference, [entry]) is entry
    assert d.documented({**difference, "airflow": 1, "ours": 2}, [entry]) is None
    assert d.documented({**difference, "field": "ti.state"}, [entry]) is None
    assert d.documented(difference, [{**entry, "dag": "other"}]) is None
    assert d.documented({**difference, "ours": 5}, [{"field": "ti.try_number"}]) is not None


def test_the_data_file_gives_every_divergence_a_kind_and_a_reason(tmp_path):
    data = d.load_data()
    assert all(entry["reason"] and entry["kind"] in d.KINDS for entry in data["divergences"])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"divergences": [{"field": "ti.state", "kind": "open"}]}))
    with pytest.raises(ValueError, match="needs a reason"):
        d.load_data(bad)


def test_stored_json_is_read_as_json():
    assert d._json('{"a": 1}') == {"a": 1}
    assert d._json('"{\\"a\\": 1}"') == {"a": 1}  # JSON text stored as a JSON string
    assert d._json({"a": 1}) == {"a": 1}
    assert d._json(None) is None
    assert d._json("plain") == "plain"


def test_the_ci_part_takes_a_dag_of_every_corpus_file_and_names_only_corpus_dags():
    declared = {
        path.name: set(re.findall(r'(?:dag_id=|trigger_rules\()"(diff_\w+)"', path.read_text()))
        for path in CORPUS.glob("*.py")
    }
    assert set().union(*declared.values()) == CORPUS_DAGS
    assert CI_PART <= CORPUS_DAGS
    assert [name for name, dags in declared.items() if not dags & CI_PART] == []


# One Airflow start (migrate, api-server, scheduler, dag-processor) and one bin/serve for the
# part (about two minutes on a quiet 2-core machine) or the whole corpus.
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_corpus_gives_the_same_results_on_airflow_and_on_the_service(tmp_path):
    database = f"{connection.settings_dict['NAME']}_differential"
    chosen = CORPUS_DAGS if FULL else CI_PART
    try:
        report = d.run(
            CORPUS,
            dag_ids=sorted(chosen),
            concurrency=2,
            timeout=600,
            database=database,
            logs=tmp_path / "logs",
        )
    finally:
        with psycopg.connect(f"{d.PG}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    print(d.table(report))
    statuses = {dag_id: row["status"] for dag_id, row in report["dags"].items()}
    assert set(statuses) == chosen, statuses
    assert set(statuses.values()) <= {"equal", "divergent"}, d.table(report)
    assert report["differences"] == [], d.table(report)
    # Every Dag ran on both sides: something was compared.
    assert all(row["runs"]["airflow"] and row["runs"]["ours"] for row in report["dags"].values())
