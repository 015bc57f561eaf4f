"""The servers' settings through pydantic-settings, derived from the one declaration.

The pydantic models are generated from the dataclasses of :mod:`.settings` (never
declared a second time): one model per section, fields with the dataclass's
type and default, its metadata range as ``Field(ge=..., gt=..., le=..., lt=...)``
(floats finite), :class:`~.settings.Secret` validated into itself (remembered for
masking), paths with ``~`` expanded. The top-level :class:`BaseSettings` reads,
highest first:

* the environment, by pydantic-settings' own :class:`EnvSettingsSource`:
  prefix ``PERFTRACKER_``, a section's fields below ``PERFTRACKER_<SECTION>_``
  (nested delimiter ``_``, split once: names keep their underscores), given the
  settings' own variables only (a ``PERFTRACKER_*`` one that is no setting is
  :func:`.settings_loader.check_env_names`' to refuse, naming the closest);
* ``PERFTRACKER_<SECTION>_<NAME>_FILE``, files read, and
* the config file's tables, as init sources: both prepared by the pieces
  :mod:`.settings_loader` shares with the collectors' reader
  (:func:`~.settings_loader.env_file_layer`, :func:`~.settings_loader.file_layer`:
  unknown keys, secrets' values and the ``env_only`` section refused there);
* the defaults.

Validated, the values become the same frozen dataclasses every caller uses,
with, per setting, where its value came from (`perftracker config`). A pydantic
:class:`ValidationError` becomes one :class:`ConfigError` line naming the
setting, the value (a secret's never) and its source, worded as the collectors'
reader words it. Importing this module imports pydantic: only
:func:`.settings_loader.load_settings_with_sources` does, so a training process
never does.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    create_model,
)
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from .errors import ConfigError
from .settings import Secret, Settings
from .settings_checks import check_settings
from .settings_loader import (
    ENV_PREFIX,
    Layer,
    declared,
    default_config_path,
    env_file_layer,
    env_layer,
    file_layer,
    is_section,
    leaves,
    range_problem_line,
    read_config_file,
    secret_value,
    type_problem,
    value_env_names,
)

RANGE_ERRORS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number"})
SECTION_CONFIG = ConfigDict(extra="forbid", coerce_numbers_to_str=True)


# --- the models, generated ----------------------------------------------------------------

def _annotation(typ: Any, metadata: Mapping[str, Any]) -> Any:
    if typ is Secret:
        return Annotated[Secret, PlainValidator(_secret)]
    if typ is Path:
        return Annotated[Path, AfterValidator(Path.expanduser)]
    if typ is bool:  # pydantic's words, and an empty variable for false as the collectors read it
        return Annotated[bool, BeforeValidator(lambda value: False if value == "" else value)]
    bounds = {key: metadata[key] for key in ("ge", "gt", "le", "lt") if key in metadata}
    if typ is float:
        bounds["allow_inf_nan"] = False
    return Annotated[typ, Field(**bounds)] if bounds else typ


def _secret(value: Any) -> Secret:
    if not isinstance(value, str | Secret):
        raise ValueError("a secret is a string")
    return secret_value(value)


def _fields(cls: type) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f, typ in declared(cls):
        if is_section(typ):
            model = _section_model(typ)
            out[f.name] = (model, Field(default_factory=model))
        elif callable(f.default_factory):
            out[f.name] = (_annotation(typ, f.metadata), Field(default_factory=f.default_factory))
        else:
            out[f.name] = (_annotation(typ, f.metadata), f.default)
    return out


@functools.cache
def _section_model(cls: type) -> type[BaseModel]:
    return create_model(cls.__name__, __config__=SECTION_CONFIG, **_fields(cls))


# what the load under way reads: the environment, its *_FILE variables read, the file's settings
_REQUEST: ContextVar[tuple[Mapping[str, str], Layer, Layer]] = ContextVar("perftracker_settings_request")


class _Base(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="_", env_nested_max_split=1,
        extra="forbid", coerce_numbers_to_str=True)

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Highest first: the environment, ``*_FILE`` variables, the config file (defaults last)."""
        env, env_files, file = _REQUEST.get()
        return (_Environment(settings_cls, env), InitSettingsSource(settings_cls, _nested(env_files)),
                InitSettingsSource(settings_cls, _nested(file)))


@functools.cache
def settings_model() -> type[BaseSettings]:
    """The servers' :class:`BaseSettings`, generated from :class:`~.settings.Settings`."""
    return create_model("Settings", __base__=_Base, **_fields(Settings))


class _Environment(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping (``os.environ`` unless a
    caller passes its own), limited to the settings' variables."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]):
        super().__init__(settings_cls)
        names = value_env_names()
        # the settings' variables only, lower-cased as the source matches them (case_sensitive off)
        self.env_vars = {name.lower(): value for name, value in env.items() if name in names}


def _nested(layer: Layer) -> dict[str, Any]:
    """``{"streams.workers": (raw, source)}`` -> ``{"streams": {"workers": raw}}`` (a null in the
    file leaves the default)."""
    out: dict[str, Any] = {}
    for where, (raw, _) in layer.items():
        if raw is None:
            continue
        section, _, name = where.rpartition(".")
        (out.setdefault(section, {}) if section else out)[name] = raw
    return out


# --- loading ------------------------------------------------------------------------------

def load_with_sources(path: Path | None = None, env: Mapping[str, str] | None = None,
                      ) -> tuple[Settings, dict[str, str]]:
    """The settings (``path``, else ``$PERFTRACKER_CONFIG``, else ./perftracker.toml|yaml, and the
    environment) validated by pydantic-settings, as :class:`~.settings.Settings`, and where
    each value came from: ``default``, the environment variable, ``file PATH (section.name)``."""
    env = os.environ if env is None else env
    path = path or default_config_path(env)
    file = file_layer(read_config_file(path), f"file {path}") if path else {}
    env_files = env_file_layer(env)
    sources = {where: "default" for _, where, _, _ in leaves()}
    for layer in (file, env_files, env_layer(env)):  # lowest first: a higher source overwrites
        sources.update({where: source for where, (raw, source) in layer.items() if raw is not None})
    token = _REQUEST.set((env, env_files, file))
    try:
        model = settings_model()()
    except ValidationError as exc:
        raise ConfigError(_one_line(exc, sources)) from None
    except SettingsError as exc:
        raise ConfigError(str(exc)) from None
    finally:
        _REQUEST.reset(token)
    settings = _dataclass(Settings, model)
    check_settings(settings)
    return settings, sources


def _dataclass(cls: type, model: BaseModel) -> Any:
    """The validated model as the frozen dataclass ``cls`` the rest of the code uses."""
    return cls(**{f.name: _dataclass(typ, getattr(model, f.name)) if is_section(typ) else getattr(model, f.name)
                  for f, typ in declared(cls)})


def _one_line(exc: ValidationError, sources: Mapping[str, str]) -> str:
    """The first of pydantic's errors as the collectors' reader words it; ``(and N more)``."""
    errors = exc.errors(include_url=False)
    line = _describe(errors[0], sources)
    return line + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else "")


def _describe(error: Any, sources: Mapping[str, str]) -> str:
    where = ".".join(str(part) for part in error["loc"])
    found = next(((f, typ) for _, at, f, typ in leaves() if at == where), None)
    if found is None:  # not a setting's value: the file's tables were checked before (file_layer)
        return f"{where}: {error['msg']}"
    f, typ = found
    source, raw = sources.get(where, "default"), error.get("input")
    if error["type"] in RANGE_ERRORS:
        return range_problem_line(where, _as(typ, raw), f.metadata, source)
    return type_problem(where, typ, raw, source)


def _as(typ: Any, raw: Any) -> Any:
    """The value as the setting's type shows it (``-1.0`` for a float given as ``-1``)."""
    try:
        return typ(raw)
    except (TypeError, ValueError):
        return raw
