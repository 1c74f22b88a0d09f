"""Data flows one way (STYLE.md, issues 15 and 37): doors -> task_state -> runtime -> outbox ->
watchers -> registration -> scheduling -> events_out, over shared packages; only the django-q2
modules touch django-q2.

`assets_app/` holds Django's own modules at its top (`apps`, `tasks`: the django-q2 entry points,
`views`) and otherwise one package per capability, each `__init__` saying what it owns, which
tables it writes and what it may import. Every module's imports are read with `ast` (at module
level and inside functions; `import assets_app.x`, `from assets_app import x`, `from . import x`,
`from .x import y`) and checked against two rules:

1. Layers. Each package belongs to one layer of the flow (`LAYERS`, leftmost first) or is shared
   (`SHARED`). A module may import its own layer, the layers to its right and shared packages;
   never a layer to its left. A shared package imports only shared packages.
2. django-q2. Only `tasks`, the `cluster` package (nudges, broker, sweeps) and the `qcluster`
   command import `django_q`, and no module but those imports `tasks` (the entry points: the
   domain sends nudges through `cluster.nudges`).

A package in neither `LAYERS` nor `SHARED` fails the test: a new package is placed on purpose.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "assets_app"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

# Left to right along the flow. Names are package (or top-level module) paths under assets_app;
# a name covers every module of its package (`api` covers `api.execution`).
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    # The doors: HTTP APIs (and their middleware), admin, commands, the django-q2 entry points,
    # plain views, app set-up. The RabbitMQ consumer loop is a door too, but it lives with the
    # watchers it runs (`watchers.consumer`) and imports only rightwards.
    # The timers process (issue 41) is a door too: it calls the domain functions of work due at
    # a time, as `tasks` calls the drain and the scheduler.
    (
        "doors",
        frozenset(
            {"api", "admin", "management", "templatetags", "views", "apps", "tasks", "timers"}
        ),
    ),
    # One module per TI state change (issue 23), and the repair sweep of what crashes left.
    ("task_state", frozenset({"task_state"})),
    # What a running task reads and writes besides its state: XComs, Variables, Connections,
    # logs, run-time requests and the token's scopes.
    ("runtime", frozenset({"runtime"})),
    ("outbox", frozenset({"outbox"})),
    # Issue 28: queue watchers register a message's events through `registration`.
    ("watchers", frozenset({"watchers"})),
    ("registration", frozenset({"registration"})),
    ("scheduling", frozenset({"scheduling"})),
    # Issue 29, events out: webhooks and freshness; they read what the flow wrote and write only
    # their own tables.
    ("events_out", frozenset({"events_out"})),
)
SHARED = frozenset(
    {
        "__init__",
        "models",
        "migrations",
        "sql",
        # The django-q2 side: nudges, the broker, the sweeps' Schedule rows.
        "cluster",
        # Bounds, keys, secrets, exposure, settings checks, domain exceptions.
        "guards",
        # Retention (the one deleter of history), audit, metrics, heartbeats, observability and
        # the reference worker: each imports only shared packages.
        "operations",
        # Dag definition documents, conditions and timetables.
        "definitions",
        # The read side: Dags, runs, TIs, assets, events, queued events, lineage, listing.
        "catalog",
        "formats",
    }
)
# Django's own modules at the top of the package; everything else lives in a package.
TOP_LEVEL_MODULES = frozenset({"__init__", "apps", "tasks", "views"})
# ... and the `qcluster` command, which subclasses django-q2's to run fewer system checks.
DJANGO_Q_MODULES = frozenset({"tasks", "cluster", "management.commands.qcluster"})


@dataclass(frozen=True)
class Import:
    """`importer` (a module path under the package, e.g. "api.execution") imports `target` (a
    module path under the package, or a full dotted name outside it) at `path`:`line`."""

    importer: str
    target: str
    internal: bool
    path: str
    line: int


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    importer: str
    target: str
    rule: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.importer} imports {self.target}: {self.rule}"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, *, importer: str, is_package: bool, path: str) -> list[Import]:
    """Every import statement of `source` (anywhere in it, functions included), resolved to
    package-relative module paths where it names this package."""
    package = importer.split(".") if is_package else importer.split(".")[:-1]
    if importer == "__init__":
        package = []
    found: list[Import] = []

    def add(dotted: str, line: int) -> None:
        if dotted == PACKAGE or dotted.startswith(PACKAGE + "."):
            found.append(Import(importer, dotted[len(PACKAGE) + 1 :], True, path, line))
        else:
            found.append(Import(importer, dotted, False, path, line))

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                dotted = ".".join([PACKAGE, *base, *([node.module] if node.module else [])])
            else:
                dotted = node.module or ""
            internal = dotted == PACKAGE or dotted.startswith(PACKAGE + ".")
            for alias in node.names:
                # `from pkg import name`: `name` is a submodule or a name of `pkg`; taken as a
                # submodule (the stricter reading) when it is internal.
                add(f"{dotted}.{alias.name}" if internal else dotted, node.lineno)
    return found


def layer_of(module: str) -> int | None:
    """Index in LAYERS, None for a shared module; KeyError for an unclassified one."""
    names = [module.split(".")[: i + 1] for i in range(module.count(".") + 1)]
    for prefix in reversed([".".join(n) for n in names]):
        for index, (_, members) in enumerate(LAYERS):
            if prefix in members:
                return index
        if prefix in SHARED:
            return None
    raise KeyError(module)


def touches_django_q(module: str) -> bool:
    """`module` is one of DJANGO_Q_MODULES or a module of one of those packages."""
    return any(module == name or module.startswith(name + ".") for name in DJANGO_Q_MODULES)


def check(imports: list[Import], *, known: set[str]) -> list[Violation]:
    """The violations of both rules among `imports`. An internal target that is a name of a
    package rather than a submodule (`from .models import Dag`) is checked as that package."""
    violations = []
    for imp in imports:
        if not imp.internal:
            top = imp.target.split(".")[0]
            if top == "django_q" and not touches_django_q(imp.importer):
                violations.append(
                    Violation(imp.path, imp.line, imp.importer, imp.target, "only tasks, the "
                              "cluster package and the qcluster command import django_q")
                )  # fmt: skip
            continue
        target = imp.target
        while target and target not in known:
            target = target.rpartition(".")[0]
        target = target or "__init__"
        if target == "tasks" and (imp.importer == "tasks" or not touches_django_q(imp.importer)):
            violations.append(
                Violation(
                    imp.path,
                    imp.line,
                    imp.importer,
                    target,
                    "the entry points are imported by no domain module (send nudges through "
                    "cluster/nudges.py)",
                )
            )
            continue
        here, there = layer_of(imp.importer), layer_of(target)
        if there is None:
            continue
        if here is None:
            rule = f"a shared module imports the {LAYERS[there][0]} layer"
        elif there < here:
            rule = (
                f"the {LAYERS[here][0]} layer imports the {LAYERS[there][0]} layer to its left "
                "(flow: " + " -> ".join(name for name, _ in LAYERS) + ")"
            )
        else:
            continue
        violations.append(Violation(imp.path, imp.line, imp.importer, target, rule))
    return sorted(violations, key=lambda v: (v.path, v.line, v.target))


def package_modules(root: Path = ROOT) -> dict[str, Path]:
    return {
        module_name(path, root): path
        for path in sorted(root.rglob("*.py"))
        if "migrations" not in path.relative_to(root).parts
    }


def package_imports(root: Path = ROOT) -> list[Import]:
    found = []
    for module, path in package_modules(root).items():
        found += imports_of(
            path.read_text(),
            importer=module,
            is_package=path.name == "__init__.py",
            path=str(path.relative_to(root.parent)),
        )
    return found


def test_every_module_is_placed_in_a_layer_or_shared():
    unplaced = []
    for module in package_modules():
        try:
            layer_of(module)
        except KeyError:
            unplaced.append(module)
    assert not unplaced, f"place these modules in LAYERS or SHARED: {unplaced}"


def test_imports_follow_the_flow_and_only_the_django_q2_modules_touch_django_q():
    violations = check(package_imports(), known=set(package_modules()))
    assert not violations, "\n".join(map(str, violations))


def test_only_djangos_own_modules_sit_at_the_top_of_the_package():
    top = {path.stem for path in ROOT.glob("*.py")}
    assert top <= TOP_LEVEL_MODULES, (
        "move these modules into the package of their capability: "
        f"{sorted(top - TOP_LEVEL_MODULES)}"
    )


def test_every_package_says_what_it_owns_writes_and_may_import():
    """Each package of `assets_app/` (Django's `migrations` aside) opens with a docstring that
    has an `Owns:`, a `Writes:` and a `May import:` part, and every layer or shared name is a
    package or top-level module that exists."""
    packages = sorted(
        path.parent for path in ROOT.glob("*/__init__.py") if path.parent.name != "migrations"
    )
    missing = []
    for package in packages:
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
        parts = [part for part in ("Owns:", "Writes:", "May import:") if part not in doc]
        if parts:
            missing.append(f"{package.relative_to(ROOT.parent)}/__init__.py lacks {parts}")
    assert not missing, "\n".join(missing)
    placed = {name for _, members in LAYERS for name in members} | SHARED
    existing = {p.name for p in packages} | {"migrations"} | {p.stem for p in ROOT.glob("*.py")}
    assert placed == existing, (placed - existing, existing - placed)


def test_the_checker_catches_a_violating_source():
    source = (
        "from ..operations import audit\n"
        "from ..models import Dag\n"
        "import assets_app.task_state\n"
        "\n"
        "def late():\n"
        "    from .. import tasks\n"
        "    from ..api.errors import to_response\n"
        "    from django_q.tasks import async_task\n"
        "    from ..cluster import nudges\n"
    )
    known = {
        "registration",
        "registration.outlets",
        "operations",
        "operations.audit",
        "models",
        "task_state",
        "tasks",
        "api",
        "api.errors",
        "cluster",
        "cluster.nudges",
    }
    imports = imports_of(
        source,
        importer="registration.outlets",
        is_package=False,
        path="assets_app/registration/outlets.py",
    )
    caught = {(v.line, v.target) for v in check(imports, known=known)}
    assert caught == {(3, "task_state"), (6, "tasks"), (7, "api.errors"), (8, "django_q.tasks")}
    # The message names the file, the line and the forbidden target.
    (message,) = [str(v) for v in check(imports, known=known) if v.line == 3]
    assert message.startswith(
        "assets_app/registration/outlets.py:3: registration.outlets imports task_state:"
    )

    # A shared package imports no layer, whichever module of it does.
    shared = imports_of(
        "from ..outbox import rows\n",
        importer="models.queue",
        is_package=False,
        path="assets_app/models/queue.py",
    )
    assert [
        (v.line, v.target) for v in check(shared, known={"outbox", "outbox.rows", "models"})
    ] == [(1, "outbox.rows")]
    # The cluster package may import django_q; a sibling shared package may not.
    cluster = imports_of(
        "from django_q.tasks import async_task\n",
        importer="cluster.nudges",
        is_package=False,
        path="assets_app/cluster/nudges.py",
    )
    assert check(cluster, known={"cluster", "cluster.nudges", "tasks"}) == []
    guards = imports_of(
        "from django_q.tasks import async_task\n",
        importer="guards.keys",
        is_package=False,
        path="assets_app/guards/keys.py",
    )
    assert [v.target for v in check(guards, known={"guards", "guards.keys"})] == ["django_q.tasks"]
