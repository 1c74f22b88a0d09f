"""The invariant table (tests/invariants.toml, issue 50): every invariant of DESIGN.md section 4
has a row naming the tests that guard it, and at least one mutant of the mutant check
(tests/mutants/mutants.toml) that one of those tests kills. A new invariant without a row, a row
whose tests are gone, or a row without a mutant fails here, in the quick subset, before the
mutant check runs.

DESIGN.md lives beside the repository (`../shared/DESIGN.md` on the team's machines; set
`ASSET_SERVICE_DESIGN` to its path elsewhere). Where it cannot be found, the table is still
checked against itself and the mutant list; only the comparison of titles with DESIGN is skipped.
"""

import ast
import os
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "tests/invariants.toml"
MUTANTS = ROOT / "tests/mutants/mutants.toml"
INVARIANT_LINE = re.compile(r"^(\d+)\. \*\*(.+?)\*\*", re.M)


def rows() -> list[dict]:
    return tomllib.loads(TABLE.read_text())["invariant"]


def design_invariants(text: str) -> list[tuple[int, str]]:
    """(number, title) of each invariant in DESIGN's section 4, in order."""
    start = text.index("## 4.")
    end = text.index("\n## ", start + 1)
    return [(int(n), title) for n, title in INVARIANT_LINE.findall(text[start:end])]


def design_text() -> str | None:
    candidates = [
        os.environ.get("ASSET_SERVICE_DESIGN", ""),
        ROOT.parent / "shared/DESIGN.md",
        "/work/shared/DESIGN.md",
    ]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate).read_text()
    return None


def _function(node: str) -> str:
    """A test's node id without its parameters: `path::name[id]` -> `path::name`."""
    return node.split("[")[0]


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


def test_the_rows_are_numbered_in_order_and_each_names_existing_tests():
    table = rows()
    assert [row["number"] for row in table] == list(range(1, len(table) + 1))
    functions: dict[str, set[str]] = {}
    for row in table:
        assert row["tests"], f"invariant {row['number']} names no test"
        for node in row["tests"]:
            path, _, name = node.partition("::")
            if path not in functions:
                assert (ROOT / path).is_file(), f"invariant {row['number']}: {path} is gone"
                functions[path] = _functions(ROOT / path)
            assert name.split("[")[0] in functions[path], (
                f"invariant {row['number']}: {node} does not exist"
            )


def test_every_row_has_a_mutant_killed_by_one_of_its_tests_and_every_mutant_a_row():
    table = {row["number"]: {_function(node) for node in row["tests"]} for row in rows()}
    mutants = tomllib.loads(MUTANTS.read_text())["mutant"]
    covered: set[int] = set()
    for mutant in mutants:
        number = int(mutant["invariant"])
        assert number in table, f"mutant {mutant['id']}: invariant {number} has no row"
        named = {_function(node) for node in mutant["tests"]}
        assert named & table[number], (
            f"mutant {mutant['id']}: none of its tests is in invariant {number}'s row"
        )
        covered.add(number)
    assert sorted(set(table) - covered) == [], "invariants without a mutant"


def test_the_rows_are_designs_invariants():
    text = design_text()
    if text is None:
        pytest.skip("DESIGN.md not found (set ASSET_SERVICE_DESIGN to its path)")
    assert [(row["number"], row["title"]) for row in rows()] == design_invariants(text)


def test_a_design_with_an_invariant_more_than_the_table_is_told_apart():
    """The comparison above can fail: a section 4 with one invariant more reads differently."""
    table = [(row["number"], row["title"]) for row in rows()]
    lines = "\n".join(f"{n}. **{title}** Text." for n, title in table)
    design = f"# D\n## 4. Invariants\n{lines}\n{len(table) + 1}. **New rule.** Text.\n## 5. Next\n"
    assert design_invariants(design)[:-1] == table
    assert design_invariants(design) != table
