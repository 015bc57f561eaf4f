"""Avro schemas (``*.vN.avsc``), the codec of every perftracker topic, and the wire
vocabulary (:mod:`.vocabulary`: record names, versions, framing, enums; :mod:`.causes`:
cause classes and their words)."""

from .codec import Codec, MultiCodec, SchemaSet, bundled_schemas
from .errors import ConfigError, PerftrackerError, SchemaError

__all__ = [
    "Codec", "ConfigError", "MultiCodec", "PerftrackerError", "SchemaError", "SchemaSet", "bundled_schemas",
]
