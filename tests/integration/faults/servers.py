"""Servers the sink talks to, which a test can take down and bring back on the same port."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from perftracker_ml.deploy.tansu import free_port, port_open

from ..sinks.receiver import Received
from ..waiting import wait_for

REPO = Path(__file__).resolve().parents[3]


class Webhook:
    """A real HTTP receiver on a fixed port: while stopped, connections are refused."""

    def __init__(self) -> None:
        self.port = free_port()
        self.received: list[Received] = []  # answered 200, in arrival order
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> Webhook:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with outer._lock:
                    outer.received.append(Received(self.path, dict(self.headers), body, time.monotonic()))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None


class ClickHouseServer:
    """:mod:`.chserver` (ClickHouse's HTTP interface over chDB) as its own process on a fixed port."""

    def __init__(self, path: Path, log: Path):
        self.path, self.log = path, log
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"clickhouse://default@127.0.0.1:{self.port}/default"

    def start(self) -> ClickHouseServer:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.integration.faults.chserver", "--path", str(self.path),
                 "--port", str(self.port)], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL)
        wait_for(lambda: port_open("127.0.0.1", self.port) or self.proc.poll() is not None, 60)
        assert self.proc.poll() is None, self.log.read_text()[-2000:]
        return self

    def stop(self) -> None:
        """A clean server stop: the statement in progress finishes, then connections are refused."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
