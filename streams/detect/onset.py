"""A slowdown that began inside a window: the rank's last steps all slow, not scattered ones.

A peer outlier whose median call is unmoved while its slow tail holds enough calls is
``intermittent`` (:mod:`.peers`) and must persist one window longer than other findings: a
tail of slow calls now and then is weak evidence in one window. A fault that starts in the
second half of a window looks the same in that window's statistics (fewer than half of its
calls slow), so its diagnosis waited for the next window and the one after: in the
simulator (a data loader 20 ms slower from 12.5 s or 13.5 s, 5 s windows) it opened 6.5-7.5 s
after the onset, where an onset in the first half of a window opened after 3.5-4.5 s.

The rank's own step times, in order, tell the two apart: after an onset every step of the
rank is slower than before it; an intermittent slowdown's slow steps are scattered. So an
intermittent outlier is taken as an onset when, for some step k, at least
``onset_sustained_share`` of the rank's steps from k to the window's end are slower than the
``onset_usual_percentile`` (90th) of its steps before k, with at least ``onset_min_before`` steps before and
``persist_steps`` steps from k (the persistence any finding needs in steps). Then it opens
like a sustained outlier. Pure: numbers in, a step index out.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .policy import DetectionPolicy

MAX_CANDIDATES = 64  # onset steps tried per window (evenly spaced): bounded work


def onset_step(step_ns: Sequence[int] | np.ndarray, min_after: int, policy: DetectionPolicy) -> int | None:
    """The earliest step index from which the rank's steps stay slow to the window's end (see
    the module docstring), or None. ``min_after``: steps needed from the onset (>= 1)."""
    x = np.asarray(step_ns, dtype=np.float64)
    n, min_after, before = len(x), max(1, int(min_after)), policy.onset_min_before
    if n < before + min_after:
        return None
    stride = max(1, (n - min_after - before + 1) // MAX_CANDIDATES)
    for k in range(before, n - min_after + 1, stride):
        usual = float(np.percentile(x[:k], policy.onset_usual_percentile))
        if float(np.mean(x[k:] > usual)) >= policy.onset_sustained_share:
            return k
    return None
