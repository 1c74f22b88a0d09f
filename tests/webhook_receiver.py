"""A local webhook receiver for tests (issue 29): a real HTTP server on 127.0.0.1 in a thread
(or a process, `serve_forever_to`), which records every request and answers by a plan."""

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    at: float
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def message_id(self) -> str:
        return self.headers["webhook-id"]

    def json(self):
        return json.loads(self.body)


# (the request, how many requests came before it) -> (status, extra headers)
Plan = Callable[[Received, int], tuple[int, dict[str, str]]]


def always(status: int) -> Plan:
    return lambda request, n: (status, {})


@dataclass
class Receiver:
    plan: Plan = field(default_factory=lambda: always(200))
    delay: float = 0.0
    received: list[Received] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("content-length") or 0)
                request = Received(
                    at=time.time(),
                    path=self.path,
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=self.rfile.read(length),
                )
                with receiver._lock:
                    n = len(receiver.received)
                    receiver.received.append(request)
                if receiver.delay:
                    time.sleep(receiver.delay)
                status, headers = receiver.plan(request, n)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "Receiver":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
