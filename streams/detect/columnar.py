"""Vectorized comparison math: numpy arrays in, arrays out (no dicts, no loops over ranks).

``peer_scores``: per function and rank, the robust distance from the rank's peer group:
    median m and MAD of the group's values (ms per step); scale = max(MAD_TO_SIGMA * MAD,
    (q60 - q40) / 0.507, noise_floor_rel * m, noise_floor_ms) (the central-quantile
    term is another sigma estimate, robust to a slow cluster of up to 40% of the group); z = (v - m) / scale; excess = v / m - 1;
    cost = v - m (ms per step). A rank is an outlier when z, excess and cost all pass.
``collective_lateness``: per (group, seq) of one collective, times inside the call
    D[member, seq] (ns). The member with the shortest time arrived last; every other
    member's extra time over that minimum is the wait it caused. No clocks are compared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# MAD x this estimates the standard deviation of normally distributed values (1 / the normal
# distribution's 75th percentile, 0.6745): a robust z is then in sigmas. Used wherever MAD is scaled.
MAD_TO_SIGMA = 1.4826
CENTRAL_TO_SIGMA = 0.507  # q60 - q40 of a normal distribution, in sigmas


@dataclass(frozen=True)
class PeerScores:
    """Arrays shaped like the input values (functions x ranks); NaN where not scored."""

    median: np.ndarray
    z: np.ndarray
    cost: np.ndarray
    outlier: np.ndarray  # bool


def peer_scores(values: np.ndarray, peer: np.ndarray, *, min_peers: int, mad_threshold: float,
                min_excess: float, min_cost: float, floor_rel: float, floor_ms: float) -> PeerScores:
    """Score ``values`` (F x R, ms per step; NaN = missing) against peer groups ``peer`` (R,
    int, -1 = no group). Groups with fewer than ``min_peers`` valid ranks are not scored."""
    v = np.atleast_2d(np.asarray(values, dtype=np.float64))
    med = np.full_like(v, np.nan)
    scale = np.full_like(v, np.nan)
    for g in np.unique(peer[peer >= 0]):
        cols = np.flatnonzero(peer == g)
        contiguous = len(cols) == cols[-1] - cols[0] + 1
        idx = slice(int(cols[0]), int(cols[-1]) + 1) if contiguous else cols
        block = v[:, idx]
        valid = np.isfinite(block).sum(axis=1)
        ok = valid >= min_peers
        if not ok.any():
            continue
        with np.errstate(all="ignore"):
            q40, m, q60 = _quantile_rows(block)
            mad = _median_rows(np.abs(block - m[:, None]))
        s = np.maximum.reduce([MAD_TO_SIGMA * mad, (q60 - q40) / CENTRAL_TO_SIGMA,
                               floor_rel * np.abs(m), np.full_like(m, floor_ms)])
        med[:, idx] = np.where(ok, m, np.nan)[:, None]
        scale[:, idx] = np.where(ok, s, np.nan)[:, None]
    with np.errstate(all="ignore"):
        cost = v - med
        z = cost / scale
        # excess >= min_excess  <=>  cost >= min_excess * median (median > 0; NaN compares False)
        outlier = (z >= mad_threshold) & (cost >= min_cost) & (cost >= min_excess * np.maximum(med, 0.0))
    return PeerScores(med, z, cost, outlier)


def _quantile_rows(block: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row quantiles (q40, median, q60), linearly interpolated like ``np.percentile`` (so the
    NaN path below agrees), in one introselect pass (np.partition on the bracketing ranks).
    Interpolation matters for small groups: with 8 ranks a nearest-rank q60 is the 6th value,
    which two slow ranks already reach, inflating the scale they are measured against."""
    n = block.shape[1]
    if np.isnan(block).any():
        q = np.nanpercentile(block, [40, 50, 60], axis=1)
        return q[0], q[1], q[2]
    pos = {q: q * (n - 1) for q in (0.4, 0.5, 0.6)}
    k = sorted({int(np.floor(p)) for p in pos.values()} | {int(np.ceil(p)) for p in pos.values()})
    part = np.partition(block, k, axis=1)

    def at(p: float) -> np.ndarray:
        lo, hi = int(np.floor(p)), int(np.ceil(p))
        return part[:, lo] + (p - lo) * (part[:, hi] - part[:, lo])

    return at(pos[0.4]), at(pos[0.5]), at(pos[0.6])


def _median_rows(block: np.ndarray) -> np.ndarray:
    """Row medians; nanmedian only when there are NaNs (it is much slower)."""
    if np.isnan(block).any():
        return np.nanmedian(block, axis=1)
    n = block.shape[1]
    part = np.partition(block, sorted({(n - 1) // 2, n // 2}), axis=1)
    return (part[:, (n - 1) // 2] + part[:, n // 2]) / 2


@dataclass(frozen=True)
class Lateness:
    """Per member of one collective group over the compared seqs."""

    late_seqs: np.ndarray  # int: seqs where this member arrived last
    caused_ns: np.ndarray  # float: sum over those seqs of the median wait it caused
    transfer_ns: np.ndarray  # per seq: the shortest time inside the call (pure transfer)
    wait_ns: np.ndarray  # per member: total extra time over the per-seq minimum (waiting)
    seqs: int
    last: np.ndarray  # per seq: the index of the member that arrived last
    caused_seq_ns: np.ndarray  # per seq: the wait the last arriver caused (median of the others')


def collective_lateness(durations: np.ndarray) -> Lateness:
    """``durations``: members x seqs (ns), complete (no NaN). See the module docstring."""
    d = np.asarray(durations, dtype=np.float64)
    m, s = d.shape
    last = np.argmin(d, axis=0)
    transfer = d[last, np.arange(s)]
    wait = d - transfer[None, :]
    # the wait a late arriver caused: the median of the other members' waits
    caused = np.median(wait, axis=0) if m > 2 else wait.max(axis=0)
    late = np.bincount(last, minlength=m)
    caused_by = np.bincount(last, weights=caused, minlength=m)
    return Lateness(late, caused_by, transfer, wait.sum(axis=1), s, last, caused)


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), in log space (stable for n in the thousands)."""
    if k <= 0:
        return 1.0
    if k > n or p <= 0:
        return 0.0 if k > 0 else 1.0
    lp, lq = math.log(p), math.log1p(-p) if p < 1 else -math.inf
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp
             + (n - i) * lq for i in range(k, n + 1)]
    top = max(terms)
    return float(min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms)))


def seq_matrix(per_rank: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Align (seqs, durs) of each member on the seqs every member reported.

    Returns (common seqs, members x seqs durations). A seq reported twice by one rank
    keeps its last duration. Seqs missing on any member (window edges under clock skew)
    are left out, never guessed."""
    first = per_rank[0][0] if per_rank else None
    if first is not None and all(len(s) == len(first) and np.array_equal(s, first) for s, _ in per_rank):
        if len(first) < 2 or bool(np.all(first[1:] > first[:-1])):  # same sorted, unique seqs
            return first, np.stack([d for _, d in per_rank])
    common = None
    for seqs, _ in per_rank:
        u = np.unique(seqs)
        common = u if common is None else np.intersect1d(common, u, assume_unique=True)
    if common is None or len(common) == 0:
        return np.zeros(0, np.int64), np.zeros((len(per_rank), 0))
    out = np.empty((len(per_rank), len(common)))
    for i, (seqs, durs) in enumerate(per_rank):
        order = np.argsort(seqs, kind="stable")
        ss, dd = seqs[order], durs[order]
        idx = np.searchsorted(ss, common, side="right") - 1
        out[i] = dd[idx]
    return common, out
