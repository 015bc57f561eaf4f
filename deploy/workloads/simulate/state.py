"""What the window emitters (``records``, ``hardware``) read of a pattern simulator.

:class:`.patterns.PatternSim` has these attributes; the emitters are typed against this
protocol instead of importing the simulator, so the modules import one way only:
patterns -> records -> hardware -> state.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from .faults import Fault
from .layout import Layout


class SimState(Protocol):
    layout: Layout
    faults: tuple[Fault, ...]
    job: str
    moe: bool
    rng: np.random.Generator
    w_ms: float  # window length
    window_s: float
    p: np.ndarray  # pipeline, data and tensor index of every rank
    d: np.ndarray
    t: np.ndarray
    host: np.ndarray  # host index of every rank
    steps: list[dict]  # simulated steps not yet past every window that needs them
    step_no: int
    hung_at: float | None  # window (fractional) in which a hang began
