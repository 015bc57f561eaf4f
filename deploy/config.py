"""Settings: one file (TOML or YAML) plus ``PERFTRACKER_*`` environment variables.

Each setting is declared once below (section, name, type, default, doc); its
environment variable is ``PERFTRACKER_<SECTION>_<NAME>`` in upper case, and the
environment wins over the file. Secrets (``Secret``) come from the environment
or from a file named by ``<name>_file`` and never appear in reprs or errors.
Nothing is read at import time: call :func:`load_settings` from ``main()``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, get_type_hints

from ..schemas.errors import ConfigError

ENV_PREFIX = "PERFTRACKER_"


class Secret:
    """A string that never prints itself."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __repr__(self) -> str:
        return "Secret('***')" if self._value else "Secret('')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True)
class KafkaSettings:
    bootstrap_servers: str = field(default="", metadata={"doc": "host:port list; empty = the embedded broker from `perftracker up`"})
    topic_prefix: str = field(default="pt", metadata={"doc": "prefix of every topic name"})
    partitions: int = field(default=8, metadata={"doc": "partitions of the keyed topics (created at start-up)"})
    security_protocol: str = field(default="PLAINTEXT", metadata={"doc": "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"})
    sasl_mechanism: str = field(default="", metadata={"doc": "e.g. PLAIN, SCRAM-SHA-512"})
    sasl_username: str = field(default="", metadata={"doc": "SASL user"})
    sasl_password: Secret = field(default_factory=lambda: Secret(""), metadata={"doc": "SASL password (env or *_file only)"})
    ssl_ca_location: str = field(default="", metadata={"doc": "CA bundle path for TLS"})
    profile: str = field(default="auto", metadata={"doc": "'tansu' (local broker quirks), 'kafka', or 'auto' (tansu when embedded)"})
    schema_registry_url: str = field(default="", metadata={"doc": "Confluent Schema Registry URL; empty = single-object encoding"})
    schema_registry_username: str = field(default="", metadata={"doc": "basic-auth user of the schema registry"})
    schema_registry_password: Secret = field(default_factory=lambda: Secret(""), metadata={"doc": "basic-auth password of the schema registry (env or *_file only)"})

    def client_conf(self) -> dict[str, str]:
        """librdkafka properties shared by producers, consumers and admin clients."""
        conf = {"bootstrap.servers": self.bootstrap_servers, "security.protocol": self.security_protocol}
        if self.sasl_mechanism:
            conf["sasl.mechanism"] = self.sasl_mechanism
            conf["sasl.username"] = self.sasl_username
            conf["sasl.password"] = self.sasl_password.reveal()
        if self.ssl_ca_location:
            conf["ssl.ca.location"] = self.ssl_ca_location
        return conf


@dataclass(frozen=True)
class StoreSettings:
    url: Secret = field(default_factory=lambda: Secret(""), metadata={"doc": "clickhouse://user:pass@host:8123/db or chdb:///dir; empty = chDB under data_dir"})
    retention_days: int = field(default=30, metadata={"doc": "TTL of raw per-window tables"})
    incident_retention_days: int = field(default=365, metadata={"doc": "TTL of anomalies and incidents"})
    flush_rows: int = field(default=50_000, metadata={"doc": "sink flushes when this many rows are buffered"})
    flush_interval_s: float = field(default=1.0, metadata={"doc": "... or after this long"})
    max_backlog_rows: int = field(default=2_000_000, metadata={"doc": "rows kept while the store is down; older ones are dropped and counted"})
    query_port: int = field(default=0, metadata={"doc": "port of the sink's local query API (chDB); 0 = any free port"})
    raw_ingest: bool = field(default=True, metadata={"doc": "let ClickHouse decode FunctionPattern and RankWindow (Avro + materialized views); false = decode in Python"})


@dataclass(frozen=True)
class StreamSettings:
    app_id: str = field(default="perftracker", metadata={"doc": "Faust app id (consumer group)"})
    window_s: float = field(default=5.0, metadata={"doc": "length of a comparison window in seconds"})
    window_grace_s: float = field(default=3.0, metadata={"doc": "wait this long past a window's end for late ranks"})
    web_port: int = field(default=6066, metadata={"doc": "Faust web port of a worker (0 = any free port)"})
    workers: int = field(default=1, metadata={"doc": "worker processes `perftracker up` starts"})


@dataclass(frozen=True)
class DetectionSettings:
    mad_threshold: float = field(default=5.0, metadata={"doc": "robust z (MAD units) a rank must exceed its peers by"})
    min_excess: float = field(default=0.10, metadata={"doc": "relative excess over the peer median"})
    min_cost_ms_per_step: float = field(default=1.0, metadata={"doc": "time a finding must cost per step"})
    persist_windows: int = field(default=2, metadata={"doc": "consecutive windows before a finding is raised"})
    clear_windows: int = field(default=2, metadata={"doc": "clean windows before it is resolved"})
    regression_pct: float = field(default=5.0, metadata={"doc": "recent mean step time above the recent best by this %"})
    hang_factor: float = field(default=5.0, metadata={"doc": "no iteration for this many typical steps is a hang"})
    hang_floor_s: float = field(default=30.0, metadata={"doc": "... and at least this many seconds"})
    peer_groups: str = field(default="", metadata={"doc": "override: 'name=0-7,16-23;other=8-15' assigns ranks to peer groups"})


@dataclass(frozen=True)
class AlertSettings:
    webhook_url: str = field(default="", metadata={"doc": "generic JSON webhook"})
    webhook_secret: Secret = field(default_factory=lambda: Secret(""), metadata={"doc": "HMAC-SHA256 key for the generic webhook"})
    slack_webhook_url: Secret = field(default_factory=lambda: Secret(""), metadata={"doc": "Slack incoming webhook URL (a secret)"})
    pagerduty_routing_key: Secret = field(default_factory=lambda: Secret(""), metadata={"doc": "PagerDuty Events v2 routing key"})
    pagerduty_url: str = field(default="https://events.pagerduty.com/v2/enqueue", metadata={"doc": "PagerDuty Events API endpoint"})
    dashboard_url: str = field(default="", metadata={"doc": "Grafana base URL linked from alerts"})
    min_impact_ms_per_step: float = field(default=0.0, metadata={"doc": "do not page below this cost"})
    update_interval_s: float = field(default=300.0, metadata={"doc": "at most one 'update' notification per incident per channel this often"})
    timeout_s: float = field(default=5.0, metadata={"doc": "HTTP timeout of one alert delivery attempt"})
    max_attempts: int = field(default=5, metadata={"doc": "delivery attempts per notification (exponential backoff with jitter between)"})
    retry_base_s: float = field(default=0.5, metadata={"doc": "first retry delay; doubles per attempt, capped at 30 s"})
    queue_size: int = field(default=1000, metadata={"doc": "notifications queued per channel; beyond, new ones are dropped and counted"})
    workers_per_channel: int = field(default=4, metadata={"doc": "parallel deliveries per channel (one hung incident never stalls the others)"})


@dataclass(frozen=True)
class Settings:
    data_dir: Path = field(default=Path(".perftracker"), metadata={"doc": "state, logs and chDB data of the embedded stack"})
    log_level: str = field(default="INFO", metadata={"doc": "DEBUG, INFO, WARNING, ERROR"})
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    streams: StreamSettings = field(default_factory=StreamSettings)
    detection: DetectionSettings = field(default_factory=DetectionSettings)
    alerts: AlertSettings = field(default_factory=AlertSettings)


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml
            data = yaml.safe_load(text) or {}
        else:
            import tomllib
            data = tomllib.loads(text)
    except Exception as exc:
        raise ConfigError(f"config file {path} is not valid {path.suffix.lstrip('.').upper() or 'TOML'}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a table of sections, got {type(data).__name__}")
    return data


def _coerce(value: Any, typ: Any, where: str) -> Any:
    if typ is Secret:
        return value if isinstance(value, Secret) else Secret(str(value))
    if typ is Path:
        return Path(str(value)).expanduser()
    if typ is bool:
        if isinstance(value, str):
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off", ""):
                return False
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return bool(value)
    try:
        return typ(value)
    except (TypeError, ValueError):
        shown = "***" if "password" in where or "secret" in where or "key" in where else repr(value)
        raise ConfigError(f"{where}: expected {typ.__name__}, got {shown}") from None


def _build(cls: type, section: str, file_values: Mapping[str, Any], env: Mapping[str, str]) -> Any:
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    for key in file_values:
        if key not in known and not (key.endswith("_file") and key[:-5] in known):
            raise ConfigError(f"unknown setting {section + '.' if section else ''}{key}; known: {sorted(known)}")
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        typ = hints[f.name]
        if isinstance(typ, type) and is_dataclass(typ):
            sub = file_values.get(f.name, {})
            if not isinstance(sub, Mapping):
                raise ConfigError(f"[{f.name}] must be a table")
            kwargs[f.name] = _build(typ, f.name, sub, env)
            continue
        where = f"{section}.{f.name}" if section else f.name
        env_name = ENV_PREFIX + (f"{section}_{f.name}" if section else f.name).upper()
        raw: Any = None
        if env_name in env:
            raw = env[env_name]
        elif env_name + "_FILE" in env:
            raw = _secret_file(env[env_name + "_FILE"], env_name + "_FILE")
        elif f.name in file_values:
            raw = file_values[f.name]
            if typ is Secret:
                raise ConfigError(f"{where} is a secret: set {env_name} or {f.name}_file, not the value in the file")
        elif f.name + "_file" in file_values:
            raw = _secret_file(file_values[f.name + "_file"], f"{where}_file")
        if raw is not None:
            kwargs[f.name] = _coerce(raw, typ, where)
    return cls(**kwargs)


def _secret_file(path: str, where: str) -> Secret:
    try:
        return Secret(Path(path).expanduser().read_text().strip())
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read secret file {path}: {exc.strerror}") from None


def default_config_path(env: Mapping[str, str]) -> Path | None:
    if ENV_PREFIX + "CONFIG" in env:
        return Path(env[ENV_PREFIX + "CONFIG"])
    for candidate in (Path("perftracker.toml"), Path("perftracker.yaml")):
        if candidate.exists():
            return candidate
    return None


def load_settings(path: Path | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Read ``path`` (or ``$PERFTRACKER_CONFIG``, or ./perftracker.toml|yaml) and the environment."""
    env = os.environ if env is None else env
    path = path or default_config_path(env)
    values = _read_file(path) if path else {}
    return _build(Settings, "", values, env)


def describe_settings() -> list[tuple[str, str, str, str]]:
    """(env variable, type, default, doc) for every setting, for `perftracker config --help`."""
    rows = []

    def walk(cls: type, section: str) -> None:
        hints = get_type_hints(cls)
        for f in fields(cls):
            typ = hints[f.name]
            if isinstance(typ, type) and is_dataclass(typ):
                walk(typ, f.name)
                continue
            default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
            env_name = ENV_PREFIX + (f"{section}_{f.name}" if section else f.name).upper()
            rows.append((env_name, typ.__name__, repr(default), f.metadata.get("doc", "")))

    walk(Settings, "")
    return rows
