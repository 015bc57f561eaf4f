"""A narrow fake of a Confluent Schema Registry, for tests.

The registry is an external service (Confluent Schema Registry, Apicurio, Redpanda's
built-in one) that cannot be installed here, so tests run a *narrow fake* of it:
a real ``http.server`` on 127.0.0.1 in a thread that implements exactly the two
endpoints the codecs use (``POST /subjects/{subject}/versions``, ``GET /schemas/ids/{id}``),
stores schemas in a dict, and checks basic auth (``USER``/``PASSWORD``). ``up = False``
answers 503 to everything (a registry that is away).
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

USER, PASSWORD = "svc-perftracker", "s3cr3t-pw"


class FakeRegistry(BaseHTTPRequestHandler):
    schemas: dict[int, str] = {}
    subjects: dict[str, list[int]] = {}
    calls: list[str] = []
    need_auth = True
    up = True
    password = PASSWORD

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        if not self.up:
            self._send(503, {"error_code": 50301, "message": "away"})
            return False
        expected = "Basic " + base64.b64encode(f"{USER}:{self.password}".encode()).decode()
        if self.need_auth and self.headers.get("Authorization") != expected:
            self._send(401, {"error_code": 40101, "message": "Unauthorized"})
            return False
        return True

    @property
    def route(self) -> str:
        """The path without its query string (clients add options such as ``?normalize=false``,
        which the real registry accepts)."""
        return self.path.partition("?")[0]

    def do_POST(self):
        type(self).calls.append(f"POST {self.route}")
        if not self._authorized():
            return
        parts = self.route.strip("/").split("/")
        if len(parts) != 3 or parts[0] != "subjects" or parts[2] != "versions":
            return self._send(404, {"error_code": 404, "message": "HTTP 404 Not Found"})
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        text = body["schema"]
        json.loads(text)  # must be valid JSON
        for sid, known in list(self.schemas.items()):  # noqa: B007 (sid kept on break)
            if json.loads(known) == json.loads(text):
                break
        else:
            sid = len(self.schemas) + 1
            self.schemas[sid] = text
        self.subjects.setdefault(parts[1], []).append(sid)
        self._send(200, {"id": sid})

    def do_GET(self):
        type(self).calls.append(f"GET {self.route}")
        if not self._authorized():
            return
        parts = self.route.strip("/").split("/")
        if len(parts) == 3 and parts[:2] == ["schemas", "ids"] and int(parts[2]) in self.schemas:
            return self._send(200, {"schema": self.schemas[int(parts[2])]})
        self._send(404, {"error_code": 40403, "message": "Schema not found"})


def serve_registry() -> tuple[ThreadingHTTPServer, str]:
    """A fresh fake registry (empty, auth required, up) in a thread; (server, its URL)."""
    FakeRegistry.schemas, FakeRegistry.subjects, FakeRegistry.calls = {}, {}, []
    FakeRegistry.need_auth, FakeRegistry.up, FakeRegistry.password = True, True, PASSWORD
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeRegistry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture()
def registry() -> Iterator[str]:
    server, url = serve_registry()
    yield url
    server.shutdown()
    server.server_close()
