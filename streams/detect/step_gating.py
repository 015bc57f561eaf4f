"""A rank whose functional collectives were recorded during one step in n only
(``PERFTRACKER_COLLECTOR_FUNCTIONAL_STEPS``; EventBatch v8 ``functional_steps``) is judged on
those steps alone.

On the other steps its collector saw none of the tensor-parallel, DTensor or compiled
graphs' collectives. A function enclosing them (a backward, a forward) then keeps the waits
it spent inside them, which the fold would otherwise take out as nested collective time: a
victim's backward would look as slow as its culprit's. A collective's time per step would
count a fraction of the steps. So the spans and completed collectives of the unrecorded
steps are left out before the fold (:func:`recorded_only`), and a pattern's time per step
divides by the recorded steps (:func:`recorded_steps`). Entry markers (a collective still
running: the evidence of a hang), the iterations (the rank's progress and step times), CPU,
stack and network samples are all kept. Every rank of a job gated alike records the same
steps (iteration numbers agree across ranks), so peers are compared on the same steps.
Events of steps not yet known (step -1) are kept, as on an ungated rank.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

UNGATED = 1


def gate_of(batch: dict) -> int:
    """The batch's ``functional_steps`` (1 when absent: every version before it, or ungated)."""
    try:
        return max(int(batch.get("functional_steps") or UNGATED), UNGATED)
    except (TypeError, ValueError):
        return UNGATED


def recorded_steps(steps: Iterable[int], gate: int) -> int:
    """How many of the window's completed ``steps`` were recorded under ``gate``."""
    if gate <= UNGATED:
        return sum(1 for _ in steps)
    return sum(1 for s in steps if s % gate == 0)


def recorded_only(batch: dict, gate: int) -> dict:
    """``batch`` without the spans and completed collectives of the steps ``gate`` left out
    (a new dict; the input is not changed). Columns may be lists or numpy arrays."""
    if gate <= UNGATED:
        return batch
    out = dict(batch)
    spans, comms = batch.get("spans"), batch.get("comms")
    if spans and len(spans.get("step", ())):
        out["spans"] = _select(spans, _keep(spans["step"], gate))
    if comms and len(comms.get("step", ())):
        out["comms"] = _select(comms, _keep(comms["step"], gate) | (np.asarray(comms["dur_ns"]) < 0))
    return out


def _keep(step: Sequence[int] | np.ndarray, gate: int) -> np.ndarray:
    s = np.asarray(step, dtype=np.int64)
    return (s < 0) | (s % gate == 0)


def _select(block: dict[str, Any], keep: np.ndarray) -> dict[str, Any]:
    if keep.all():
        return block
    index = np.flatnonzero(keep)
    return {name: (column[index] if isinstance(column, np.ndarray) else [column[i] for i in index])
            for name, column in block.items()}
