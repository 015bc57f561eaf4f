"""The store: a ClickHouse server or chDB, both through clickhouse-connect.

``Store`` is the only thing that talks to ClickHouse. It serializes calls with
a lock (chDB is an in-process engine shared by the sink and its query API
threads) and turns driver errors into :class:`StoreUnavailable` for writes,
so the sink can keep its batch and retry.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from ..schemas.redact import redact
from ..schemas.settings import Settings
from .errors import SinkError, StoreUnavailable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoreTarget:
    """Where the store is; ``password`` is only ever passed to the driver."""

    kind: str  # "chdb" or "server"
    path: str = ""  # chDB data directory
    host: str = ""
    port: int = 8123
    username: str = "default"
    password: str = ""
    database: str = "default"
    secure: bool = False

    def describe(self) -> str:
        """A printable location, never the password."""
        if self.kind == "chdb":
            return f"chdb://{self.path}"
        scheme = "https" if self.secure else "http"
        return f"{scheme}://{self.username}@{self.host}:{self.port}/{self.database}"


def parse_store_url(url: str, data_dir: Path) -> StoreTarget:
    """``chdb:///dir``, ``clickhouse[s]://user:pass@host:port/db?secure=1``, or '' (chDB in data_dir)."""
    if not url:
        return StoreTarget("chdb", path=str((data_dir / "chdb").resolve()))
    parsed = urlparse(url)
    if parsed.scheme == "chdb":
        path = parsed.path if not parsed.netloc else parsed.netloc + parsed.path
        if not path:
            raise SinkError("store url chdb:// needs a directory, e.g. chdb:///var/lib/perftracker/chdb")
        return StoreTarget("chdb", path=path)
    if parsed.scheme not in ("clickhouse", "clickhouses", "http", "https"):
        raise SinkError(f"store url scheme {parsed.scheme!r} is not supported; "
                        "use clickhouse://user:pass@host:8123/db or chdb:///dir")
    query = {k: v[0] for k, v in parse_qs(parsed.query).items()}
    secure = parsed.scheme in ("clickhouses", "https") or query.get("secure", "").lower() in ("1", "true")
    return StoreTarget(
        "server", host=parsed.hostname or "localhost",
        port=parsed.port or (8443 if secure else 8123),
        username=unquote(parsed.username or "default"), password=unquote(parsed.password or ""),
        database=(parsed.path.strip("/") or "default"), secure=secure)


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    rows: list[tuple]

    def dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


class Store:
    """A thread-safe handle on one ClickHouse database."""

    def __init__(self, target: StoreTarget, client: Any):
        self.target = target
        self._client = client
        self._lock = threading.Lock()

    @classmethod
    def open(cls, target: StoreTarget) -> Store:
        import clickhouse_connect

        try:
            if target.kind == "chdb":
                Path(target.path).mkdir(parents=True, exist_ok=True)
                client = clickhouse_connect.get_client(dsn=f"chdb://{target.path}")
            else:
                client = clickhouse_connect.get_client(
                    host=target.host, port=target.port, username=target.username,
                    password=target.password, database=target.database, secure=target.secure,
                    connect_timeout=5, send_receive_timeout=30)
        except Exception as exc:
            raise StoreUnavailable(f"cannot open store {target.describe()}: {_scrub(exc, target)}") from None
        return cls(target, client)

    @classmethod
    def from_settings(cls, settings: Settings) -> Store:
        return cls.open(parse_store_url(settings.store.url.reveal(), settings.data_dir))

    def command(self, sql: str, parameters: dict[str, Any] | None = None) -> Any:
        with self._lock:
            try:
                return self._client.command(sql, parameters=parameters)
            except Exception as exc:
                raise StoreUnavailable(f"store command failed: {_scrub(exc, self.target)}") from None

    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> QueryResult:
        with self._lock:
            try:
                res = self._client.query(sql, parameters=parameters)
            except Exception as exc:
                raise StoreUnavailable(f"store query failed: {_scrub(exc, self.target)}") from None
        return QueryResult(list(res.column_names), [tuple(r) for r in res.result_rows])

    def insert(self, table: str, columns: Sequence[str], data: Sequence[Sequence[Any]],
               column_oriented: bool = True) -> None:
        """Insert ``data`` (columns, or rows when ``column_oriented`` is False) into ``table``."""
        with self._lock:
            try:
                self._client.insert(table, data, column_names=list(columns),
                                    column_oriented=column_oriented)
            except Exception as exc:
                raise StoreUnavailable(f"insert into {table} failed: {_scrub(exc, self.target)}") from None

    def raw_insert(self, table: str, data: bytes, fmt: str) -> int:
        """``INSERT INTO table FORMAT fmt`` with ``data``; returns the rows ClickHouse read."""
        with self._lock:
            try:
                summary = self._client.raw_insert(table, None, data, fmt=fmt)
            except Exception as exc:
                raise StoreUnavailable(f"insert into {table} failed: {_scrub(exc, self.target)}") from None
        return int(getattr(summary, "written_rows", 0) or 0)

    def ping(self) -> bool:
        """True when the store answers a trivial query (tells a refused batch from a dead store)."""
        with self._lock:
            try:
                self._client.command("SELECT 1")
                return True
            except Exception:  # any failure means: not answering
                return False

    def close(self) -> None:
        with self._lock:
            try:
                self._client.close()
            except Exception as exc:  # closing twice or a dead connection
                log.debug("closing store: %s", exc)


def _scrub(exc: BaseException, target: StoreTarget) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return redact(text, target.password)[:500]
