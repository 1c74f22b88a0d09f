"""Starting and stopping the service's processes for tests and benchmarks, in one place.

A `Server` is a child process in its own session (process group) with its output in a log file:
`start()` waits until it is ready (an HTTP answer, when it serves), `stop()` sends SIGTERM to
the process and SIGKILL to its whole tree after a timeout (django-q2's qcluster can hang on
SIGTERM, django-q2 #346), `kill()` SIGKILLs the tree at once (a host dying). The tree is the
process group and every descendant, wherever its session: honcho (`bin/serve`) starts each of
its processes in a session of its own, so a SIGKILL of `bin/serve`'s group alone left gunicorn,
the qcluster, the timers and the queue-watcher consumer running, orphans still working on the
test database (one consumed a later test's queue: a flaky test in CI). `gunicorn()`,
`runserver()`, `qcluster()` and `bin_serve()` build the usual ones; any other command is a
`Server(argv, env, log)`.

Plain Python (no pytest, no Django): the benchmarks import it too (`bench/_harness.py`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent


class ServerError(AssertionError):
    """A server exited early or did not get ready in time (a test failure, not an error)."""


def free_port(ports: Iterable[int] | None = None) -> int:
    """A free TCP port on 127.0.0.1: the first free one of `ports`, else one the OS picks."""
    for port in ports if ports is not None else (0,):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return sock.getsockname()[1]
    raise RuntimeError(f"no free port in {ports}")


def _descendants(pid: int) -> list[psutil.Process]:
    """Every living descendant of `pid` (children, their children, ...), whatever its session."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _kill_all(processes: Iterable[psutil.Process]) -> None:
    """SIGKILL each of `processes` still alive (psutil checks a pid was not reused) and wait
    until they are gone."""
    alive = []
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
            alive.append(process)
    psutil.wait_procs(alive, timeout=10)


def _cmdline(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())[:120]
    except psutil.Error:
        return "?"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Server:
    """A child process group logging to `log`; optionally an HTTP server at `url`, ready once
    `url + ready_path` answers anything."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        log: Path,
        *,
        url: str | None = None,
        ready_path: str = "/",
        ready_timeout: float = 60.0,
        stop_timeout: float = 15.0,
    ) -> None:
        self.argv = [str(arg) for arg in argv]
        self.env = dict(env)
        self.log_path = Path(log)
        self.url = url
        self.ready_path = ready_path
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, *, wait: bool = True) -> Server:
        """Start it (again, after a kill), and wait until it answers HTTP when it is a server."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"already running: {self.argv}")
        self.starts += 1
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab" if self.starts > 1 else "wb") as log:
            log.write(f"===== start {self.starts}: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv,
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        if wait and self.url is not None:
            try:
                self.wait_ready()
            except BaseException:
                self.kill()
                raise
        return self

    def wait_ready(self) -> None:
        import requests

        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if not self.running:
                raise ServerError(f"{self.argv[:4]} exited early:\n{self.log_tail()}")
            try:
                requests.get(f"{self.url}{self.ready_path}", timeout=5)
                return
            except requests.RequestException:
                time.sleep(0.1)
        raise ServerError(
            f"{self.url} did not answer in {self.ready_timeout} s:\n{self.log_tail()}"
        )

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, *, also: Iterable[psutil.Process] = ()) -> None:
        """SIGKILL the whole tree (the process group and every descendant in a session of its
        own, plus `also`), like a host dying."""
        if self.proc is None:
            return
        tree = [*_descendants(self.proc.pid), *also]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        _kill_all(tree)
        self.proc.wait(timeout=10)
        # Children reparented to init may outlive the leader for a moment.
        deadline = time.monotonic() + 10
        while _group_alive(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.02)

    def stop(self, *, timeout: float | None = None) -> list[str]:
        """SIGTERM to the process (it stops its own children: a TERM to each of django-q2's
        processes can wedge its signal handler), then SIGKILL to its tree after `timeout`,
        including the descendants it had when it was told to stop (a leader that exits first
        leaves them to init, where `kill` no longer finds them). Returns what it left: a line
        per descendant still alive 2 s after it exited (or "did not exit ..."), before that
        sweep killed them (issue 44: a caller that must leave nothing fails on it)."""
        tree: list[psutil.Process] = []
        left: list[str] = []
        if self.running:
            assert self.proc is not None
            tree = _descendants(self.proc.pid)
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=self.stop_timeout if timeout is None else timeout)
            except subprocess.TimeoutExpired:
                left.append(f"{self.argv[:2]} did not exit within its stop timeout")
            else:
                _, alive = psutil.wait_procs(tree, timeout=2)
                left += [f"{p.pid} {_cmdline(p)}" for p in alive]
        self.kill(also=tree)
        return left

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def gunicorn(
    env: Mapping[str, str],
    log: Path,
    *,
    workers: int = 2,
    port: int | None = None,
    args: Sequence[str] = (),
    start: bool = True,
) -> Server:
    """gunicorn on 127.0.0.1:`port` (a free one by default), started and answering unless
    `start=False`; `args` are more gunicorn options."""
    port = port or free_port()
    argv = [
        sys.executable,
        "-m",
        "gunicorn",
        "project.wsgi:application",
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        str(workers),
        *args,
    ]
    server = Server(
        argv, env, log, url=f"http://127.0.0.1:{port}", ready_path="/execution/openapi.json"
    )
    return server.start() if start else server


def runserver(
    env: Mapping[str, str], log: Path, *, port: int | None = None, start: bool = True
) -> Server:
    """Django's development server (no reloader), started and answering unless `start=False`."""
    port = port or free_port()
    argv = [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"]
    server = Server(
        argv, env, log, url=f"http://127.0.0.1:{port}", ready_path="/execution/openapi.json"
    )
    return server.start() if start else server


def qcluster(
    env: Mapping[str, str], log: Path, *, stop_timeout: float = 15.0, start: bool = True
) -> Server:
    """`manage.py qcluster` (django-q2), started unless `start=False` (no readiness to wait for:
    a caller that needs it running waits for a task's effect)."""
    server = Server([sys.executable, "manage.py", "qcluster"], env, log, stop_timeout=stop_timeout)
    return server.start() if start else server


def timers(
    env: Mapping[str, str], log: Path, *, stop_timeout: float = 15.0, start: bool = True
) -> Server:
    """`manage.py run_timers` (the supervisor and its forked child), started unless
    `start=False`; no readiness to wait for (a caller waits for a timer's effect)."""
    argv = [sys.executable, "manage.py", "run_timers"]
    server = Server(argv, env, log, stop_timeout=stop_timeout)
    return server.start() if start else server


def bin_serve(
    env: Mapping[str, str],
    log: Path,
    *,
    port: int | None = None,
    ready_path: str = "/admin/login/",
    ready_timeout: float = 150.0,
    start: bool = True,
) -> Server:
    """`bin/serve` (migrate, ..., honcho with gunicorn and qcluster) on `port` (`env`'s PORT,
    else a free one), answering `ready_path` unless `start=False`. Its first start on a loaded
    machine takes a minute and more (migrate, collectstatic, bootstrap_admin come first)."""
    port = port or int(env.get("PORT") or free_port())
    server = Server(
        [str(ROOT / "bin/serve")],
        {**env, "PORT": str(port)},
        log,
        url=f"http://127.0.0.1:{port}",
        ready_path=ready_path,
        ready_timeout=ready_timeout,
        stop_timeout=30.0,
    )
    return server.start() if start else server
