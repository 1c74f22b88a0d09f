"""Mutant check: plant each bug of `mutants.toml` in a copy of the tree, run the tests that
should catch it, and report any that survive.

    python tests/mutants/run.py                 every mutant
    python tests/mutants/run.py ID [ID ...]     only these (ids as in mutants.toml)
    python tests/mutants/run.py --list          the list, with the tests each one names
    python tests/mutants/run.py --check         only check that every mutant's text is found

For each mutant: copy the tree (tracked and untracked, not ignored, files: `git ls-files`) to a
temporary directory (the working tree is never touched: other processes may be testing it),
apply its edits (each `old` text must occur exactly once in its file, else the mutant is STALE:
the code it guards was refactored, so update the mutant), and run `pytest -x` on the tests it
names, in the copy, against its own test database (`<TEST_DATABASE_URL's name>_mutant`, reused
across mutants). A failing test KILLS the mutant; all passing means it SURVIVED (a guard is
gone). First the named tests run once on the unmutated copy: they must pass, else a kill would
mean nothing. Prints a table; exits 1 on any survivor, stale mutant or error.
"""

from __future__ import annotations

import argparse
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[2]
LIST = Path(__file__).with_name("mutants.toml")
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/asset_events"
RUN_TIMEOUT = 600


@dataclass(frozen=True)
class Edit:
    file: str
    old: str
    new: str


@dataclass
class Mutant:
    id: str
    invariant: str
    bug: str
    edits: list[Edit]
    tests: list[str]
    result: str = ""
    seconds: float = 0.0
    detail: str = ""
    killed_by: list[str] = field(default_factory=list)
    output: str = ""


def load(path: Path = LIST) -> list[Mutant]:
    data = tomllib.loads(path.read_text())
    mutants = []
    for raw in data["mutant"]:
        edits = raw.get("edits") or [{"file": raw["file"], "old": raw["old"], "new": raw["new"]}]
        mutants.append(
            Mutant(
                id=raw["id"],
                invariant=str(raw["invariant"]),
                bug=raw["bug"],
                edits=[Edit(e["file"], e["old"], e["new"]) for e in edits],
                tests=list(raw["tests"]),
            )
        )
    ids = [m.id for m in mutants]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise SystemExit(f"duplicate mutant ids in {path.name}: {', '.join(duplicates)}")
    return mutants


def stale_reason(mutant: Mutant, tree: Path) -> str:
    """Why the mutant cannot be applied to `tree` ('' if it can)."""
    for edit in mutant.edits:
        path = tree / edit.file
        if not path.is_file():
            return f"{edit.file} does not exist"
        count = path.read_text().count(edit.old)
        if count != 1:
            return f"{edit.file}: original text found {count} times (must be exactly once)"
        if edit.old == edit.new:
            return f"{edit.file}: the edit changes nothing"
    return ""


def apply(mutant: Mutant, tree: Path) -> None:
    for edit in mutant.edits:
        path = tree / edit.file
        path.write_text(path.read_text().replace(edit.old, edit.new, 1))


def copy_tree(target: Path) -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        rel = name.decode()
        source = ROOT / rel
        if not source.is_file() or (source.is_symlink() and source.is_dir()):
            continue  # deleted in the working tree, or the .venv symlink
        dest = target / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest)


def mutant_database_url(slot: int = 0) -> str:
    """The database URL of a mutant run in `slot` (pytest-django tests in `test_<its name>`)."""
    url = os.environ.get("TEST_DATABASE_URL") or os.environ.get("DATABASE_URL") or DEFAULT_DB
    parts = urlsplit(url)
    name = parts.path.lstrip("/") or "asset_events"
    suffix = "_mutant" if slot == 0 else f"_mutant{slot}"
    return urlunsplit(parts._replace(path=f"/{name}{suffix}"))


def clone_test_database(slot: int) -> None:
    """Make slot's test database a copy of slot 0's (migrated by the baseline run): a template
    copy takes a moment where migrating a new one takes a pytest run of its own."""
    import psycopg

    source = "test_" + urlsplit(mutant_database_url(0)).path.lstrip("/")
    target = "test_" + urlsplit(mutant_database_url(slot)).path.lstrip("/")
    admin = urlunsplit(urlsplit(mutant_database_url(0))._replace(path="/postgres"))
    with psycopg.connect(admin.replace("postgres://", "postgresql://", 1), autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{target}"')
        c.execute(f'CREATE DATABASE "{target}" TEMPLATE "{source}"')


def pytest_run(
    tree: Path, tests: list[str], *, create_db: bool, slot: int = 0
) -> tuple[int, str, float]:
    env = {
        **os.environ,
        "DATABASE_URL": mutant_database_url(slot),
        "PYTHONDONTWRITEBYTECODE": "1",
        # Only the plugins the suite's own tests need: importing hypothesis, schemathesis and
        # faker's plugins was most of a run's start-up (the fuzz tests are no mutant's tests).
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        # The copy has no .venv-airflow-worker (ignored): the compat tests' Task SDK runs in
        # this tree's, which bin/airflow-worker checks against the copy's requirements hash.
        "AIRFLOW_WORKER_VENV": os.environ.get(
            "AIRFLOW_WORKER_VENV", str(ROOT / ".venv-airflow-worker")
        ),
    }
    env.pop("TEST_DATABASE_URL", None)
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "pytest_django.plugin",
        "-p",
        "pytest_timeout",
        "-x",
        "-q",
        "-rfE",
        "-p",
        "no:cacheprovider",
        "--reuse-db",  # keep the database for the next run (--create-db: migrate it afresh)
        *(["--create-db"] if create_db else []),
        *tests,
    ]
    started = time.monotonic()
    try:
        done = subprocess.run(
            argv, cwd=tree, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT
        )
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        return -1, out + f"\n(timed out after {RUN_TIMEOUT} s)", time.monotonic() - started
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


FAILED_LINE = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.M)


def failed_tests(output: str) -> list[str]:
    return [name.split(" - ")[0] for name in FAILED_LINE.findall(output)]


def tail(output: str, lines: int = 15) -> str:
    return "\n".join(output.strip().splitlines()[-lines:])


def run_one(mutant: Mutant, pristine: Path, tree: Path, slot: int, keep: bool) -> None:
    shutil.copytree(pristine, tree)
    apply(mutant, tree)
    code, output, mutant.seconds = pytest_run(tree, mutant.tests, create_db=False, slot=slot)
    if code in (1, -1):
        mutant.result = "killed"
        mutant.killed_by = failed_tests(output)
        mutant.detail = ", ".join(mutant.killed_by) or ("timeout" if code == -1 else "")
    elif code == 0:
        mutant.result = "SURVIVED"
        mutant.detail = "every named test passed"
    else:
        mutant.result = "ERROR"
        mutant.detail = f"pytest exit {code}: {tail(output, 3)}"
    if mutant.result != "killed":
        mutant.output = tail(output)
    if not keep:
        shutil.rmtree(tree, ignore_errors=True)


def run(mutants: list[Mutant], *, keep: bool, jobs: int) -> int:
    base = Path(tempfile.mkdtemp(prefix="ae-mutants-"))
    started = time.monotonic()
    try:
        pristine = base / "pristine"
        copy_tree(pristine)
        for mutant in mutants:
            reason = stale_reason(mutant, pristine)
            if reason:
                mutant.result, mutant.detail = "STALE", reason
        live = [m for m in mutants if not m.result]
        every_test = list(dict.fromkeys(t for m in live for t in m.tests))
        print(f">> {len(mutants)} mutants; baseline: {len(every_test)} named tests, unmutated")
        if every_test:
            code, output, seconds = pytest_run(pristine, every_test, create_db=True)
            if code != 0:
                print(tail(output, 40))
                print(f"!! the named tests fail (exit {code}) without any mutant: fix that first")
                return 1
            print(f"   passed in {seconds:.1f} s")
        jobs = max(1, min(jobs, len(live)))
        for slot in range(1, jobs):
            clone_test_database(slot)
        slots: queue.Queue[int] = queue.Queue()
        for slot in range(jobs):
            slots.put(slot)
        done = [0]
        lock = threading.Lock()

        def work(n: int, mutant: Mutant) -> None:
            slot = slots.get()
            try:
                run_one(mutant, pristine, base / f"m{n:02d}", slot, keep)
            finally:
                slots.put(slot)
            with lock:
                done[0] += 1
                print(
                    f"   [{done[0]}/{len(live)}] {mutant.id}: {mutant.result} "
                    f"({mutant.seconds:.1f} s)",
                    flush=True,
                )
                if mutant.output:
                    print(mutant.output, flush=True)

        print(f">> {len(live)} mutants, {jobs} at a time")
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            for future in [pool.submit(work, n, m) for n, m in enumerate(live, 1)]:
                future.result()
    finally:
        if keep:
            print(f">> trees kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    report(mutants, time.monotonic() - started)
    bad = [m for m in mutants if m.result != "killed"]
    return 1 if bad else 0


def report(mutants: list[Mutant], seconds: float) -> None:
    rows = [("mutant", "inv", "result", "s", "killed by / why")]
    rows += [(m.id, m.invariant, m.result, f"{m.seconds:.1f}", short(m.detail)) for m in mutants]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    print()
    for i, row in enumerate(rows):
        cells = [cell.ljust(w) for cell, w in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[4]]))
        if i == 0:
            print("  ".join([*("-" * w for w in widths), "-" * 15]))
    counts = {r: sum(1 for m in mutants if m.result == r) for r in ("killed", "SURVIVED")}
    other = len(mutants) - sum(counts.values())
    print(
        f"\n{len(mutants)} mutants: {counts['killed']} killed, {counts['SURVIVED']} survived, "
        f"{other} stale/error; {seconds:.0f} s"
    )


def short(text: str, limit: int = 110) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ids", nargs="*", help="run only these mutants")
    parser.add_argument("--list", action="store_true", help="print the mutants and their tests")
    parser.add_argument("--check", action="store_true", help="only check for stale mutants")
    parser.add_argument("--keep", action="store_true", help="keep the mutated trees")
    parser.add_argument(
        "--jobs",
        type=int,
        default=int(os.environ.get("MUTANT_JOBS", "2")),
        help="mutants run at a time, each on its own database (default 2, or $MUTANT_JOBS)",
    )
    args = parser.parse_args(argv)
    mutants = load()
    if args.ids:
        unknown = sorted(set(args.ids) - {m.id for m in mutants})
        if unknown:
            parser.error(f"unknown mutant id(s): {', '.join(unknown)}")
        mutants = [m for m in mutants if m.id in args.ids]
    if args.list:
        for m in mutants:
            print(f"{m.id} (invariant {m.invariant}): {m.bug}")
            for test in m.tests:
                print(f"    {test}")
        return 0
    if args.check:
        stale = [(m.id, stale_reason(m, ROOT)) for m in mutants]
        stale = [(i, r) for i, r in stale if r]
        for mutant_id, reason in stale:
            print(f"STALE {mutant_id}: {reason}")
        print(f"{len(mutants)} mutants, {len(stale)} stale")
        return 1 if stale else 0
    return run(mutants, keep=args.keep, jobs=args.jobs)


if __name__ == "__main__":
    sys.exit(main())
