"""The golden partition corpus cannot drift from Airflow: `tools/partition_golden.py`, run
again with the pinned Airflow (the worker's virtualenv, `bin/airflow-worker --python`), writes
exactly the committed `tests/data/partitions/golden.json`. A change to the generator's inputs,
or an Airflow upgrade that changes an answer, fails here until the corpus is regenerated
(`--write`) and `tests/test_partition_mappers.py` passes on it again."""

from __future__ import annotations

import difflib
import os
import subprocess

import pytest

from tests.compat.airflow_worker_env import ROOT, sdk_python

GOLDEN = ROOT / "tests" / "data" / "partitions" / "golden.json"

pytestmark = pytest.mark.slow  # ~30 s: Airflow's import and 4,000 calls


def test_committed_corpus_is_what_pinned_airflow_answers(tmp_path) -> None:
    fresh = tmp_path / "golden.json"
    subprocess.run(
        [str(sdk_python()), str(ROOT / "tools" / "partition_golden.py"), "--output", str(fresh)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow-home")},
    )
    committed = GOLDEN.read_text(encoding="utf-8")
    regenerated = fresh.read_text(encoding="utf-8")
    diff = list(
        difflib.unified_diff(
            committed.splitlines(), regenerated.splitlines(), "committed", "airflow", n=0
        )
    )
    assert not diff, "\n".join(line[:400] for line in diff[:20])
