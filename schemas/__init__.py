"""The contract package: Avro schemas (``*.vN.avsc``), the codec of every perftracker
topic, and the wire vocabulary (:mod:`.vocabulary`: record names, versions, framing,
enums; :mod:`.causes`: cause classes and their words).

The codec (and fastavro with it) is imported on first use, so importing the vocabulary
costs the standard library only (the pure detection core imports it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import ConfigError, PerftrackerError, SchemaError

if TYPE_CHECKING:
    from .codec import Codec, MultiCodec, SchemaSet, bundled_schemas

__all__ = [
    "Codec", "ConfigError", "MultiCodec", "PerftrackerError", "SchemaError", "SchemaSet", "bundled_schemas",
]

_CODEC_NAMES = frozenset({"Codec", "MultiCodec", "SchemaSet", "bundled_schemas"})


def __getattr__(name: str) -> Any:
    if name in _CODEC_NAMES:
        from . import codec
        value = getattr(codec, name)
        globals()[name] = value  # later look-ups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
