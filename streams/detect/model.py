"""What the detection stages share: function-name prefixes, span-kind groups, record helpers.

The wire vocabulary itself (record names, versions, span kinds, Kind/Cause/Status) is in
``schemas.vocabulary`` and ``schemas.causes``.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from ...schemas.vocabulary import SpanKind

COMM_PREFIX = "comm:"
KIND_PREFIX = "kind:"

# kinds whose time is waiting, never a rank's own slowness, or is periodic all-rank work
NOT_COMPARED = frozenset({SpanKind.CHECKPOINT, SpanKind.SYNCHRONIZE, SpanKind.COLLECTIVE})
# kinds that define what a rank does (its peer signature)
STRUCTURAL = frozenset({SpanKind.DATALOADER, SpanKind.OPTIMIZER, SpanKind.FORWARD, SpanKind.BACKWARD})
CPU_SIDE = frozenset({SpanKind.PYTHON, SpanKind.DATALOADER, SpanKind.USER})


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
