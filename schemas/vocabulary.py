"""The wire vocabulary: every name and number that producers and consumers must agree on.

Record names, the schema versions the stream stages write, the framing of a message,
the dead-letter headers, the collectors' heartbeat period, and the enums carried in
records (span kinds, op kinds, anomaly kind and status). Cause classes and their words
are in :mod:`.causes`. Standard library only: every package may import this module,
the pure detection core included. ``tests/unit/schemas/test_vocabulary.py`` holds each
value to the bundled ``*.avsc`` files.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum, IntEnum
from typing import Any

# --- record names (the Avro record name, ``Codec(name)``) -----------------------------
EVENT_BATCH = "EventBatch"
HARDWARE_BATCH = "HardwareBatch"
FUNCTION_PATTERN = "FunctionPattern"
RANK_WINDOW = "RankWindow"
FUNCTION_COMPARISON = "FunctionComparison"
ANOMALY = "Anomaly"
CONTROL = "Control"
RANK_WINDOW_SET = "RankWindowSet"  # RankWindows of one job and window closed together, as columns (schemas/record_sets.py)
FUNCTION_PATTERN_SET = "FunctionPatternSet"  # FunctionPatterns of one function and window closed together, likewise
RECORD_BUNDLE = "RecordBundle"  # an envelope of several framed records of one topic and key (schemas/bundle.py)
RECORD_NAMES = (EVENT_BATCH, HARDWARE_BATCH, FUNCTION_PATTERN, RANK_WINDOW, FUNCTION_COMPARISON,
                ANOMALY, CONTROL, RANK_WINDOW_SET, FUNCTION_PATTERN_SET, RECORD_BUNDLE)

# --- schema versions a record's ``schema_version`` field is set to where it is built ----
# (the collectors leave it out and Codec.encode fills in its writer's version). Each is
# the latest bundled schema of the record: bump it together with the new ``.vN.avsc``.
EVENT_BATCH_VERSION = 9  # EventBatch built by the trace importer (streams/traces/kineto.py; its list columns are packed when encoded)
FUNCTION_PATTERN_VERSION = 3
RANK_WINDOW_VERSION = 6
FUNCTION_COMPARISON_VERSION = 3
ANOMALY_VERSION = 2
CONTROL_VERSION = 1
RANK_WINDOW_SET_VERSION = 1
FUNCTION_PATTERN_SET_VERSION = 1
RECORD_BUNDLE_VERSION = 1

# --- framing (see schemas/codec.py and docs/schemas.md) ----------------------------------
SINGLE_OBJECT_MAGIC = b"\xc3\x01"  # Avro single-object encoding
FINGERPRINT_BYTES = 8  # little-endian CRC-64-AVRO of the writer schema's canonical form
SINGLE_OBJECT_HEADER_LEN = len(SINGLE_OBJECT_MAGIC) + FINGERPRINT_BYTES  # 10: magic + fingerprint
CONFLUENT_MAGIC = b"\x00"  # Confluent wire format (schema registry)
CONFLUENT_HEADER_LEN = len(CONFLUENT_MAGIC) + 4  # 5: magic + 4-byte big-endian schema id

# --- dead-letter topic headers --------------------------------------------------------
DEADLETTER_REASON = "reason"  # why the message could not be used (both writers)
DEADLETTER_REASON_MAX_CHARS = 1000
DEADLETTER_SOURCE = "source"  # stream workers: the input that failed (inputs, patterns, findings)
DEADLETTER_SOURCE_TOPIC = "source_topic"  # the sink: where the message was consumed ...
DEADLETTER_PARTITION = "partition"
DEADLETTER_OFFSET = "offset"
DEADLETTER_STAGE = "stage"  # ... and which stage refused it ("sink")
DEADLETTER_TABLE = "table"  # sink: the table that refused the row (the value is the row as JSON)

# --- liveness -------------------------------------------------------------------------
HEARTBEAT_S = 5.0  # collectors send a batch at least this often (empty ones included), so a
# silent rank is told from a dead one


# --- how an incident ended (Anomaly.resolved_reason, RESOLVED records only) --------------
RESOLVED_CLEARED = "cleared"  # the finding was absent for clear_windows evaluated windows
RESOLVED_JOB_FINISHED = "job finished"  # every rank sent its final batch (clean exits)
RESOLVED_JOB_DIED = "job died"  # the ranks went silent past idle_after_s without a final batch
RESOLVED_REASONS = (RESOLVED_CLEARED, RESOLVED_JOB_FINISHED, RESOLVED_JOB_DIED)


class SpanKind(IntEnum):
    """EventBatch.spans.kind, plus the FunctionPattern-only kinds (100 and up)."""

    PYTHON = 0
    DATALOADER = 1
    OPTIMIZER = 2
    FORWARD = 3
    BACKWARD = 4
    GC = 5
    CHECKPOINT = 6
    SYNCHRONIZE = 7
    USER = 8
    DEVICE = 9  # a phase's device time between CUDA events (name ``cuda:<the host span's name>``)
    COLLECTIVE = 100
    OP_SUMMARY = 101


class OpKind(IntEnum):
    """EventBatch.kernels.kind: op summary kinds of a profiling window."""

    CUDA_KERNEL = 0
    MEMCPY = 1
    MEMSET = 2
    CPU_OP = 3
    COMM_KERNEL = 4


class Kind(str, Enum):
    """Anomaly.kind: how the finding was detected."""

    OUTLIER = "outlier"
    STRAGGLER = "straggler"
    EXPECTATION = "expectation"
    IMBALANCE = "imbalance"
    REGRESSION = "regression"
    HANG = "hang"
    ADVICE = "advice"  # the job's shape, seen from its start (causes.SHAPE): never an incident


def is_advice(record: Mapping[str, Any]) -> bool:
    """An Anomaly (or a diagnosis row) that is advice about the job's shape, not an incident."""
    return record.get("kind") == Kind.ADVICE.value


class Status(str, Enum):
    """Anomaly.status: an incident's lifecycle."""

    OPEN = "OPEN"
    UPDATED = "UPDATED"
    RESOLVED = "RESOLVED"


class ControlCommand(str, Enum):
    """Control.command: what the stream workers ask every collector of a job to do."""

    PROFILE = "PROFILE"
    STOP_PROFILE = "STOP_PROFILE"
    PING = "PING"
