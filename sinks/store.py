"""The store: a ClickHouse server or chDB, both through clickhouse-connect.

``Store`` is the only thing that talks to ClickHouse. It serializes calls with
a lock (chDB is an in-process engine shared by the sink and its query API
threads) and turns driver errors into :class:`StoreUnavailable` for writes,
so the sink can keep its batch and retry, except errors the rows themselves
cause (:func:`rejects_rows`), which become :class:`RowsRejected`.
"""

from __future__ import annotations

import logging
import re
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from ..schemas.redact import redact
from ..schemas.settings import Settings, StoreSettings
from .errors import RowsRejected, SinkError, StoreUnavailable, StoreUrlError
from .identifiers import ident

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoreTarget:
    """Where the store is; ``password`` is only ever passed to the driver (never in a repr)."""

    kind: str  # "chdb" or "server"
    path: str = ""  # chDB data directory
    host: str = ""
    port: int = 8123
    username: str = "default"
    password: str = field(default="", repr=False)
    database: str = "default"
    secure: bool = False
    ca_file: str = ""  # CA bundle the server certificate is checked against ('' = the system's)
    verify: bool = True

    def describe(self) -> str:
        """A printable location, never the password."""
        if self.kind == "chdb":
            return f"chdb://{self.path}"
        scheme = "https" if self.secure else "http"
        return f"{scheme}://{self.username}@{self.host}:{self.port}/{self.database}"


_URL_OPTIONS = ("secure",)
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def parse_store_url(url: str, data_dir: Path, store: StoreSettings | None = None) -> StoreTarget:
    """``chdb:///dir``, ``clickhouse[s]://user:pass@host:port/db?secure=true``, or '' (chDB in data_dir).

    With ``store`` settings, ``store.username``/``store.password`` win over the URL's and
    ``store.ca_file``/``store.verify`` apply to TLS. Errors never show the URL's password."""
    if not url:
        return StoreTarget("chdb", path=str((data_dir / "chdb").resolve()))
    try:
        parsed = urlparse(url)
        port = parsed.port
    except ValueError:
        raise StoreUrlError("store.url is malformed (a port must be a number, an IPv6 host in [...]; "
                        "a password with @ / : # ? percent-encoded, or in PERFTRACKER_STORE_PASSWORD)") from None
    if "://" not in url:
        raise StoreUrlError("store.url has no scheme; use clickhouse://user@host:8123/db, "
                            "clickhouses://... (TLS) or chdb:///dir")
    if parsed.scheme == "chdb":
        path = parsed.path if not parsed.netloc else parsed.netloc + parsed.path
        if not path:
            raise StoreUrlError("store url chdb:// needs a directory, e.g. chdb:///var/lib/perftracker/chdb")
        return StoreTarget("chdb", path=path)
    if parsed.scheme not in ("clickhouse", "clickhouses", "http", "https"):
        raise StoreUrlError(f"store url scheme {parsed.scheme!r} is not supported; "
                        "use clickhouse://user@host:8123/db, clickhouses://... (TLS) or chdb:///dir")
    query = {k: v[0] for k, v in parse_qs(parsed.query, keep_blank_values=True).items()}
    unknown = sorted(set(query) - set(_URL_OPTIONS))
    if unknown or query.get("secure", "").lower() not in (*_TRUE, *_FALSE):
        raise StoreUrlError(f"store url options {unknown or ['secure']} not understood; the one option is "
                        "secure=true|false (user and password: store.username, PERFTRACKER_STORE_PASSWORD)")
    secure = parsed.scheme in ("clickhouses", "https") or query.get("secure", "").lower() in _TRUE
    store = store or StoreSettings()
    return StoreTarget(
        "server", host=parsed.hostname or "localhost", port=port or (8443 if secure else 8123),
        username=store.username or unquote(parsed.username or "default"),
        password=store.password.reveal() or unquote(parsed.password or ""),
        database=(parsed.path.strip("/") or "default"), secure=secure, ca_file=store.ca_file,
        verify=store.verify)


def store_target(settings: Settings) -> StoreTarget:
    """The store the settings name (``store.url`` with the ``store.*`` credentials and TLS settings)."""
    return parse_store_url(settings.store.url.reveal(), settings.data_dir, settings.store)


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
                    verify=target.verify, ca_cert=target.ca_file or None,
                    connect_timeout=5, send_receive_timeout=30)
        except Exception as exc:
            raise StoreUnavailable(f"cannot open store {target.describe()}: {_scrub(exc, target)}") from None
        return cls(target, client)

    @classmethod
    def from_settings(cls, settings: Settings) -> Store:
        return cls.open(store_target(settings))

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
        for name in (table, *columns):
            ident(name)
        with self._lock:
            try:
                self._client.insert(table, data, column_names=list(columns),
                                    column_oriented=column_oriented)
            except Exception as exc:
                raise _insert_error(table, exc, self.target) from None

    def raw_insert(self, table: str, data: bytes, fmt: str) -> int:
        """``INSERT INTO table FORMAT fmt`` with ``data``; returns the rows ClickHouse read."""
        for name in (table, fmt):
            ident(name)
        with self._lock:
            try:
                summary = self._client.raw_insert(table, None, data, fmt=fmt)
            except Exception as exc:
                raise _insert_error(table, exc, self.target) from None
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


# ClickHouse error codes caused by the inserted values, never by the store's state: parsing and
# conversion (6, 26, 27, 38, 41, 53, 69, 70, 72, 117), array sizes (128, 190), string size (131),
# out of range (321), throwIf (395), violated constraint (469). Anything else (network, timeouts,
# memory, too many parts, missing tables, permissions) keeps the batch for a retry.
DATA_ERROR_CODES = frozenset({6, 26, 27, 38, 41, 53, 69, 70, 72, 117, 128, 131, 190, 321, 395, 469})
_CODE = re.compile(r"\bCode: (\d+)")


def rejects_rows(exc: BaseException) -> bool:
    """True when ``exc`` (raised by an insert) is about the rows, so retrying them cannot help:
    the driver could not serialize a value for its column (a negative number into a UInt32,
    text into a number), or ClickHouse answered with a data error code."""
    from clickhouse_connect.driver.exceptions import DataError

    if isinstance(exc, (DataError, ValueError, TypeError, OverflowError, struct.error)):
        return True
    code = getattr(exc, "code", None)
    if not isinstance(code, int):
        found = _CODE.search(str(exc))
        code = int(found.group(1)) if found else None
    return code in DATA_ERROR_CODES


def _insert_error(table: str, exc: BaseException, target: StoreTarget) -> SinkError:
    message = f"insert into {table} failed: {_scrub(exc, target)}"
    return RowsRejected(message) if rejects_rows(exc) else StoreUnavailable(message)


def _scrub(exc: BaseException, target: StoreTarget) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return redact(text, target.password)[:500]
