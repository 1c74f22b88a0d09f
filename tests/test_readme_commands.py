"""The two README set-up commands work: bin/serve answers HTTP, bin/test runs pytest."""

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

from tests import servers

ROOT = Path(__file__).resolve().parent.parent


def _quick_start_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


def _descendants(pid: int) -> set[int]:
    """Every live process below `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_readme_lists_exactly_the_two_commands():
    assert _quick_start_commands() == ["bin/serve", "bin/test"]


@pytest.mark.slow
def test_run_command_serves_the_admin_login_then_stops(tmp_path):
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "ADMIN_PASSWORD": "s3cret-pass",
    }
    # migrate, collectstatic, setup_schedules and bootstrap_admin come first: a minute and more
    # on a loaded 2-core machine (bin_serve waits up to 150 s for the login page to answer).
    serve = servers.bin_serve(env, tmp_path / "serve.log")
    processes: set[int] = set()
    try:
        response = requests.get(f"{serve.url}/admin/login/", timeout=10)
        assert response.status_code == 200
        assert "csrfmiddlewaretoken" in response.text
        static = requests.get(f"{serve.url}/static/admin/css/base.css", timeout=5)
        assert static.status_code == 200
        # gunicorn's master and workers, qcluster and its forked workers, honcho's own.
        processes = _descendants(serve.pid)
        assert len(processes) >= 6, processes
    finally:
        # A SIGTERM of bin/serve alone (not its group) stops every process it started, the
        # cluster's forked workers too, within 15 s (qcluster may hang on SIGTERM: SIGKILLed).
        stopped_at = time.monotonic()
        serve.stop(timeout=30)
    while time.monotonic() - stopped_at < 15 and any(_alive(pid) for pid in processes):
        time.sleep(0.2)
    output = serve.log_tail(100_000)
    assert not [pid for pid in processes if _alive(pid)], output
    assert serve.proc is not None and serve.proc.returncode != -signal.SIGKILL, output
    assert "user 'admin', password 's3cret-pass'" in output


def test_test_command_collects_the_suite():
    result = subprocess.run(
        [str(ROOT / "bin/test"), "--collect-only", "-q", "tests/test_models.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"\d+ tests? collected", result.stdout)
