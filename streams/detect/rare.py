"""Rare functions are judged over a horizon of windows, not one window.

A function a rank calls only a few times a window (a full garbage collection, a periodic
log or evaluation) falls into whichever window the call happened in: when every rank makes
one 350 ms full collection every ten seconds or so, one rank's lands in this window and its
peers' in the one before, and in this window alone that rank spends 7.8 ms/step more than
they do. Whether a rank is slower in such a function shows only over several windows
(decisions table, docs/detection.md: "rare functions").

So a peer outlier resting on at most ``rare_max_calls`` calls of the rank is kept only
if the rank is an outlier over the last ``rare_horizon_windows`` windows in which the function
ran too: its time in them, per step, above its peers' median by ``min_excess`` and by the
window's minimum cost. Peers that ran the function in none of those windows leave nothing to
compare with (a checkpoint on one rank, which its peers never do), and the outlier stands.
A function that was not rare in a window (some rank called it more often) clears the horizon.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from .policy import DetectionPolicy


def rare(calls: Iterable[int], max_calls: int) -> bool:
    """Whether a window's calls per rank make the function rare in it: at most ``max_calls``
    (``rare_max_calls``) each; none at all: not."""
    return max(calls, default=max_calls + 1) <= max_calls


@dataclass
class RareWindow:
    """One window of a rare function: the job's median steps, and each calling rank's time
    in it (ns) and peer key."""

    window_id: int
    steps: float
    time_ns: dict[int, float]
    peer_key: dict[int, str]


@dataclass
class RareHorizon:
    """The last windows of one function while it stays rare (plain, bounded state):
    ``horizon`` windows at most (``rare_horizon_windows``), rare while each rank calls it at most
    ``max_calls`` times a window (``rare_max_calls``)."""

    horizon: int
    max_calls: int
    windows: deque[RareWindow] = field(default_factory=deque)

    def __post_init__(self) -> None:
        self.windows = deque(self.windows, maxlen=self.horizon)

    @classmethod
    def for_policy(cls, policy: DetectionPolicy) -> RareHorizon:
        return cls(policy.rare_horizon_windows, policy.rare_max_calls)

    def note(self, window_id: int, rows: Iterable[tuple[int, str, int, float, int]]) -> None:
        """Window ``window_id``'s ranks as (rank, peer key, calls, time ns, steps); a window in
        which some rank called the function more than ``max_calls`` times clears the
        horizon (the function is not rare)."""
        rows = list(rows)
        if not rare((calls for _, _, calls, _, _ in rows), self.max_calls):
            self.windows.clear()
            return
        self.windows = deque((w for w in self.windows if w.window_id != window_id), maxlen=self.horizon)
        self.windows.append(RareWindow(window_id, float(np.median([s for *_, s in rows])),
                                       {r: float(t) for r, _, _, t, _ in rows}, {r: k for r, k, _, _, _ in rows}))

    def stands(self, rank: int, peer_key: str, min_peers: int, min_excess: float, min_cost_ms: float) -> bool:
        """Whether ``rank`` is an outlier in this function over the horizon: its time per step
        there above its peers' median by ``min_excess`` and by ``min_cost_ms``. True too when
        fewer than ``min_peers - 1`` peers of the same key ran the function in the horizon
        (nothing to judge it against)."""
        steps = sum(w.steps for w in self.windows)
        peers = {r for w in self.windows for r, k in w.peer_key.items() if k == peer_key and r != rank}
        if steps <= 0 or len(peers) + 1 < min_peers:
            return True

        def per_step_ms(r: int) -> float:
            return sum(w.time_ns.get(r, 0.0) for w in self.windows) / steps / 1e6

        own = per_step_ms(rank)
        peer_median = float(np.median([per_step_ms(r) for r in peers]))
        return own >= peer_median * (1 + min_excess) and own - peer_median >= min_cost_ms
