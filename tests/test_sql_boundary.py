"""Hand-written SQL and dialect branches live in the package `assets_app/sql/` only (issue 15,
split by owner in issue 23).

A domain module that opens a cursor, runs `.raw(` / `.extra(` / `RawSQL`, executes a statement
or asks a connection for its `vendor` fails here with the file and line; the statement belongs
in a named function of its owner's module of `assets_app/sql/`, with its reason and its SQLite
branch beside it. Migrations are exempt (they are reviewed, frozen history). And the package
itself stays a leaf: each of its modules imports Django, the standard library, psycopg, orjson,
the models and its sibling modules of the package, never a domain module.
"""

import ast
import sys
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "assets_app"
SQL_PACKAGE = APP / "sql"

# Calls whose attribute name hands SQL text to the database, or opens a cursor to do it.
SQL_CALLS = {"cursor", "raw", "extra", "execute", "executemany"}


def _domain_modules() -> list[Path]:
    return sorted(
        path
        for path in APP.rglob("*.py")
        if SQL_PACKAGE not in path.parents and "migrations" not in path.relative_to(APP).parts
    )


def _names_raw_sql(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == "RawSQL"
    if isinstance(node, ast.Name):
        return node.id == "RawSQL"
    if isinstance(node, ast.ImportFrom):
        return any(alias.name == "RawSQL" for alias in node.names)
    return False


def raw_sql_uses(source: str) -> list[tuple[int, str]]:
    """(line, what) of every raw SQL or dialect use in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in SQL_CALLS
        ):
            found.append((node.lineno, f".{node.func.attr}()"))
        elif isinstance(node, ast.Attribute) and node.attr == "vendor":
            found.append((node.lineno, ".vendor"))
        elif _names_raw_sql(node):
            found.append((node.lineno, "RawSQL"))
    return sorted(set(found))


def test_raw_sql_and_dialect_branches_only_in_the_sql_module():
    offenders = [
        f"{path.relative_to(APP.parent)}:{line}: {what}"
        for path in _domain_modules()
        for line, what in raw_sql_uses(path.read_text())
    ]
    assert not offenders, (
        "raw SQL or a dialect branch outside assets_app/sql/ (move the statement into a named "
        "function of its owner's module there, with its reason):\n" + "\n".join(offenders)
    )


def test_the_checker_finds_each_kind_of_raw_sql():
    source = (
        "from django.db.models.expressions import RawSQL\n"
        "with connection.cursor() as c:\n"
        "    c.execute('SELECT 1')\n"
        "Dag.objects.raw('SELECT * FROM dag')\n"
        "if connections['default'].vendor == 'postgresql':\n"
        "    pass\n"
        "Dag.objects.annotate(x=expressions.RawSQL('1', []))\n"
        "'a docstring naming connection.cursor() is no use of it'\n"
    )
    assert raw_sql_uses(source) == [
        (1, "RawSQL"),
        (2, ".cursor()"),
        (3, ".execute()"),
        (4, ".raw()"),
        (5, ".vendor"),
        (7, "RawSQL"),
    ]


def _sql_modules() -> list[Path]:
    return sorted(SQL_PACKAGE.glob("*.py"))


def test_the_sql_package_is_where_the_statements_are():
    assert (SQL_PACKAGE / "__init__.py").is_file() and not (APP / "sql.py").exists()
    assert len(_sql_modules()) > 1


def import_violations(path: Path, siblings: set[str]) -> list[str]:
    """The imports of the sql module `path` beyond Django, the standard library, psycopg,
    orjson, the models and its `siblings` in the package."""
    allowed_roots = {"django", "psycopg", "orjson", *sys.stdlib_module_names}
    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            # A sibling of the package: `from .connection import prepared_cursor`, or
            # `from . import connection as connection_sql`.
            names = [node.module] if node.module else [alias.name for alias in node.names]
            if any(name.split(".")[0] not in siblings for name in names):
                bad.append(f"line {node.lineno}: from .{node.module or ''}")
        elif isinstance(node, ast.ImportFrom) and node.level:
            if node.level != 2 or not (node.module or "").startswith("models"):
                bad.append(f"line {node.lineno}: from {'.' * node.level}{node.module or ''}")
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] not in allowed_roots:
                bad.append(f"line {node.lineno}: from {node.module}")
        elif isinstance(node, ast.Import):
            bad += [
                f"line {node.lineno}: import {alias.name}"
                for alias in node.names
                if alias.name.split(".")[0] not in allowed_roots
            ]
    return bad


def test_the_sql_module_imports_no_domain_module():
    siblings = {path.stem for path in _sql_modules()}
    bad = [
        f"{path.relative_to(APP.parent)}: {violation}"
        for path in _sql_modules()
        for violation in import_violations(path, siblings)
    ]
    assert not bad, "assets_app/sql/ imports beyond Django and the models:\n" + "\n".join(bad)


def test_the_import_checker_refuses_a_domain_module(tmp_path):
    module = tmp_path / "x.py"
    module.write_text(
        "from ..models import Dag\nfrom .connection import prepared_cursor\n"
        "from .. import locks\nfrom ..task_state import succeed\nfrom . import y\n"
        "import assets_app.outbox\nfrom assets_app import runs\nfrom . import connection\n"
    )
    assert import_violations(module, {"connection", "x"}) == [
        "line 3: from ..",
        "line 4: from ..task_state",
        "line 5: from .",
        "line 6: import assets_app.outbox",
        "line 7: from assets_app",
    ]
