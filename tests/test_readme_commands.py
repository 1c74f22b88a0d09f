"""The two README set-up commands work: bin/serve answers HTTP, bin/test runs pytest."""

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parent.parent


def _quick_start_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_readme_lists_exactly_the_two_commands():
    assert _quick_start_commands() == ["bin/serve", "bin/test"]


@pytest.mark.slow
def test_run_command_serves_the_admin_login_then_stops(tmp_path):
    port = _free_port()
    env = {
        **os.environ,
        "PORT": str(port),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "ADMIN_PASSWORD": "s3cret-pass",
    }
    process = subprocess.Popen(
        [str(ROOT / "bin/serve")],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        # migrate, collectstatic, setup_schedules and bootstrap_admin come first: a minute and
        # more on a loaded 2-core machine (as the demo test allows).
        deadline = time.monotonic() + 150
        response = None
        while time.monotonic() < deadline:
            try:
                response = requests.get(f"http://127.0.0.1:{port}/admin/login/", timeout=2)
                break
            except (requests.ConnectionError, requests.Timeout):
                # Not listening yet, or still importing the URLconf (the first request loads
                # both APIs' schemas: seconds on a loaded machine).
                assert process.poll() is None, process.stdout.read()
                time.sleep(0.5)
        assert response is not None, "bin/serve did not answer within 150 s"
        assert response.status_code == 200
        assert "csrfmiddlewaretoken" in response.text
        static = requests.get(f"http://127.0.0.1:{port}/static/admin/css/base.css", timeout=5)
        assert static.status_code == 200
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    assert "user 'admin', password 's3cret-pass'" in output
    assert process.returncode is not None


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
