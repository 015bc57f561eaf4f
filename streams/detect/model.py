"""Shared vocabulary of the detection core: enums, span kinds, record helpers."""

from __future__ import annotations

import math
from datetime import datetime
from enum import Enum, IntEnum
from typing import Any

SCHEMA_VERSION = 1
COMM_PREFIX = "comm:"
KIND_PREFIX = "kind:"


class SpanKind(IntEnum):
    """EventBatch.spans.kind, plus the FunctionPattern-only kinds."""

    PYTHON = 0
    DATALOADER = 1
    OPTIMIZER = 2
    FORWARD = 3
    BACKWARD = 4
    GC = 5
    CHECKPOINT = 6
    SYNCHRONIZE = 7
    USER = 8
    COLLECTIVE = 100
    OP_SUMMARY = 101


# kinds whose time is waiting, never a rank's own slowness, or is periodic all-rank work
NOT_COMPARED = frozenset({SpanKind.CHECKPOINT, SpanKind.SYNCHRONIZE, SpanKind.COLLECTIVE})
# kinds that define what a rank does (its peer signature)
STRUCTURAL = frozenset({SpanKind.DATALOADER, SpanKind.OPTIMIZER, SpanKind.FORWARD, SpanKind.BACKWARD})
CPU_SIDE = frozenset({SpanKind.PYTHON, SpanKind.DATALOADER, SpanKind.USER})


class Kind(str, Enum):
    """Anomaly.kind."""

    OUTLIER = "outlier"
    STRAGGLER = "straggler"
    EXPECTATION = "expectation"
    IMBALANCE = "imbalance"
    REGRESSION = "regression"
    HANG = "hang"


class Cause(str, Enum):
    """Anomaly.cause: the root-cause class."""

    SLOW_GPU = "slow_gpu"
    GPU_THROTTLE = "gpu_throttle"
    SLOW_LINK = "slow_link"
    HOST_CPU_CONTENTION = "host_cpu_contention"
    SLOW_DATALOADER = "slow_dataloader"
    GC_PAUSE = "gc_pause"
    STAGE_IMBALANCE = "stage_imbalance"
    DATA_IMBALANCE = "data_imbalance"
    SHARED_INEFFICIENCY = "shared_inefficiency"
    REGRESSION = "regression"
    HANG = "hang"
    SLOW_FUNCTION = "slow_function"


class Status(str, Enum):
    """Anomaly.status."""

    OPEN = "OPEN"
    UPDATED = "UPDATED"
    RESOLVED = "RESOLVED"


def kind_function(kind: int) -> str:
    """Name of the per-kind aggregate pattern, e.g. ``kind:gc``."""
    try:
        return KIND_PREFIX + SpanKind(kind).name.lower()
    except ValueError:
        return f"{KIND_PREFIX}{kind}"


def comm_function(op: str, group_id: str) -> str:
    return f"{COMM_PREFIX}{op}:{group_id}"


def comm_op(function: str) -> str:
    """``comm:all_reduce:dp3`` -> ``all_reduce``; '' for non-collectives."""
    if not function.startswith(COMM_PREFIX):
        return ""
    return function[len(COMM_PREFIX):].split(":", 1)[0]


def to_ms(value: Any) -> int:
    """A timestamp-millis field: int ms, or a ``datetime`` after Avro decoding."""
    if isinstance(value, datetime):
        return int(round(value.timestamp() * 1000))
    return int(value)


def finite_nonneg(x: Any) -> bool:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return False
    return math.isfinite(v) and v >= 0
