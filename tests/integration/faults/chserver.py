"""A ClickHouse server for the store-outage test: the HTTP interface over chDB.

No ClickHouse server binary is installed here, and the sink's default store
(chDB) lives inside the sink process, so it cannot be taken away from it. This
process speaks enough of ClickHouse's HTTP protocol (queries with a ``FORMAT``,
``INSERT ... FORMAT <fmt>`` with the data in the body, ``{name:Type}`` parameters,
compressed request bodies, exception code header) for ``clickhouse-connect`` (the
sink's driver for ``clickhouse://`` stores) and runs every statement in chDB on a
data directory that outlives it. Stopping it and starting it again on the same
port is a ClickHouse server outage as the sink sees one: connections refused,
then the same data back.

    python -m tests.integration.faults.chserver --path DIR --port PORT
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import signal
import sys
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlparse

_INSERT = re.compile(rb"^\s*(INSERT\s+INTO\s+[^\n]*?)\s+FORMAT\s+(\w+)[ \t]*(?:\r?\n|$)", re.IGNORECASE)
_FORMAT = re.compile(r"\sFORMAT\s+\w+\s*;?\s*$", re.IGNORECASE)
_CODE = re.compile(r"Code:\s*(\d+)")


def _decompress(data: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if not data or encoding in ("", "identity"):
        return data
    if encoding == "gzip":
        return gzip.decompress(data)
    if encoding == "deflate":
        return zlib.decompress(data)
    if encoding == "lz4":
        import lz4.frame

        return bytes(lz4.frame.decompress(data))
    if encoding == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    if encoding == "br":
        import brotli  # type: ignore[import-not-found]

        return bytes(brotli.decompress(data))
    raise ValueError(f"unsupported Content-Encoding {encoding!r}")


class ChdbHttp:
    """One chDB connection behind a lock (chDB runs one statement at a time per connection)."""

    def __init__(self, path: str):
        import chdb

        self.conn = chdb.connect(path)
        self.lock = threading.Lock()

    def run(self, sql: str, data: bytes, default_format: str, params: dict[str, str]) -> tuple[bytes, int]:
        """Run one request; returns (response body, rows written)."""
        text = (sql.encode() + b"\n" + data) if sql and data else (sql.encode() or data)
        insert = _INSERT.match(text)
        with self.lock:
            if insert:
                rows = text[insert.end():]
                with self.conn.send_insert(insert.group(1).decode(), insert.group(2).decode()) as ins:
                    if rows:
                        ins.append(rows)
                    result = ins.finish()
                return b"", int(result.rows_written)
            sql = text.decode()
            fmt = default_format if not _FORMAT.search(sql) else "TabSeparated"
            res = self.conn.query(sql, fmt, params=params)
            out = res.bytes() if hasattr(res, "bytes") else bytes(res or b"")
            return out, 0

    def close(self) -> None:
        with self.lock:
            self.conn.close()


def make_handler(db: ChdbHttp) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802
            if urlparse(self.path).path in ("/ping", "/"):
                self._answer(200, b"Ok.\n")
                return
            self._handle(b"")

        def do_POST(self) -> None:  # noqa: N802
            body = self._body()
            try:
                body = _decompress(body, self.headers.get("Content-Encoding", ""))
            except Exception as exc:  # a test server: answer the error as ClickHouse would
                self._error(f"Code: 432. DB::Exception: {exc}")
                return
            self._handle(body)

        def _body(self) -> bytes:
            if "chunked" not in self.headers.get("Transfer-Encoding", "").lower():
                return self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
            parts = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return b"".join(parts)

        def _handle(self, body: bytes) -> None:
            args = dict(parse_qsl(urlparse(self.path).query, keep_blank_values=True))
            params = {k[len("param_"):]: v for k, v in args.items() if k.startswith("param_")}
            try:
                out, written = db.run(args.get("query", ""), body, args.get("default_format", "TabSeparated"),
                                      params)
            except Exception as exc:  # chDB's error text carries ClickHouse's "Code: N."
                self._error(str(exc))
                return
            summary = json.dumps({"read_rows": "0", "read_bytes": "0", "written_rows": str(written),
                                  "written_bytes": "0", "total_rows_to_read": "0", "result_rows": "0",
                                  "result_bytes": "0", "elapsed_ns": "0"})
            self._answer(200, out, {"X-ClickHouse-Summary": summary, "X-ClickHouse-Timezone": "UTC",
                                    "X-ClickHouse-Query-Id": args.get("query_id", "q")})

        def _error(self, text: str) -> None:
            code = _CODE.search(text)
            self._answer(500, text.encode(), {"X-ClickHouse-Exception-Code": code.group(1) if code else "1000"})

        def _answer(self, status: int, body: bytes, headers: dict[str, Any] | None = None) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, str(v))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", required=True)
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args(argv)
    db = ChdbHttp(args.path)
    httpd = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(db))
    httpd.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=httpd.shutdown).start())
    print(f"listening on 127.0.0.1:{args.port}", flush=True)
    try:
        httpd.serve_forever()
    finally:
        httpd.server_close()
        db.close()
    sys.exit(0)


if __name__ == "__main__":
    main()
