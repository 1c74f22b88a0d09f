"""Issue 37: the README's module table ("Where the code lives") cannot drift. It is generated from
the package and module docstrings by `bin/module-table`; this test fails when README.md holds
another table than the one the code describes now, or when a module has no description."""

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _generator():
    loader = importlib.machinery.SourceFileLoader("module_table", str(ROOT / "bin/module-table"))
    spec = importlib.util.spec_from_loader("module_table", loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("module_table", module)
    loader.exec_module(module)
    return module


def test_the_readme_holds_the_table_the_docstrings_give():
    generator = _generator()
    readme = (ROOT / "README.md").read_text()
    assert generator.with_table(readme, generator.table()) == readme, (
        "README.md's module table is out of date: run bin/module-table --write"
    )


def test_every_package_and_module_of_assets_app_has_a_row():
    generator = _generator()
    listed = {where.strip("*`") for where, _ in generator.rows()}
    package = ROOT / "assets_app"
    expected = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    for init in package.glob("*/__init__.py"):
        directory = init.parent
        expected.add(f"{directory.name}/")
        if directory.name != "migrations":
            expected |= {
                p.relative_to(package).as_posix()
                for p in directory.rglob("*.py")
                if p.name != "__init__.py"
            }
    assert listed == expected


def test_a_module_without_a_docstring_or_help_is_refused(tmp_path, monkeypatch):
    generator = _generator()
    (tmp_path / "assets_app" / "things").mkdir(parents=True)
    (tmp_path / "assets_app" / "things" / "__init__.py").write_text('"""Things. Owns: all."""\n')
    (tmp_path / "assets_app" / "things" / "described.py").write_text(
        '"""Described here. More."""\n'
    )
    monkeypatch.setattr(generator, "ROOT", tmp_path)
    monkeypatch.setattr(generator, "PACKAGE", tmp_path / "assets_app")
    assert generator.rows() == [
        ("**`things/`**", "Things."),
        ("`things/described.py`", "Described here."),
    ]
    (tmp_path / "assets_app" / "things" / "silent.py").write_text("X = 1\n")
    with pytest.raises(generator.Undescribed, match=r"silent\.py"):
        generator.rows()
