"""The mutant list (tests/mutants/mutants.toml) stays applicable: the quick loop notices a
refactor that made a mutant stale, or a test a mutant names that no longer exists, before
`.ci/run`'s mutant check does (the check itself plants the mutants: tests/mutants/run.py)."""

import ast
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _harness():
    spec = importlib.util.spec_from_file_location("mutants_run", ROOT / "tests/mutants/run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("mutants_run", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_mutant_applies_exactly_once_and_names_existing_tests():
    harness = _harness()
    mutants = harness.load()
    assert len(mutants) >= 19
    stale = {m.id: harness.stale_reason(m, ROOT) for m in mutants}
    assert {k: v for k, v in stale.items() if v} == {}
    for mutant in mutants:
        assert mutant.tests, f"{mutant.id} names no test"
        for node in mutant.tests:
            path, _, name = node.partition("::")
            tree = ast.parse((ROOT / path).read_text())
            functions = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
            assert name.split("[")[0] in functions, f"{mutant.id}: {node} does not exist"


def test_a_stale_mutant_is_reported(tmp_path):
    harness = _harness()
    (tmp_path / "m.py").write_text("x = 1\nx = 1\n")
    edit = harness.Edit("m.py", "x = 1", "x = 2")
    twice = harness.Mutant(id="t", invariant="0", bug="", edits=[edit], tests=[])
    assert "found 2 times" in harness.stale_reason(twice, tmp_path)
    (tmp_path / "m.py").write_text("y = 1\n")
    assert "found 0 times" in harness.stale_reason(twice, tmp_path)
    (tmp_path / "m.py").write_text("x = 1\n")
    assert harness.stale_reason(twice, tmp_path) == ""
