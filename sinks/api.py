"""The sink's query API: other processes read chDB through it.

It binds ``store.query_host`` (default 127.0.0.1); any other address needs the
``http_token`` setting, and with a token every request must carry
``Authorization: Bearer <token>`` (else 401), see :mod:`perftracker_ml.schemas.http_auth`.

``GET /health`` -> ``{"ok": true, "stats": {...}}``;
``GET /metrics`` -> the sink's counters in Prometheus' text format;
``GET /query/<name>?param=value`` -> ``{"columns": [...], "rows": [[...], ...]}``
for the named queries of :mod:`.queries` (datetimes as ISO 8601 strings);
``POST /store`` (a body of :func:`.keep.encode_records`: records made outside the
stream workers, e.g. an imported trace) -> ``{"records": n, "rows_written": n, ...}``,
written into the store the sink owns.
Errors answer ``{"error": "..."}`` with 400 (bad name, parameters or body), 413 or 503.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable
from datetime import date, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote, urlparse

from ..schemas.errors import SchemaError
from ..schemas.http_auth import authorized, check_bind
from ..schemas.settings import Secret
from .errors import SinkError, StoreUnavailable, UnknownQuery
from .queries import run_query
from .store import Store

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 512 << 20  # POST /store (an imported job's records)


def to_json_value(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, (list, tuple)):
        return [to_json_value(v) for v in value]
    return value


class QueryServer:
    """Serves the named queries of one :class:`Store` in a background thread."""

    def __init__(self, store: Store, port: int = 0, stats: Callable[[], dict] | None = None,
                 metrics: Callable[[], tuple[bytes, str]] | None = None,
                 host: str = "127.0.0.1", token: Secret | None = None,
                 keep: Callable[[bytes], dict] | None = None):
        self.token = token or Secret("")
        self.keep = keep  # POST /store: the body's records into the store (None: not offered)
        check_bind(host, self.token, "store.query_host")
        self.store = store
        self._stats = stats or dict
        self.metrics = metrics
        self._host = host
        handler = type("Handler", (_Handler,), {"server_ref": self})
        server = _ServerV6 if ":" in host else ThreadingHTTPServer
        self._httpd = server((host.strip("[]"), port), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="pt-query-api", daemon=True)

    @property
    def url(self) -> str:
        """Where a client on this machine reaches the API (loopback for a wildcard bind)."""
        port = self._httpd.server_address[1]
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "[::1]"}.get(self._host, self._host)
        return f"http://{f'[{host}]' if ':' in host and not host.startswith('[') else host}:{port}"

    def start(self) -> QueryServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def answer(self, path: str, query: str) -> tuple[int, dict]:
        if path == "/health":
            return 200, {"ok": True, "stats": self._stats()}
        if not path.startswith("/query/"):
            return 404, {"error": f"no such endpoint {path!r}; use /health, /metrics or /query/<name>"}
        name = unquote(path[len("/query/"):])
        try:
            res = run_query(self.store, name, dict(parse_qsl(query, keep_blank_values=True)))
        except UnknownQuery as exc:
            return 400, {"error": str(exc)}
        except StoreUnavailable as exc:
            return 503, {"error": str(exc)}
        return 200, {"columns": res.columns, "rows": [to_json_value(list(r)) for r in res.rows]}

    def store_posted(self, path: str, body: bytes) -> tuple[int, dict]:
        """``POST /store``: the records in ``body`` written into the store."""
        if path != "/store" or self.keep is None:
            return 404, {"error": f"no such endpoint {path!r} for POST; use /store"}
        try:
            return 200, self.keep(body)
        except StoreUnavailable as exc:
            return 503, {"error": str(exc)}
        except (SchemaError, SinkError) as exc:
            return 400, {"error": str(exc)}


class _ServerV6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def _unauthorized() -> tuple[int, bytes, str]:
    body = {"error": "missing or wrong bearer token (Authorization: Bearer <http_token>)"}
    return 401, json.dumps(body).encode(), "application/json"


class _Handler(BaseHTTPRequestHandler):
    server_ref: QueryServer

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        parsed = urlparse(self.path)
        metrics = self.server_ref.metrics
        if not authorized(self.headers.get("Authorization"), self.server_ref.token):
            self._reply(*_unauthorized())
        elif parsed.path == "/metrics" and metrics is not None:
            self._reply(200, *metrics())
        else:
            status, body = self.server_ref.answer(parsed.path, parsed.query)
            self._reply(status, json.dumps(body).encode(), "application/json")

    def do_POST(self) -> None:  # noqa: N802 (http.server naming)
        if not authorized(self.headers.get("Authorization"), self.server_ref.token):
            self._reply(*_unauthorized())
            return
        try:
            length = int(self.headers.get("Content-Length") or "-1")
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY_BYTES:
            self.close_connection = True  # the body (if any) is not read
            status, body = (413 if length > MAX_BODY_BYTES else 411), {
                "error": f"a body of 0..{MAX_BODY_BYTES} bytes with its Content-Length is needed"}
        else:
            status, body = self.server_ref.store_posted(urlparse(self.path).path, self.rfile.read(length))
        self._reply(status, json.dumps(body).encode(), "application/json")

    def _reply(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if status == 401:
            self.send_header("WWW-Authenticate", "Bearer")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        log.debug("query api: " + format, *args)
