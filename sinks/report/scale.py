"""What the report shows at any rank count: percentiles across ranks, the few ranks worth naming,
rank lists in a few words, and a finding's cost in GPU-hours per day.

A page that draws one line, legend entry or table column per rank works for 8 ranks and
not for 1,024. The report draws the distribution across ranks (p50, p90, p99 per time
bucket) and names only the culprits and the top ``K_SLOWEST`` ranks (pure functions).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

K_SLOWEST = 5  # ranks named besides the culprits: chart lines, heatmap rows, late-arrival columns
MAX_CULPRITS = 6  # culprits named one by one; more are counted ("and 250 more culprits")
SMALL_JOB = 8  # ranks up to which every rank is named (a line, a row, a column of its own)


def percentile(values: list[float], p: float) -> float:
    """Linear-interpolated percentile ``p`` (0..1) of ``values`` (sorted or not; not empty)."""
    vals = sorted(values)
    if len(vals) == 1:
        return vals[0]
    pos = p * (len(vals) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


def pick_ranks(scores: Mapping[int, float], culprits: Iterable[int], k: int = K_SLOWEST,
               max_culprits: int = MAX_CULPRITS) -> tuple[list[int], list[int], int]:
    """(culprits shown, other ranks shown, culprits left unnamed): the culprits with data, worst
    first and at most ``max_culprits``, then the ``k`` highest-scoring other ranks; in a job of
    ``SMALL_JOB`` ranks or fewer, every rank."""
    culprit_set = set(culprits)
    order = sorted(scores, key=lambda r: (-scores[r], r))
    named_culprits = [r for r in order if r in culprit_set]
    if len(order) <= SMALL_JOB:
        return named_culprits, [r for r in order if r not in culprit_set], 0
    rest = [r for r in order if r not in culprit_set][:k]
    return named_culprits[:max_culprits], rest, max(len(named_culprits) - max_culprits, 0)


def compact_ranks(ranks: Iterable[int], limit: int = 6) -> str:
    """Up to ``limit`` ranks one by one (``1, 2, 7``); more as runs, with how many in all
    (``range(768, 1024)`` -> ``768-1023 (256 ranks)``)."""
    rs = sorted(set(int(r) for r in ranks))
    if len(rs) <= limit:
        return ", ".join(map(str, rs))
    spans: list[tuple[int, int]] = []
    for r in rs:
        if spans and r == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], r)
        else:
            spans.append((r, r))
    runs = [str(a) if a == b else f"{a}-{b}" for a, b in spans]
    text = ", ".join(runs[:8]) + (", …" if len(runs) > 8 else "")
    return f"{text} ({len(rs):,} ranks)"


def gpu_hours_per_day(impact_ms_per_step: float, step_time_ms: float, ranks: int) -> float | None:
    """impact / step time × ranks × 24 h: the GPU time a job of ``ranks`` GPUs loses in a day
    (every rank waits for the slowest); None when a figure is unknown."""
    if impact_ms_per_step <= 0 or step_time_ms <= 0 or ranks <= 0:
        return None
    return impact_ms_per_step / step_time_ms * ranks * 24.0


def hours_text(hours: float) -> str:
    return f"{hours:,.1f}" if hours < 100 else f"{hours:,.0f}"
