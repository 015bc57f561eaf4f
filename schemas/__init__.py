"""Avro schemas (``*.vN.avsc``) and the codec of every perftracker topic."""

from .codec import Codec, MultiCodec, SchemaSet, bundled_schemas
from .errors import ConfigError, PerftrackerError, SchemaError

EVENT_BATCH = "EventBatch"
HARDWARE_BATCH = "HardwareBatch"
FUNCTION_PATTERN = "FunctionPattern"
RANK_WINDOW = "RankWindow"
ANOMALY = "Anomaly"
CONTROL = "Control"

__all__ = [
    "ANOMALY", "CONTROL", "EVENT_BATCH", "FUNCTION_PATTERN", "HARDWARE_BATCH", "RANK_WINDOW",
    "Codec", "ConfigError", "MultiCodec", "PerftrackerError", "SchemaError", "SchemaSet", "bundled_schemas",
]
