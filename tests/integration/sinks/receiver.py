"""A real local HTTP server that records what it receives; behaviour per request is pluggable."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float

    def json(self) -> dict:
        return json.loads(self.body)


class Receiver:
    """``behave(request, attempt_number) -> HTTP status`` (it may sleep to play a hung server)."""

    def __init__(self, behave: Callable[[Received, int], int] | None = None):
        self.behave = behave or (lambda r, n: 200)
        self.received: list[Received] = []  # answered 2xx
        self.attempts: list[Received] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                r = Received(self.path, dict(self.headers), body, time.monotonic())
                with outer._lock:
                    outer.attempts.append(r)
                    n = len(outer.attempts)
                status = outer.behave(r, n)
                if 200 <= status < 300:
                    with outer._lock:
                        outer.received.append(r)
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
