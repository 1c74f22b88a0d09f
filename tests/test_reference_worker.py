"""The reference worker waits out a 503 (the server's database full or away) for its
Retry-After and asks again; a 500 is not retried (issue 13, finding 6)."""

import io
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from assets_app.operations.reference_worker import ReferenceWorker, WorkerConfig


class Server:
    """Answers POST /execution/workloads/claim from a script of (status, headers) answers."""

    def __init__(self, script):
        self.script = list(script)
        self.calls: list[float] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.calls.append(time.monotonic())
                status, headers = outer.script.pop(0) if outer.script else (200, {})
                body = json.dumps(
                    {"workloads": []} if status == 200 else {"detail": {"reason": "x"}}
                ).encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server_factory():
    servers = []

    def make(script):
        servers.append(Server(script))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def worker(url: str, **config) -> ReferenceWorker:
    return ReferenceWorker(
        WorkerConfig(url=url, api_key="k", hostname="h", **config), out=io.StringIO()
    )


def test_a_503_is_retried_after_its_retry_after(server_factory):
    server = server_factory([(503, {"Retry-After": "0.3"}), (503, {"Retry-After": "0.3"})])
    w = worker(server.url)
    assert w._claim(1) == []
    assert len(server.calls) == 3
    gaps = [b - a for a, b in zip(server.calls, server.calls[1:], strict=False)]
    assert all(0.3 <= gap < 1.0 for gap in gaps), gaps
    assert w.stats.unavailable == 2
    assert "503, retrying in" in w.out.getvalue()


def test_a_500_is_not_retried(server_factory):
    server = server_factory([(500, {})])
    w = worker(server.url)
    assert w._claim(1) == []
    assert len(server.calls) == 1
    assert w.stats.unavailable == 0


def test_503s_are_waited_out_for_a_bounded_time(server_factory):
    server = server_factory([(503, {"Retry-After": "0.2"})] * 50)
    w = worker(server.url, unavailable_max_seconds=0.5)
    started = time.monotonic()
    w._claim(1)  # gives up: the last 503 is what it reports
    assert time.monotonic() - started < 2
    assert 2 <= len(server.calls) <= 5
