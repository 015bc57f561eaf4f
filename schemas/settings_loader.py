"""Load the settings of :mod:`.settings` from one file (TOML or YAML) and ``PERFTRACKER_*``.

Each field's environment variable is ``PERFTRACKER_<SECTION>_<NAME>``; the
environment wins over the file. Nothing is read at import time: call
:func:`load_settings` from ``main()`` (or :func:`load_section` for one section,
as ``attach()`` does) and pass the result down.

Every value is checked against the range declared beside its field (metadata
``ge``/``gt``/``le``/``lt``); an error names the setting, the value, where it
came from and the allowed range. :func:`load_settings_with_sources` also says
where each value came from (`perftracker config`). :func:`unknown_env_problems`
finds ``PERFTRACKER_*`` variables that are no setting (a misspelling), with the
closest valid name. With ``warn`` (the collectors, inside a training process), a
bad value is reported through ``warn`` and the field keeps its default instead
of raising.
"""

from __future__ import annotations

import difflib
import math
import operator
import os
from collections.abc import Callable, Mapping
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, TypeVar, get_type_hints

from .errors import ConfigError
from .redact import remember_secret
from .settings import Secret, Settings
from .settings_checks import check_settings

ENV_PREFIX = "PERFTRACKER_"

# PERFTRACKER_* variables that are not settings but are read on purpose (never "unknown"):
# the config file's path, the Grafana tooling's, the launcher's hand-over to its training
# processes, and the demo's, tests' and benchmarks' own
NOT_SETTINGS = frozenset({
    "PERFTRACKER_CONFIG",
    "PERFTRACKER_GRAFANA_TOKEN", "PERFTRACKER_GRAFANA_WEBHOOK_URL", "PERFTRACKER_RUNBOOK_URL",
    "PERFTRACKER_COLLECTOR_ATTACH", "PERFTRACKER_COLLECTOR_LAUNCHER_PID",
    "PERFTRACKER_COLLECTOR_ATTACHED_PID", "PERFTRACKER_COLLECTOR_PROVISIONAL_JOB",
    "PERFTRACKER_TEST_ARTIFACTS", "PERFTRACKER_DLRM_TRACES", "PERFTRACKER_GPU_CHECK_PATH",
    "PERFTRACKER_VERSION",
})
NOT_SETTINGS_PREFIXES = ("PERFTRACKER_DEMO_",)  # the demo's fault injection (deploy/demo)

Warn = Callable[[str], None]

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


def _coerce(value: Any, typ: Any, where: str, source: str = "") -> Any:
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
            raise ConfigError(f"{where}: expected true/false, got {value!r}{_from(source)}")
        return bool(value)
    try:
        return typ(value)
    except (TypeError, ValueError):
        shown = "***" if "password" in where or "secret" in where or "key" in where else repr(value)
        raise ConfigError(f"{where}: expected {typ.__name__}, got {shown}{_from(source)}") from None


def _from(source: str) -> str:
    """`` (from <source>)`` for an error that already names the setting: a file source's
    ``(section.key)`` suffix (shown by `perftracker config`) left out."""
    if source.startswith("file ") and source.endswith(")") and " (" in source:
        source = source[:source.rindex(" (")]
    return f" (from {source})" if source else ""


BOUNDS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
_COMPARE = {"ge": operator.ge, "gt": operator.gt, "le": operator.le, "lt": operator.lt}


def allowed_range(metadata: Mapping[str, Any]) -> str:
    """The range declared in a field's metadata, in words: ``>= 1``, ``0..65535``, '' if none."""
    if "ge" in metadata and "le" in metadata:
        return f"{metadata['ge']}..{metadata['le']}"
    return " and ".join(f"{op} {metadata[key]}" for key, op in BOUNDS if key in metadata)


def range_problem(value: Any, metadata: Mapping[str, Any]) -> str | None:
    """Why ``value`` is outside its field's declared range, or None (no range, or inside)."""
    allowed = allowed_range(metadata)
    if not allowed or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    inside = math.isfinite(value) and all(op(value, metadata[key]) for key, op in _COMPARE.items()
                                          if key in metadata)
    return None if inside else f"allowed: {allowed}"


def env_name(section: str, name: str) -> str:
    """``PERFTRACKER_<SECTION>_<NAME>`` (``PERFTRACKER_<NAME>`` at the top level)."""
    return ENV_PREFIX + (f"{section}_{name}" if section else name).upper()


def load_section(cls: type[T], section: str, env: Mapping[str, str],
                 file_values: Mapping[str, Any] | None = None, *, sources: dict[str, str] | None = None,
                 warn: Warn | None = None, file_label: str = "the config file") -> T:
    """One settings dataclass from its ``[section]`` table of the file and the environment.

    ``sources`` (when given) receives ``{"section.name": where the value came from}`` for every
    field ("default", the environment variable, or the file); with ``warn``, a value that
    cannot be used is reported there and the field keeps its default (never raises for it)."""
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
            kwargs[f.name] = load_section(typ, f.name, env, sub, sources=sources, warn=warn,
                                          file_label=file_label)
            continue
        where = f"{section}.{f.name}" if section else f.name
        try:
            value, source = _field_value(f, typ, section, where, file_values, env, file_label)
        except ConfigError as exc:
            if warn is None:
                raise
            warn(f"{exc}; using the default, {_shown_default(f)}")
            value, source = None, None
        if value is not None:
            kwargs[f.name] = value
        if sources is not None:
            sources[where] = source or "default"
    return cls(**kwargs)


def _field_value(f: Any, typ: Any, section: str, where: str, file_values: Mapping[str, Any],
                 env: Mapping[str, str], file_label: str) -> tuple[Any, str | None]:
    """The field's checked value and its source, or (None, None) when the default applies."""
    raw, source = _raw_value(f.name, typ, section, file_values, env, file_label)
    if raw is None:
        return None, None
    if f.metadata.get("pairs") and isinstance(raw, Mapping):  # a table of properties in the file
        raw = ";".join(f"{k}={_pair_value(v)}" for k, v in raw.items())
    value = _coerce(raw, typ, where, source or "")
    problem = range_problem(value, f.metadata)
    if problem:
        raise ConfigError(f"{where} = {value} (from {source}) is out of range; {problem}")
    return value, source


def _shown_default(f: Any) -> str:
    default = f.default_factory() if callable(f.default_factory) else f.default
    return show_value(default) if not isinstance(default, Secret) else "empty"


def show_value(value: Any) -> str:
    """A setting's value as a person writes it (no Python reprs); secrets masked."""
    if isinstance(value, Secret):
        return "********" if value else ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _raw_value(name: str, typ: Any, section: str, file_values: Mapping[str, Any],
               env: Mapping[str, str], file_label: str = "the config file") -> tuple[Any, str | None]:
    """The environment's value, else the file's, else None (the default applies); with its source."""
    where = f"{section}.{name}" if section else name
    var = env_name(section, name)
    if var in env:
        return env[var], var
    if var + "_FILE" in env:
        return _secret_file(env[var + "_FILE"], var + "_FILE"), var + "_FILE"
    if name in file_values:
        if typ is Secret:
            raise ConfigError(f"{where} is a secret: set {var} or {name}_file, not the value in the file")
        return file_values[name], f"{file_label} ({where})"
    if name + "_file" in file_values:
        return (_secret_file(file_values[name + "_file"], f"{where}_file"),
                f"{file_label} ({where}_file)")
    return None, None


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


def load_settings(path: Path | None = None, env: Mapping[str, str] | None = None,
                  warn: Warn | None = None) -> Settings:
    """Read ``path`` (or ``$PERFTRACKER_CONFIG``, or ./perftracker.toml|yaml) and the environment."""
    return load_settings_with_sources(path, env, warn)[0]


def load_settings_with_sources(path: Path | None = None, env: Mapping[str, str] | None = None,
                               warn: Warn | None = None) -> tuple[Settings, dict[str, str]]:
    """:func:`load_settings` and, per setting (``"streams.workers"``), where its value came from:
    ``default``, the environment variable's name, or ``file PATH (section.name)``."""
    env = os.environ if env is None else env
    path = path or default_config_path(env)
    values = _read_file(path) if path else {}
    sources: dict[str, str] = {}
    settings = load_section(Settings, "", env, values, sources=sources, warn=warn,
                            file_label=f"file {path}")
    check_settings(settings)
    return settings, sources


def setting_env_names() -> set[str]:
    """Every ``PERFTRACKER_*`` variable the loader reads (with its ``*_FILE`` form)."""
    names = {row[0] for row in describe_settings()}
    return names | {name + "_FILE" for name in names}


def unknown_env_problems(env: Mapping[str, str], prefix: str = ENV_PREFIX) -> list[str]:
    """One line per ``PERFTRACKER_*`` variable of ``env`` (those starting with ``prefix``) that is
    neither a setting nor in :data:`NOT_SETTINGS`, naming the closest valid one."""
    valid = setting_env_names()
    problems = []
    for name in sorted(env):
        if not name.startswith(prefix) or name in valid or name in NOT_SETTINGS \
                or name.startswith(NOT_SETTINGS_PREFIXES):
            continue
        close = difflib.get_close_matches(name, sorted(valid | NOT_SETTINGS), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else "; `perftracker config` lists the settings"
        problems.append(f"unknown environment variable {name}{hint}")
    return problems


def check_env_names(env: Mapping[str, str] | None = None) -> None:
    """Refuse (:class:`ConfigError`) a ``PERFTRACKER_*`` variable that is no setting: a
    misspelt name would otherwise be silently ignored (a misspelt file key is refused too)."""
    problems = unknown_env_problems(os.environ if env is None else env)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ConfigError(problems[0] + more)


def describe_settings() -> list[tuple[str, str, str, str]]:
    """(env variable, type, default, doc) for every setting."""
    return [(row["env"], row["type"], row["default"], row["doc"]) for row in setting_rows()]


def setting_rows(settings: Settings | None = None, sources: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """One row per setting: ``setting`` (section.name), ``env``, ``type``, ``default``, ``value``
    (of ``settings``, else the default; as written, secrets masked), ``source``, ``range``, ``doc``."""
    rows: list[dict[str, Any]] = []

    def walk(cls: type, section: str, values: Any) -> None:
        hints = get_type_hints(cls)
        for f in fields(cls):
            typ = hints[f.name]
            if isinstance(typ, type) and is_dataclass(typ):
                walk(typ, f.name, getattr(values, f.name) if values is not None else None)
                continue
            default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
            where = f"{section}.{f.name}" if section else f.name
            value = getattr(values, f.name) if values is not None else default
            rows.append({"setting": where, "env": env_name(section, f.name), "type": typ.__name__,
                         "default": show_value(default), "value": show_value(value),
                         "source": (sources or {}).get(where, "default"),
                         "range": allowed_range(f.metadata), "doc": f.metadata.get("doc", "")})

    walk(Settings, "", settings)
    return rows
