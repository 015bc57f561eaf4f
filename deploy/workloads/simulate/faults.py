"""Fault and noise descriptions for the pattern-level simulator, and their ground truth."""

from __future__ import annotations

from dataclasses import dataclass

FAMILIES = ("none", "slow_gpu", "gpu_throttle", "slow_link", "cpu_contention", "slow_dataloader",
            "gc_pause", "shared_gc", "shared_dataloader", "shared_python", "stage_imbalance",
            "data_imbalance", "spike", "creep", "hang")


@dataclass(frozen=True)
class Fault:
    """One injected problem. ``magnitude``: slowdown factor (or extra ms per step for
    slow_dataloader / gc_pause / shared_*). Active for steps starting in
    [start_window, end_window) windows."""

    family: str
    ranks: tuple[int, ...] = ()
    stage: int = -1
    magnitude: float = 1.3
    start_window: int = 4
    end_window: int = 9
    hw_evidence: bool = True
    every: int = 1  # apply on one step in ``every`` (intermittent faults)

    def active(self, window: float) -> bool:
        return self.start_window <= window < self.end_window


@dataclass(frozen=True)
class Truth:
    """What the engine should report: a cause and its culprit ranks (empty: all/none)."""

    cause: str
    ranks: tuple[int, ...] = ()
    start_window: int = 0


TRUE_CAUSE = {
    "slow_gpu": "slow_gpu", "gpu_throttle": "gpu_throttle", "slow_link": "slow_link",
    "cpu_contention": "host_cpu_contention", "slow_dataloader": "slow_dataloader",
    "gc_pause": "gc_pause", "shared_gc": "shared_inefficiency",
    "shared_dataloader": "shared_inefficiency", "shared_python": "shared_inefficiency",
    "stage_imbalance": "stage_imbalance", "data_imbalance": "data_imbalance",
    "creep": "regression", "hang": "hang",
}
RANK_LEVEL = {"slow_gpu", "gpu_throttle", "slow_link", "cpu_contention", "slow_dataloader",
              "gc_pause", "hang"}
GROUP_LEVEL = {"stage_imbalance", "data_imbalance"}


def truths(faults: tuple[Fault, ...], culprit_ranks: dict[int, tuple[int, ...]]) -> list[Truth]:
    """Ground truth per fault; ``culprit_ranks`` maps fault index -> ranks it names."""
    out = []
    for i, f in enumerate(faults):
        if f.family in TRUE_CAUSE:
            out.append(Truth(TRUE_CAUSE[f.family], culprit_ranks.get(i, f.ranks), f.start_window))
    return out
