"""Data flows one way (STYLE.md, issue 15): api -> task_state -> outbox -> registration ->
scheduling, and only the django-q2 modules touch django-q2.

Every `assets_app` module's imports are read with `ast` (at module level and inside functions;
`import assets_app.x`, `from assets_app import x`, `from . import x`, `from .x import y`) and
checked against two rules:

1. Layers. Each module belongs to one layer of the flow (`LAYERS`, leftmost first) or to the
   shared lower modules (`SHARED`). A module may import its own layer, the layers to its right
   and shared modules; never a layer to its left. A shared module imports only shared modules.
2. django-q2. Only `tasks`, `nudges`, `broker` and `sweeps` (and the `qcluster` command)
   import `django_q`, and no module but those imports `tasks` (the entry points: the domain
   sends nudges through `nudges`).

A module in neither `LAYERS` nor `SHARED` fails the test: a new module is placed on purpose.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "assets_app"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

# Left to right along the flow. Names are module paths under assets_app; a name also covers
# the modules of its package (`api` covers `api.execution`).
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    (
        "api",  # the doors: HTTP APIs, admin, commands, django-q2 entry points, app set-up
        frozenset(
            {
                "api",
                "admin",
                "management",
                "templatetags",
                "views",
                "middleware",
                "apps",
                "tasks",
                "sweeps",
                # Issue 28: the RabbitMQ consumer loop, a door like the HTTP API.
                "watcher_consumer",
            }
        ),
    ),
    # `task_state` is a package, one module per state change: starting, success, finishing,
    # retries, liveness, claims (issue 23); its __init__ holds what they share.
    ("task_state", frozenset({"task_state", "task_runtime", "task_logs", "repair"})),
    ("outbox", frozenset({"drain", "outbox"})),
    # Issue 28: queue watchers register events through `registration` (a message's events).
    ("registration", frozenset({"registration", "asset_events", "queued_events", "watchers"})),
    (
        "scheduling",
        frozenset(
            {"scheduling", "runs", "dependencies", "mapping", "time_scheduling", "backfills"}
        ),
    ),
    # Issue 30: the one writer that deletes history; it reads and deletes every history table
    # through the models, and imports only shared modules.
    ("retention", frozenset({"retention"})),
    # Issue 29, events out: sending webhooks and evaluating freshness, run by the cluster; they
    # read what the flow wrote and write only their own tables (messages via `webhooks`).
    ("events_out", frozenset({"webhook_delivery", "freshness"})),
)
SHARED = frozenset(
    {
        "__init__",
        "models",
        "migrations",
        "locks",
        "metrics",
        "limits",
        "exceptions",
        "audit",
        "heartbeats",
        "observability",
        "nudges",
        "broker",
        "payloads",
        "sql",
        "conditions",
        "timetables",
        "dag_schema",
        "definitions",
        "run_ids",
        "dags",
        "run_reads",
        "run_waits",
        "task_scopes",
        "listing",
        "lineage",
        "xcoms",
        "variables",
        "masking",
        "encryption",
        "database_errors",
        "keys",
        "exposure",
        "checks",
        "reference_worker",
        "formats",
        "webhooks",
        "egress",
    }
)
# ... and the `qcluster` command, which subclasses django-q2's to run fewer system checks.
DJANGO_Q_MODULES = frozenset(
    {"tasks", "nudges", "broker", "sweeps", "management.commands.qcluster"}
)


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


def check(imports: list[Import], *, known: set[str]) -> list[Violation]:
    """The violations of both rules among `imports`. An internal target that is a name of a
    package rather than a submodule (`from .models import Dag`) is checked as that package."""
    violations = []
    for imp in imports:
        if not imp.internal:
            top = imp.target.split(".")[0]
            if top == "django_q" and imp.importer not in DJANGO_Q_MODULES:
                violations.append(
                    Violation(imp.path, imp.line, imp.importer, imp.target, "only tasks, nudges, "
                              "broker and sweeps import django_q")
                )  # fmt: skip
            continue
        target = imp.target
        while target and target not in known:
            target = target.rpartition(".")[0]
        target = target or "__init__"
        if target == "tasks" and imp.importer not in DJANGO_Q_MODULES - {"tasks"}:
            violations.append(
                Violation(
                    imp.path,
                    imp.line,
                    imp.importer,
                    target,
                    "the entry points are imported by no domain module (send nudges through "
                    "nudges.py)",
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


def test_the_checker_catches_a_violating_source():
    source = (
        "from . import audit\n"
        "from .models import Dag\n"
        "import assets_app.task_state\n"
        "\n"
        "def late():\n"
        "    from . import tasks\n"
        "    from .api.errors import to_response\n"
        "    from django_q.tasks import async_task\n"
    )
    known = {"registration", "audit", "models", "task_state", "tasks", "api", "api.errors"}
    imports = imports_of(
        source, importer="registration", is_package=False, path="assets_app/registration.py"
    )
    caught = {(v.line, v.target) for v in check(imports, known=known)}
    assert caught == {(3, "task_state"), (6, "tasks"), (7, "api.errors"), (8, "django_q.tasks")}
    # The message names the file, the line and the forbidden target.
    (message,) = [str(v) for v in check(imports, known=known) if v.line == 3]
    assert message.startswith("assets_app/registration.py:3: registration imports task_state:")

    shared = imports_of(
        "from ..outbox import enqueue\n",
        importer="models.queue",
        is_package=False,
        path="assets_app/models/queue.py",
    )
    assert [(v.line, v.target) for v in check(shared, known={"outbox", "models"})] == [
        (1, "outbox")
    ]
