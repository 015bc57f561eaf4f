"""Confluent Schema Registry framing: ``00`` + 4-byte big-endian schema id + Avro body.

When ``kafka.schema_registry_url`` is set, producers (collectors: EventBatch, HardwareBatch;
workers: FunctionPattern, RankWindow, FunctionComparison, Anomaly, Control) encode with the
Confluent wire format: the writer schema (this package's latest version of the record) is
registered under the subject ``<topic>-value`` (``POST /subjects/{subject}/versions``, which
returns the existing id when the schema is already there), or ``<topic>-<record name>`` on a
topic that carries several record types (pt.findings), and its id goes in the header.
Consumers (workers, the sink, the collectors' control follower) accept both framings: ``00`` +
id (the writer schema is fetched once with ``GET /schemas/ids/{id}``, names the record, and is
resolved against the reader's schema with Avro schema resolution) and ``C3 01``
single-object encoding (handled by :class:`~.codec.Codec`).

Ids and schemas are cached for the life of the process (registry ids are immutable).
Basic-auth credentials come from ``kafka.schema_registry_username`` and the secret
``kafka.schema_registry_password`` (or the URL's user-info); they never appear in an
error message. The collectors' :class:`RegistryClient` talks HTTP with the standard library
(``urllib``); the stream workers and the sink use confluent-kafka's client
(:mod:`.registry_library`, ``registry_client(settings, server=True)``).

Errors: bytes that do not decode (unknown magic, id unknown to the registry, a schema of
another record) raise :class:`~.errors.SchemaError`, so stream workers dead-letter them;
a registry that cannot be reached raises :class:`RegistryUnavailable` (not the message's
fault: retry, do not dead-letter).
"""

from __future__ import annotations

import base64
import io
import json
import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Protocol

import fastavro
from fastavro.schema import parse_schema

from .codec import Codec, MultiCodec, SchemaSet, SchemaVersion, _fingerprint_of, confluent_frame
from .errors import PerftrackerError, SchemaError
from .vocabulary import (
    CONFLUENT_HEADER_LEN,
    CONFLUENT_MAGIC,
    SINGLE_OBJECT_HEADER_LEN,
    SINGLE_OBJECT_MAGIC,
)

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"

__all__ = ["Registry", "RegistryClient", "RegistryCodec", "RegistryError", "RegistryMultiCodec", "RegistryUnavailable",
           "codec_for", "confluent_frame", "multi_codec_for", "registry_client", "subject_for"]


class RegistryError(PerftrackerError):
    """The schema registry refused a request (message says which and why, never the credentials)."""


class RegistryUnavailable(RegistryError):
    """The schema registry could not be reached; the message is not at fault."""


def subject_for(topic: str) -> str:
    """TopicNameStrategy subject of a topic's values."""
    return f"{topic}-value"


def _split_credentials(url: str) -> tuple[str, str, str]:
    """``https://u:p@host/x`` -> (``https://host/x``, u, p)."""
    parts = urllib.parse.urlsplit(url)
    if not parts.username:
        return url.rstrip("/"), "", ""
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    clean = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return clean.rstrip("/"), urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password or "")


def registry_endpoint(url: str, username: str = "", password: Any = "") -> tuple[str, str, str]:
    """(URL without credentials, user, password) of a registry: the settings' user and password
    (a :class:`~.settings.Secret` or text) first, else the URL's user-info; a URL that is not
    http(s) is refused."""
    clean, url_user, url_password = _split_credentials(url)
    if not clean.startswith(("http://", "https://")):
        raise RegistryError(f"schema registry URL must start with http:// or https://, got {clean!r}")
    secret = password.reveal() if hasattr(password, "reveal") else str(password or "")
    return clean, username or url_user, secret or url_password


class Registry(Protocol):
    """What the codecs need of a registry client: this module's :class:`RegistryClient` (the
    collectors) or :class:`.registry_library.LibraryRegistryClient` (workers and the sink)."""

    url: str

    def register(self, subject: str, schema: dict) -> int: ...

    def schema(self, schema_id: int) -> dict: ...


class RegistryClient:
    """Minimal, thread-safe client of the registry REST API with an id/schema cache."""

    def __init__(self, url: str, username: str = "", password: Any = "", timeout_s: float = 10.0):
        self.url, user, secret = registry_endpoint(url, username, password)
        self._auth = ("Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode()) if user else ""
        self.timeout_s = timeout_s
        self._ids: dict[tuple[str, str], int] = {}
        self._schemas: dict[int, dict] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RegistryClient({self.url!r}, auth={'yes' if self._auth else 'no'})"

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Accept", CONTENT_TYPE)
        if data is not None:
            req.add_header("Content-Type", CONTENT_TYPE)
        if self._auth:
            req.add_header("Authorization", self._auth)
        where = f"{method} {self.url}{path}"
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            raise _http_error(where, exc) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RegistryUnavailable(f"schema registry unreachable ({where}): {reason}") from None
        except ValueError as exc:
            raise RegistryError(f"schema registry sent a non-JSON answer to {where}: {exc}") from None

    def register(self, subject: str, schema: dict) -> int:
        """Id of ``schema`` under ``subject``, registering it when new (cached)."""
        text = json.dumps(schema, separators=(",", ":"), sort_keys=True)
        key = (subject, text)
        with self._lock:
            if key in self._ids:
                return self._ids[key]
        answer = self._request("POST", f"/subjects/{urllib.parse.quote(subject, safe='')}/versions",
                               {"schema": text})
        if not isinstance(answer.get("id"), int):
            raise RegistryError(f"schema registry answered {answer!r} when registering under {subject}")
        with self._lock:
            self._ids[key] = answer["id"]
            self._schemas.setdefault(answer["id"], schema)
        return answer["id"]

    def schema(self, schema_id: int) -> dict:
        """Writer schema (parsed JSON) of ``schema_id`` (cached)."""
        with self._lock:
            if schema_id in self._schemas:
                return self._schemas[schema_id]
        try:
            answer = self._request("GET", f"/schemas/ids/{int(schema_id)}")
        except RegistryError as exc:
            if isinstance(exc, RegistryUnavailable):
                raise
            raise SchemaError(f"schema id {schema_id} unknown to the registry: {exc}") from None
        try:
            schema = json.loads(answer["schema"])
        except (KeyError, TypeError, ValueError):
            raise SchemaError(f"registry schema id {schema_id} is not an Avro schema: {answer!r:.200}") from None
        with self._lock:
            self._schemas[schema_id] = schema
        return schema


def _http_error(where: str, exc: urllib.error.HTTPError) -> RegistryError:
    try:
        detail = json.loads(exc.read() or b"{}").get("message", "")
    except (ValueError, AttributeError, OSError):
        detail = ""
    if exc.code in (401, 403):
        return RegistryError(f"schema registry refused the credentials ({where}: HTTP {exc.code}); "
                             "check kafka.schema_registry_username / PERFTRACKER_KAFKA_SCHEMA_REGISTRY_PASSWORD")
    if exc.code >= 500:
        return RegistryUnavailable(f"schema registry error ({where}: HTTP {exc.code} {detail})".strip())
    return RegistryError(f"schema registry rejected {where}: HTTP {exc.code} {detail}".strip())


class RegistryCodec:
    """Encode one record type with Confluent framing; decode Confluent or single-object framing.

    Same ``name``/``version``/``encode``/``decode`` surface as :class:`~.codec.Codec`."""

    def __init__(self, name: str, topic: str, client: Registry, schemas: SchemaSet | None = None):
        self.inner = Codec(name, schemas)
        self.name, self.topic, self.client = name, topic, client
        self.subject = subject_for(topic)
        self._readers: dict[int, Any] = {}
        self._known: dict[int, SchemaVersion] = {}  # schema id -> the bundled version it is

    @property
    def version(self) -> int:
        return self.inner.version

    @property
    def schema_id(self) -> int:
        return self.client.register(self.subject, self.inner.writer.raw)

    def encode(self, record: dict) -> bytes:
        body = self.inner.encode(record)[SINGLE_OBJECT_HEADER_LEN:]
        return confluent_frame(self.schema_id, body)

    def decode(self, data: bytes) -> dict:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise SchemaError(f"expected bytes, got {type(data).__name__}")
        data = bytes(data)
        if data.startswith(SINGLE_OBJECT_MAGIC):
            return self.inner.decode(data)
        if len(data) < CONFLUENT_HEADER_LEN or not data.startswith(CONFLUENT_MAGIC):
            raise SchemaError(f"neither Confluent (00 + schema id) nor single-object (c301) framing "
                              f"(first bytes {data[:4].hex() or 'empty'})")
        schema_id = int.from_bytes(data[len(CONFLUENT_MAGIC):CONFLUENT_HEADER_LEN], "big")
        writer = self._writer(schema_id)
        body = io.BytesIO(data[CONFLUENT_HEADER_LEN:])
        known = self._known.get(schema_id)
        try:
            if known is not None:  # a bundled version: resolved as the single-object path does
                return self.inner.read(body, known)
            record = fastavro.schemaless_reader(body, writer, self.inner.writer.parsed)
        except Exception as exc:  # fastavro raises several types
            raise SchemaError(f"corrupt {self.name} body (registry schema id {schema_id}): {exc}") from exc
        if not isinstance(record, dict):
            raise SchemaError(f"registry schema id {schema_id} does not describe a record")
        return self.inner.unpacked(record, self.inner.version)

    def _writer(self, schema_id: int) -> Any:
        parsed = self._readers.get(schema_id)
        if parsed is not None:
            return parsed
        raw = self.client.schema(schema_id)
        known = self.inner.schemas.by_fingerprint(_fingerprint_of(raw)) if isinstance(raw, dict) else None
        if known is not None:
            if known.name != self.name:
                raise SchemaError(f"registry schema id {schema_id} is a {known.name} record, expected {self.name}")
            parsed = known.parsed
            self._known[schema_id] = known
        else:
            if not isinstance(raw, dict) or raw.get("name") != self.name:
                got = raw.get("name") if isinstance(raw, dict) else type(raw).__name__
                raise SchemaError(f"registry schema id {schema_id} is a {got} record, expected {self.name}")
            try:
                parsed = parse_schema(raw, _write_hint=False)
            except Exception as exc:
                raise SchemaError(f"registry schema id {schema_id} does not parse: {exc}") from exc
        self._readers[schema_id] = parsed
        return parsed


def schema_id_of(data: Any) -> int | None:
    """The schema id of a Confluent-framed message; None for any other bytes."""
    if isinstance(data, (bytes, bytearray)) and len(data) >= CONFLUENT_HEADER_LEN \
            and data[:len(CONFLUENT_MAGIC)] == CONFLUENT_MAGIC:
        return int.from_bytes(data[len(CONFLUENT_MAGIC):CONFLUENT_HEADER_LEN], "big")
    return None


def fetch_writer(client: Registry | None, data: Any) -> None:
    """Fetch (and cache) the writer schema a Confluent-framed ``data`` names, so that decoding it
    needs no registry round trip. Raises :class:`RegistryUnavailable` while the registry is away
    (a consumer waits and retries: the message is not at fault); an unknown id is left to decoding."""
    schema_id = schema_id_of(data) if client is not None else None
    if schema_id is not None:
        try:
            client.schema(schema_id)  # type: ignore[union-attr]
        except SchemaError:
            pass


def registry_client(settings: Any, server: bool = False) -> Registry | None:
    """One client (and id cache) for every codec of a process; None without ``kafka.schema_registry_url``.

    ``settings``: a :class:`~.settings.Settings` (or anything with a ``kafka`` section, or the section).
    ``server``: a stream worker or the sink, which talk to the registry through confluent-kafka's
    own client (:mod:`.registry_library`, the ``server`` extra); the collectors keep this module's."""
    kafka = getattr(settings, "kafka", settings)
    url = getattr(kafka, "schema_registry_url", "") or ""
    if not url:
        return None
    user, password = getattr(kafka, "schema_registry_username", ""), getattr(kafka, "schema_registry_password", "")
    if server:
        from .registry_library import LibraryRegistryClient
        return LibraryRegistryClient(url, user, password)
    return RegistryClient(url, user, password)


def codec_for(settings: Any, record_name: str, topic: str, client: Registry | None = None,
              schemas: SchemaSet | None = None) -> Codec | RegistryCodec:
    """The codec a producer/consumer of ``topic`` should use under ``settings``.

    ``settings``: a :class:`~.settings.Settings` (or its ``KafkaSettings``). Without a registry URL
    this is the plain single-object :class:`~.codec.Codec`."""
    client = client or registry_client(settings)
    if client is None:
        return Codec(record_name, schemas)
    return RegistryCodec(record_name, topic, client, schemas)


class RegistryMultiCodec(MultiCodec):
    """A topic that carries several record types (pt.findings) or a consumer of several topics, with a
    registry: encodes with Confluent framing under the subject ``<topic>-<record name>`` (one subject
    per record type: a topic's single ``-value`` subject cannot hold two record schemas), and decodes
    both framings, the schema id naming the record (its writer schema comes from the registry)."""

    def __init__(self, names: list[str], topic: str, client: Registry, schemas: SchemaSet | None = None):
        super().__init__(names, schemas)
        self.client = client
        self.registry_codecs = {n: RegistryCodec(n, topic, client, schemas) for n in names}
        for codec in self.registry_codecs.values():
            codec.subject = f"{topic}-{codec.name}"

    def encode(self, name: str, record: dict) -> bytes:
        return self.registry_codecs[name].encode(record)

    def decode(self, data: bytes) -> tuple[str, dict]:
        data = bytes(data) if isinstance(data, (bytearray, memoryview)) else data
        if not isinstance(data, bytes) or not data.startswith(CONFLUENT_MAGIC) or len(data) < CONFLUENT_HEADER_LEN:
            return super().decode(data)
        name = self.record_name(int.from_bytes(data[len(CONFLUENT_MAGIC):CONFLUENT_HEADER_LEN], "big"))
        if name not in self.registry_codecs:
            raise SchemaError(f"message holds a {name} record, expected one of {sorted(self.registry_codecs)}")
        return name, self.registry_codecs[name].decode(data)

    def record_name(self, schema_id: int) -> str:
        """The short record name of a registry schema id (``perftracker.v1.RankWindow`` -> ``RankWindow``)."""
        raw = self.client.schema(schema_id)
        name = raw.get("name") if isinstance(raw, dict) else None
        if not isinstance(name, str):
            raise SchemaError(f"registry schema id {schema_id} does not describe a record")
        return name.rpartition(".")[2]

    def register_all(self) -> None:
        """Register every writer schema now (a producer that must not fail later, on a record)."""
        for codec in self.registry_codecs.values():
            codec.schema_id  # noqa: B018 (registers and caches the id)


def multi_codec_for(settings: Any, names: list[str], topic: str, client: Registry | None = None,
                    schemas: SchemaSet | None = None) -> MultiCodec:
    """:class:`~.codec.MultiCodec`, or :class:`RegistryMultiCodec` when a registry is configured."""
    client = client or registry_client(settings)
    if client is None:
        return MultiCodec(names, schemas)
    return RegistryMultiCodec(names, topic, client, schemas)
