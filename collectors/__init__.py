"""perftracker_ml.collectors: per-rank instrumentation inside the training process.

Public API::

    from perftracker import collectors
    collectors.attach()               # or `perftracker launch -- torchrun ... train.py`
    @collectors.timed                 # time a function
    with collectors.timed("eval"):    # time a block
    collectors.step()                 # mark iterations explicitly
    collectors.stats()                # the collector's own counters

Nothing is imported from torch or Kafka until :func:`attach` is called.
"""

from __future__ import annotations

from typing import Any

__all__ = ["attach", "current", "detach", "stats", "step", "timed", "SpanKind", "CollectorStats"]


def __getattr__(name: str) -> Any:
    if name in ("attach", "current", "detach", "stats", "step", "timed"):
        from . import api
        return getattr(api, name)
    if name == "SpanKind":
        from ..schemas.vocabulary import SpanKind
        return SpanKind
    if name == "CollectorStats":
        from .collector import CollectorStats
        return CollectorStats
    raise AttributeError(name)
