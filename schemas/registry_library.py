"""The stream workers' and the sink's Schema Registry client: confluent-kafka's own.

The server side talks to the registry through ``confluent_kafka.schema_registry`` (the
``schemaregistry`` extra of confluent-kafka, in perftracker's ``server`` extra): its HTTP
client, retries, id and schema caches, basic auth, bearer tokens and TLS settings are the
library's, kept by the Kafka client's maintainers. The collectors inside training
processes keep :class:`~.registry.RegistryClient` (standard library only, two endpoints): a
training image gets no httpx, authlib or attrs from perftracker.

:class:`LibraryRegistryClient` has the surface the codecs use (``url``, ``register``,
``schema``) and the same errors: refused credentials and rejected requests are
:class:`~.registry.RegistryError`, a registry that cannot be reached or answers 5xx is
:class:`~.registry.RegistryUnavailable` (retry, never dead-letter), an id the registry does
not know is a :class:`~.errors.SchemaError` (the message is at fault). No message holds a
credential.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import SchemaError
from .registry import RegistryError, RegistryUnavailable, registry_endpoint

CREDENTIALS_HINT = "check kafka.schema_registry_username / PERFTRACKER_KAFKA_SCHEMA_REGISTRY_PASSWORD"


class LibraryRegistryClient:
    """``confluent_kafka.schema_registry.SchemaRegistryClient`` behind the codecs' client surface."""

    def __init__(self, url: str, username: str = "", password: Any = "", timeout_s: float = 10.0):
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self.url, user, secret = registry_endpoint(url, username, password)
        conf: dict[str, Any] = {"url": self.url, "timeout": timeout_s, "max.retries": 1}
        if user:
            conf["basic.auth.user.info"] = f"{user}:{secret}"
        self._auth = bool(user)
        self._client = SchemaRegistryClient(conf)

    def __repr__(self) -> str:
        return f"LibraryRegistryClient({self.url!r}, auth={'yes' if self._auth else 'no'})"

    def register(self, subject: str, schema: dict) -> int:
        """Id of ``schema`` under ``subject``, registering it when new (the library caches it)."""
        from confluent_kafka.schema_registry import Schema

        text = json.dumps(schema, separators=(",", ":"), sort_keys=True)
        where = f"POST {self.url}/subjects/{subject}/versions"
        try:
            schema_id = self._client.register_schema(subject, Schema(text, "AVRO"))
        except Exception as exc:  # noqa: BLE001 - the library raises its own and httpx's errors
            raise _error(where, exc) from None
        if not isinstance(schema_id, int):
            raise RegistryError(f"schema registry answered {schema_id!r} when registering under {subject}")
        return schema_id

    def schema(self, schema_id: int) -> dict:
        """Writer schema (parsed JSON) of ``schema_id`` (the library caches it)."""
        where = f"GET {self.url}/schemas/ids/{int(schema_id)}"
        try:
            found = self._client.get_schema(int(schema_id))
        except Exception as exc:  # noqa: BLE001
            err = _error(where, exc)
            if isinstance(err, RegistryUnavailable):
                raise err from None
            raise SchemaError(f"schema id {schema_id} unknown to the registry: {err}") from None
        try:
            parsed = json.loads(found.schema_str or "")
        except (TypeError, ValueError):
            raise SchemaError(f"registry schema id {schema_id} is not an Avro schema") from None
        if not isinstance(parsed, dict):
            raise SchemaError(f"registry schema id {schema_id} does not describe a record")
        return parsed


def _error(where: str, exc: Exception) -> RegistryError:
    """The library's or its HTTP client's exception as one of ours (never the credentials)."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    if isinstance(exc, SchemaRegistryError):
        code = int(exc.http_status_code or 0)
        if code in (401, 403):
            return RegistryError(f"schema registry refused the credentials ({where}: HTTP {code}); {CREDENTIALS_HINT}")
        if code >= 500 or code <= 0:
            return RegistryUnavailable(f"schema registry error ({where}: HTTP {code} {exc.error_message})".strip())
        return RegistryError(f"schema registry rejected {where}: HTTP {code} {exc.error_message}".strip())
    return RegistryUnavailable(f"schema registry unreachable ({where}): {type(exc).__name__}")
