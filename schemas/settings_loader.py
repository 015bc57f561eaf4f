"""Load the settings of :mod:`.settings` from one file (TOML or YAML) and ``PERFTRACKER_*``.

Each field's environment variable is ``PERFTRACKER_<SECTION>_<NAME>``; the
environment wins over the file. Nothing is read at import time: call
:func:`load_settings` from ``main()`` (or :func:`load_section` for one section,
as ``attach()`` does) and pass the result down.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, TypeVar, get_type_hints

from .errors import ConfigError
from .redact import remember_secret
from .settings import Secret, Settings
from .settings_checks import check_settings

ENV_PREFIX = "PERFTRACKER_"

T = TypeVar("T")


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
        secret = value if isinstance(value, Secret) else Secret(str(value))
        remember_secret(secret.reveal())  # masked in every log and error from now on
        return secret
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


def env_name(section: str, name: str) -> str:
    """``PERFTRACKER_<SECTION>_<NAME>`` (``PERFTRACKER_<NAME>`` at the top level)."""
    return ENV_PREFIX + (f"{section}_{name}" if section else name).upper()


def load_section(cls: type[T], section: str, env: Mapping[str, str],
                 file_values: Mapping[str, Any] | None = None) -> T:
    """One settings dataclass from its ``[section]`` table of the file and the environment."""
    file_values = file_values or {}
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    for key in file_values:
        if key not in known and not (key.endswith("_file") and key[:-5] in known):
            raise ConfigError(f"unknown setting {section + '.' if section else ''}{key}; known: {sorted(known)}")
    kwargs: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        typ = hints[f.name]
        if isinstance(typ, type) and is_dataclass(typ):
            sub = file_values.get(f.name, {})
            if sub and "env_only" in f.metadata:
                raise ConfigError(f"[{f.name}] cannot be set in the config file: {f.metadata['env_only']}")
            if not isinstance(sub, Mapping):
                raise ConfigError(f"[{f.name}] must be a table")
            kwargs[f.name] = load_section(typ, f.name, env, sub)
            continue
        raw = _raw_value(f.name, typ, section, file_values, env)
        if f.metadata.get("pairs") and isinstance(raw, Mapping):  # a table of properties in the file
            raw = ";".join(f"{k}={_pair_value(v)}" for k, v in raw.items())
        if raw is not None:
            kwargs[f.name] = _coerce(raw, typ, f"{section}.{f.name}" if section else f.name)
    return cls(**kwargs)


def _raw_value(name: str, typ: Any, section: str, file_values: Mapping[str, Any],
               env: Mapping[str, str]) -> Any:
    """The environment's value, else the file's, else None (the default applies)."""
    where = f"{section}.{name}" if section else name
    var = env_name(section, name)
    if var in env:
        return env[var]
    if var + "_FILE" in env:
        return _secret_file(env[var + "_FILE"], var + "_FILE")
    if name in file_values:
        if typ is Secret:
            raise ConfigError(f"{where} is a secret: set {var} or {name}_file, not the value in the file")
        return file_values[name]
    if name + "_file" in file_values:
        return _secret_file(file_values[name + "_file"], f"{where}_file")
    return None


def _pair_value(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _secret_file(path: str, where: str) -> Secret:
    try:
        return Secret(Path(path).expanduser().read_text().strip())
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read secret file {path}: {exc.strerror}") from None


def section_env(values: Any, section: str) -> dict[str, str]:
    """The ``PERFTRACKER_<SECTION>_*`` variables that reproduce the non-default fields of the
    settings dataclass ``values`` (secrets revealed: for a child process's environment only)."""
    out = {}
    for f in fields(values):
        value = getattr(values, f.name)
        default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
        if value == default:
            continue
        if isinstance(value, Secret):
            value = value.reveal()
        elif isinstance(value, bool):
            value = "true" if value else "false"
        out[env_name(section, f.name)] = str(value)
    return out


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
    settings = load_section(Settings, "", env, values)
    check_settings(settings)
    return settings


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
            rows.append((env_name(section, f.name), typ.__name__, repr(default), f.metadata.get("doc", "")))

    walk(Settings, "")
    return rows
