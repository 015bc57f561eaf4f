"""Load the settings of :mod:`.settings` from one file (TOML or YAML) and ``PERFTRACKER_*``.

Each field's environment variable is ``PERFTRACKER_<SECTION>_<NAME>``; the
environment wins over the file. Nothing is read at import time: call
:func:`load_settings` from ``main()`` and pass the result down.

Two readers share this module's pieces: where a value may come from (the file's
tables checked and flattened, ``*_FILE`` and ``<name>_file`` secrets read), the
sources column of `perftracker config`, the unknown-variable check and the
settings' rows. The servers (the command line, the stream workers, the sink)
validate through pydantic-settings (:mod:`.settings_model`, the server extra);
the collectors read the ``collector`` and ``kafka`` sections with
:func:`load_section`, standard library only, inside training processes, where a
bad value is reported through ``warn`` and the field keeps its default. On the
slim collector install (no pydantic) :func:`load_settings` falls back to the
standard-library reader, raising as the server's does.

Every value is checked against the range declared beside its field (metadata
``ge``/``gt``/``le``/``lt``); an error names the setting, the value, where it
came from and the allowed range. :func:`unknown_env_problems` finds
``PERFTRACKER_*`` variables that are no setting (a misspelling), with the closest
valid name.
"""

from __future__ import annotations

import difflib
import functools
import math
import operator
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import Field, fields, is_dataclass
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
# a setting ("section.name", "name" at the top level) -> (its raw value, where it came from)
Layer = dict[str, tuple[Any, str]]

T = TypeVar("T")


# --- the declaration, walked ---------------------------------------------------------------

@functools.cache
def declared(cls: type) -> tuple[tuple[Field, Any], ...]:
    """``(field, type)`` of each field of the settings dataclass ``cls``, types resolved."""
    hints = get_type_hints(cls)
    return tuple((f, hints[f.name]) for f in fields(cls))


def is_section(typ: Any) -> bool:
    return isinstance(typ, type) and is_dataclass(typ)


def leaves(cls: type = Settings, section: str = "") -> Iterator[tuple[str, str, Field, Any]]:
    """``(section, where, field, type)`` of every setting below ``cls`` (sections walked)."""
    for f, typ in declared(cls):
        if is_section(typ):
            yield from leaves(typ, f.name)
        else:
            yield section, f"{section}.{f.name}" if section else f.name, f, typ


def default_of(f: Field) -> Any:
    return f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]


def env_name(section: str, name: str) -> str:
    """``PERFTRACKER_<SECTION>_<NAME>`` (``PERFTRACKER_<NAME>`` at the top level)."""
    return ENV_PREFIX + (f"{section}_{name}" if section else name).upper()


BOUNDS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
_COMPARE = {"ge": operator.ge, "gt": operator.gt, "le": operator.le, "lt": operator.lt}


def allowed_range(metadata: Mapping[str, Any]) -> str:
    """The range declared in a field's metadata, in words: ``>= 1``, ``0..65535``, '' if none."""
    if "ge" in metadata and "le" in metadata:
        return f"{metadata['ge']}..{metadata['le']}"
    return " and ".join(f"{op} {metadata[key]}" for key, op in BOUNDS if key in metadata)


# --- where values come from (both readers) -------------------------------------------------

def default_config_path(env: Mapping[str, str]) -> Path | None:
    if ENV_PREFIX + "CONFIG" in env:
        return Path(env[ENV_PREFIX + "CONFIG"])
    for candidate in (Path("perftracker.toml"), Path("perftracker.yaml")):
        if candidate.exists():
            return candidate
    return None


def read_config_file(path: Path) -> dict[str, Any]:
    """The file's tables, parsed (TOML, or YAML for ``.yaml``/``.yml``)."""
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


def file_layer(table: Mapping[str, Any], label: str, cls: type = Settings, section: str = "",
               warn: Warn | None = None) -> Layer:
    """The settings the file's ``table`` (of section ``cls``) sets, with their source ``label
    (section.name)``. Refused here, whichever reader follows: a key that is no setting, a
    section that is not a table or is ``env_only``, a secret's value (``<name>_file`` names a
    file holding it, read here); a ``pairs`` table becomes ``'k=v;k2=v2'``."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"[{section}] must be a table")
    known = {f.name for f, _ in declared(cls)}
    for key in table:
        if key not in known and not (key.endswith("_file") and key[:-5] in known):
            raise ConfigError(f"unknown setting {section + '.' if section else ''}{key}; known: {sorted(known)}")
    layer: Layer = {}
    for f, typ in declared(cls):
        if is_section(typ):
            sub = table.get(f.name, {})
            if sub and "env_only" in f.metadata:
                raise ConfigError(f"[{f.name}] cannot be set in the config file: {f.metadata['env_only']}")
            layer |= file_layer(sub, label, typ, f.name, warn)
            continue
        where = f"{section}.{f.name}" if section else f.name
        if f.name in table:
            if typ is Secret:
                raise ConfigError(f"{where} is a secret: set {env_name(section, f.name)} or {f.name}_file, "
                                  "not the value in the file")
            raw = table[f.name]
            if f.metadata.get("pairs") and isinstance(raw, Mapping):  # a table of properties
                raw = ";".join(f"{k}={_pair_value(v)}" for k, v in raw.items())
            layer[where] = (raw, f"{label} ({where})")
        elif f.name + "_file" in table:
            _read_into(layer, where, f, table[f.name + "_file"], f"{where}_file", f"{label} ({where}_file)", warn)
    return layer


def env_file_layer(env: Mapping[str, str], cls: type = Settings, section: str = "",
                   warn: Warn | None = None) -> Layer:
    """The settings given as a file to read, ``PERFTRACKER_<SECTION>_<NAME>_FILE`` (secrets
    mounted as files), read; the source is the variable's name."""
    layer: Layer = {}
    for sub, where, f, _ in leaves(cls, section):
        var = env_name(sub, f.name) + "_FILE"
        if var in env:
            _read_into(layer, where, f, env[var], var, var, warn)
    return layer


def _read_into(layer: Layer, where: str, f: Field, path: str, named: str, source: str,
               warn: Warn | None) -> None:
    try:
        layer[where] = (Path(path).expanduser().read_text().strip(), source)
    except OSError as exc:
        problem = f"{named}: cannot read secret file {path}: {exc.strerror}"
        if warn is None:
            raise ConfigError(problem) from None
        warn(f"{problem}; using the default, {_shown_default(f)}")


def _pair_value(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def sourced_from(source: str) -> str:
    """`` (from <source>)`` for an error that already names the setting: a file source's
    ``(section.key)`` suffix (shown by `perftracker config`) left out."""
    if source.startswith("file ") and source.endswith(")") and " (" in source:
        source = source[:source.rindex(" (")]
    return f" (from {source})" if source else ""


def type_problem(where: str, typ: Any, raw: Any, source: str) -> str:
    """The one line for a value that is not of its setting's type (a secret-looking one masked)."""
    if typ is bool:
        return f"{where}: expected true/false, got {raw!r}{sourced_from(source)}"
    shown = "***" if "password" in where or "secret" in where or "key" in where else repr(raw)
    return f"{where}: expected {typ.__name__}, got {shown}{sourced_from(source)}"


def range_problem_line(where: str, value: Any, metadata: Mapping[str, Any], source: str) -> str:
    """The one line for a value outside its setting's declared range."""
    return f"{where} = {value} (from {source}) is out of range; allowed: {allowed_range(metadata)}"


# a boolean setting's words (pydantic's, and the empty string: unset, as a shell writes it)
TRUE_WORDS = frozenset({"1", "true", "t", "yes", "y", "on"})
FALSE_WORDS = frozenset({"0", "false", "f", "no", "n", "off", ""})


def secret_value(value: Any) -> Secret:
    """A secret setting's value, remembered: masked in every log and error from now on."""
    secret = value if isinstance(value, Secret) else Secret(str(value))
    remember_secret(secret.reveal())
    return secret


# --- the standard-library reader (the collectors; the slim install's command line) ---------

def _coerce(value: Any, typ: Any, where: str, source: str) -> Any:
    if typ is Secret:
        return secret_value(value)
    if typ is Path:
        return Path(str(value)).expanduser()
    if typ is bool:
        if isinstance(value, str):
            if value.lower() in TRUE_WORDS:
                return True
            if value.lower() in FALSE_WORDS:
                return False
            raise ConfigError(type_problem(where, typ, value, source))
        return bool(value)
    try:
        return typ(value)
    except (TypeError, ValueError):
        raise ConfigError(type_problem(where, typ, value, source)) from None


def out_of_range(value: Any, metadata: Mapping[str, Any]) -> bool:
    """Whether ``value`` is outside its field's declared range (not finite counts as outside)."""
    if not allowed_range(metadata) or isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return not (math.isfinite(value) and all(op(value, metadata[key]) for key, op in _COMPARE.items()
                                             if key in metadata))


def env_layer(env: Mapping[str, str], cls: type = Settings, section: str = "") -> Layer:
    """The settings the environment sets by name (the servers leave this to pydantic-settings)."""
    return {where: (env[var], var) for sub, where, f, _ in leaves(cls, section)
            if (var := env_name(sub, f.name)) in env}


def load_section(cls: type[T], section: str, env: Mapping[str, str],
                 file_values: Mapping[str, Any] | None = None, *, sources: dict[str, str] | None = None,
                 warn: Warn | None = None, file_label: str = "the config file") -> T:
    """One settings dataclass from its ``[section]`` table of the file and the environment,
    standard library only.

    ``sources`` (when given) receives ``{"section.name": where the value came from}`` for every
    field ("default", the environment variable, or the file); with ``warn``, a value that
    cannot be used is reported there and the field keeps its default (never raises for it)."""
    layers = (env_layer(env, cls, section), env_file_layer(env, cls, section, warn),
              file_layer(file_values or {}, file_label, cls, section, warn))
    return _build(cls, section, layers, sources, warn)


def _build(cls: type, section: str, layers: tuple[Layer, ...], sources: dict[str, str] | None,
           warn: Warn | None) -> Any:
    kwargs: dict[str, Any] = {}
    for f, typ in declared(cls):
        if is_section(typ):
            kwargs[f.name] = _build(typ, f.name, layers, sources, warn)
            continue
        where = f"{section}.{f.name}" if section else f.name
        raw, source = next((layer[where] for layer in layers if where in layer), (None, "default"))
        try:
            if raw is not None:
                kwargs[f.name] = _checked(raw, typ, f, where, source)
        except ConfigError as exc:
            if warn is None:
                raise
            warn(f"{exc}; using the default, {_shown_default(f)}")
            raw = None
        if sources is not None:
            sources[where] = source if raw is not None else "default"
    return cls(**kwargs)


def _checked(raw: Any, typ: Any, f: Field, where: str, source: str) -> Any:
    value = _coerce(raw, typ, where, source)
    if out_of_range(value, f.metadata):
        raise ConfigError(range_problem_line(where, value, f.metadata, source))
    return value


def read_settings(path: Path | None = None, env: Mapping[str, str] | None = None,
                  warn: Warn | None = None) -> tuple[Settings, dict[str, str]]:
    """:func:`load_settings_with_sources` with the standard-library reader: the collectors'
    (with ``warn``) and the slim install's command line (without pydantic)."""
    env = os.environ if env is None else env
    path = path or default_config_path(env)
    sources: dict[str, str] = {}
    settings = load_section(Settings, "", env, read_config_file(path) if path else {}, sources=sources,
                            warn=warn, file_label=f"file {path}")
    check_settings(settings)
    return settings, sources


# --- the servers' entry points -------------------------------------------------------------

def load_settings(path: Path | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Read ``path`` (or ``$PERFTRACKER_CONFIG``, or ./perftracker.toml|yaml) and the environment."""
    return load_settings_with_sources(path, env)[0]


def load_settings_with_sources(path: Path | None = None, env: Mapping[str, str] | None = None,
                               ) -> tuple[Settings, dict[str, str]]:
    """:func:`load_settings` and, per setting (``"streams.workers"``), where its value came from:
    ``default``, the environment variable's name, or ``file PATH (section.name)``.

    Validated by pydantic-settings (:mod:`.settings_model`) where the server extra is
    installed; the slim collector install (no pydantic-settings, or a training image's
    pydantic 1) reads them with :func:`read_settings`."""
    try:
        from .settings_model import load_with_sources
    except ImportError as exc:
        if (exc.name or "").split(".")[0] not in ("pydantic", "pydantic_settings", "pydantic_core"):
            raise
        return read_settings(path, env)
    return load_with_sources(path, env)


# --- the settings as rows, as variables, and the unknown ones ------------------------------

def _shown_default(f: Field) -> str:
    default = default_of(f)
    return show_value(default) if not isinstance(default, Secret) else "empty"


def show_value(value: Any) -> str:
    """A setting's value as a person writes it (no Python reprs); secrets masked."""
    if isinstance(value, Secret):
        return "********" if value else ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def section_env(values: Any, section: str) -> dict[str, str]:
    """The ``PERFTRACKER_<SECTION>_*`` variables that reproduce the non-default fields of the
    settings dataclass ``values`` (secrets revealed: for a child process's environment only)."""
    out = {}
    for f in fields(values):
        value = getattr(values, f.name)
        if value == default_of(f):
            continue
        if isinstance(value, Secret):
            value = value.reveal()
        elif isinstance(value, bool):
            value = "true" if value else "false"
        out[env_name(section, f.name)] = str(value)
    return out


@functools.cache
def value_env_names() -> frozenset[str]:
    """Every setting's own variable, ``PERFTRACKER_<SECTION>_<NAME>`` (no ``*_FILE`` form)."""
    return frozenset(env_name(section, f.name) for section, _, f, _ in leaves())


def setting_env_names() -> frozenset[str]:
    """Every ``PERFTRACKER_*`` variable the loader reads (with its ``*_FILE`` form)."""
    names = value_env_names()
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
    rows = []
    for section, where, f, typ in leaves():
        default = default_of(f)
        values = getattr(settings, section) if settings is not None and section else settings
        value = getattr(values, f.name) if values is not None else default
        rows.append({"setting": where, "env": env_name(section, f.name), "type": typ.__name__,
                     "default": show_value(default), "value": show_value(value),
                     "source": (sources or {}).get(where, "default"),
                     "range": allowed_range(f.metadata), "doc": f.metadata.get("doc", "")})
    return rows
