"""tests/servers.py: the one helper that starts and stops servers for tests and benchmarks."""

import os
import socket
import sys
import time

import pytest
import requests

from tests import servers

# Ignores SIGTERM, forks a child that does too, prints the child's pid, then sleeps.
STUBBORN = (
    "import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "pid = os.fork(); "
    "pid or time.sleep(600); "
    "print(pid, flush=True); time.sleep(600)"
)

# As honcho (bin/serve) starts each process: a child in a session of its own, which ignores
# SIGTERM; the leader prints the child's pid, then sleeps, or exits at a SIGTERM when
# `leader_exits_on_term` (honcho's stop: it leaves a child that did not stop behind).
DETACHED = (
    "import signal, subprocess, sys, time; "
    "child = subprocess.Popen([sys.executable, '-c', "
    "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'], "
    "start_new_session=True); "
    "print(child.pid, flush=True); "
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0) if {exits} else None); "
    "time.sleep(600)"
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_an_http_server_is_ready_when_it_answers_and_stops_on_sigterm(tmp_path):
    port = servers.free_port()
    server = servers.Server(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        os.environ,
        tmp_path / "http.log",
        url=f"http://127.0.0.1:{port}",
    )
    with server.start():
        assert requests.get(server.url, timeout=5).status_code == 200  # no wait needed
    assert not server.running
    assert server.proc is not None and server.proc.returncode == -15  # SIGTERM was enough
    assert "===== start 1:" in server.log_tail()


def test_stop_sigkills_the_whole_group_after_the_timeout(tmp_path):
    server = servers.Server([sys.executable, "-c", STUBBORN], os.environ, tmp_path / "s.log")
    server.start()
    deadline = time.monotonic() + 30
    while not server.log_tail().strip().endswith(tuple("0123456789")):
        assert time.monotonic() < deadline, server.log_tail()
        time.sleep(0.05)
    child = int(server.log_tail().split()[-1])
    assert _alive(child)
    started = time.monotonic()
    server.stop(timeout=1)
    assert 1 <= time.monotonic() - started < 10
    assert server.proc is not None and server.proc.returncode == -9
    assert not _alive(server.pid) and not _alive(child)


def _printed_pid(server: servers.Server) -> int:
    deadline = time.monotonic() + 30
    while not server.log_tail().strip().endswith(tuple("0123456789")):
        assert time.monotonic() < deadline, server.log_tail()
        time.sleep(0.05)
    return int(server.log_tail().split()[-1])


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_a_descendant_in_a_session_of_its_own_goes_with_the_server(tmp_path, how):
    # bin/serve's processes (honcho starts each in its own session) outlived a SIGKILL of its
    # group and went on working on the test database: one consumed a later test's queue.
    server = servers.Server(
        [sys.executable, "-c", DETACHED.format(exits=False)], os.environ, tmp_path / "d.log"
    )
    server.start()
    child = _printed_pid(server)
    assert os.getpgid(child) != os.getpgid(server.pid)  # out of the group killpg reaches
    if how == "kill":
        server.kill()
    else:
        server.stop(timeout=1)
    assert not _alive(server.pid) and not _alive(child)


def test_stop_kills_what_a_leader_that_exits_on_sigterm_left_behind(tmp_path):
    server = servers.Server(
        [sys.executable, "-c", DETACHED.format(exits=True)], os.environ, tmp_path / "l.log"
    )
    server.start()
    child = _printed_pid(server)
    server.stop(timeout=10)
    assert server.proc is not None and server.proc.returncode == 0  # the leader exited itself
    assert not _alive(child)  # its child, then init's, was killed all the same


def test_a_server_that_exits_before_it_answers_fails_with_its_log(tmp_path):
    port = servers.free_port()
    server = servers.Server(
        [sys.executable, "-c", "print('no such luck'); raise SystemExit(3)"],
        os.environ,
        tmp_path / "early.log",
        url=f"http://127.0.0.1:{port}",
    )
    with pytest.raises(servers.ServerError, match="no such luck"):
        server.start()
    assert not server.running


def test_a_restart_appends_to_the_log(tmp_path):
    server = servers.Server([sys.executable, "-c", "print('hi')"], os.environ, tmp_path / "r.log")
    server.start()
    server.proc.wait(timeout=30)
    server.start()
    server.proc.wait(timeout=30)
    server.stop()  # already exited: only sweeps its group
    text = (tmp_path / "r.log").read_text()
    assert "===== start 1:" in text and "===== start 2:" in text
    assert text.count("hi\n") == 2


def test_free_port_takes_the_first_free_one_of_a_range():
    port = servers.free_port()
    assert servers.free_port([port]) == port
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        with pytest.raises(RuntimeError, match="no free port"):
            servers.free_port([port])
