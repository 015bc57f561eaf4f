"""The cyclic garbage collector of a stream worker or the sink: fewer young collections, start-up frozen.

A worker (the sink alike: millions of short-lived dicts and tuples per minute) allocates a few containers per event it folds and per record it closes, and holds
much long-lived state (every rank's open windows, Faust's and aiokafka's own objects). At
CPython's default thresholds (a young collection every 700 net allocations, a full one every
100 young ones, subject to the 25 % rule) objects that live for one chunk of input survive a
few young collections, are promoted, and the full collections that follow walk the whole
heap: ~20 % of a worker's CPU in ``benchmarks.throughput`` (measured with ``gc.callbacks``,
docs/benchmarks.md). :func:`tune_gc` freezes what exists after start-up (modules, the app: never
garbage, never walked again) and raises the young threshold so a chunk's temporaries die
before a collection sees them. The records a worker builds hold no reference cycles; cycles
(exception tracebacks, asyncio's) are still collected, young ones at the next young
collection, promoted ones at the next full one.
"""

from __future__ import annotations

import gc

SERVICE_YOUNG = 50_000  # the sink's; a worker's is the setting streams.gc_young_objects (same default)
MIDDLE_EVERY = 20  # young collections between middle-generation ones (CPython: 10)
FULL_EVERY = 100  # middle collections between full ones, subject to CPython's 25 % rule (CPython: 10)


def tune_gc(young: int) -> tuple[int, int, int]:
    """Freeze the objects that exist now and collect young objects every ``young`` net
    allocations (0: leave CPython's thresholds). Returns the thresholds in force."""
    if young > 0:
        gc.collect()  # what start-up left as garbage is not frozen
        gc.freeze()
        gc.set_threshold(young, MIDDLE_EVERY, FULL_EVERY)
    return gc.get_threshold()
