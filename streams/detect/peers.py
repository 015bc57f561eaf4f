"""Stage 2, non-collective functions: peer groups and outlier scoring of one window.

Peers are the ranks with the same peer key: the configured ``peer_groups`` name of the
rank, else its structural signature (``sig:<hash>``). Each rank's value is its time in
the function per completed step (ms); :func:`.columnar.peer_scores` gives its robust z
against its group's median and scale, its excess and its cost, and flags it when all
pass the policy (groups under ``min_peers`` ranks are not scored). A flagged rank must
also be **sustained**: its typical call (p50) above its peers' by ``min_excess``, or more
calls per step than them; one slow step spilling into a window moves neither. When only
the tail moved (p90 above the peers' by ``min_excess`` over at least
``intermittent_min_calls`` calls) it is kept as ``intermittent`` (the diagnoser makes it
persist one window longer); otherwise it is one-window jitter (``transient_outlier``).
Waiting and periodic all-rank kinds (``NOT_COMPARED``) get group medians, never outliers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ...schemas.records import FunctionComparison, FunctionPattern, PeerGroupStat, RankOutlier
from .columnar import MAD_TO_SIGMA, PeerScores, peer_scores
from .layout import PREFIX as LAYOUT_PREFIX
from .model import NOT_COMPARED
from .policy import DetectionPolicy

INF_RATIO = 1e9  # ratio against peers that spend no time at all (finite: JSON and Avro safe)


@dataclass(frozen=True)
class PeerTable:
    """One window's valid patterns as per-rank columns, with each rank's peer group."""

    values: np.ndarray  # ms per completed step
    calls: np.ndarray  # calls per completed step
    keys: np.ndarray  # peer key of each group index
    peer: np.ndarray  # group index of each rank


def score_peers(rec: FunctionComparison, good: list[FunctionPattern], peer_map: dict[int, str], policy: DetectionPolicy,
                min_cost: float, skipped: Counter[str]) -> PeerTable:
    """Fill ``rec``'s group summaries and outliers from the valid patterns ``good``; the table scored."""
    table = peer_table(good, peer_map, skipped)
    describe_groups(rec, table, good, policy.min_peers, skipped)
    if rec["kind"] not in NOT_COMPARED:  # waiting and periodic all-rank work (checkpoints) are never outliers
        find_outliers(rec, table, good, policy, min_cost, skipped)
    return table


def peer_table(good: list[FunctionPattern], peer_map: dict[int, str], skipped: Counter[str]) -> PeerTable:
    steps = np.array([p["steps"] for p in good], dtype=np.float64)
    values = np.array([p["total_ns"] for p in good], dtype=np.float64) / steps / 1e6
    calls = np.array([p["count"] for p in good], dtype=np.float64) / steps
    keys, peer = np.unique(np.array(_peer_keys(good, peer_map, skipped)), return_inverse=True)
    return PeerTable(values, calls, keys, peer)


def _peer_keys(good: list[FunctionPattern], peer_map: dict[int, str], skipped: Counter[str]) -> list[str]:
    keys = []
    for p in good:
        key = peer_map.get(int(p["rank"])) if peer_map else None
        if peer_map and key is None:
            skipped["rank_not_in_peer_groups"] += 1
        keys.append(key if key is not None else "sig:" + str(p.get("signature", "")))
    return keys


def describe_groups(rec: FunctionComparison, t: PeerTable, good: list[FunctionPattern], min_peers: int, skipped: Counter[str]) -> None:
    """Ranks scored, and each peer group's size and medians (its ranks when there are several)."""
    sizes = np.bincount(t.peer, minlength=len(t.keys))
    few = int((sizes[t.peer] < min_peers).sum())
    if few:
        skipped["too_few_peers"] += few
    rec["ranks_scored"] = int((sizes[t.peer] >= min_peers).sum())
    rec["peer_groups"] = len(t.keys)
    rec["median_ms_per_step"] = float(np.median(t.values))
    for g, key in enumerate(t.keys):
        idx = np.flatnonzero(t.peer == g)
        rec["groups"].append(PeerGroupStat(
            key=str(key), size=int(len(idx)),
            median_ms_per_step=float(np.median(t.values[idx])),
            median_calls_per_step=float(np.median(t.calls[idx])),
            ranks=[int(good[i]["rank"]) for i in idx] if len(t.keys) > 1 else []))


def find_outliers(rec: FunctionComparison, t: PeerTable, good: list[FunctionPattern], policy: DetectionPolicy, min_cost: float,
                  skipped: Counter[str]) -> None:
    """Append the sustained (or intermittent) outliers to ``rec["outliers"]``, and to
    ``rec["minor_outliers"]`` the sustained ones that fall short of ``min_cost`` only (a rank
    slower than its peers by a little in each of several functions: together they can explain
    its late arrival into a collective, see window.py)."""
    pol = policy
    scored = peer_scores(t.values[None, :], t.peer, min_peers=pol.min_peers, mad_threshold=pol.mad_threshold,
                         min_excess=pol.min_excess, min_cost=min_cost, floor_rel=pol.noise_floor_rel,
                         floor_ms=pol.noise_floor_ms)
    p50 = np.array([p.get("p50_ns", 0) for p in good], dtype=np.float64)
    p90 = np.array([p.get("p90_ns", 0) for p in good], dtype=np.float64)
    counts = np.array([p["count"] for p in good], dtype=np.float64)
    per_call = t.values / np.maximum(t.calls, 1e-12)
    with np.errstate(all="ignore"):
        minor = ((scored.z[0] >= pol.mad_threshold) & (scored.cost[0] > 0) & ~scored.outlier[0]
                 & (scored.cost[0] >= pol.min_excess * np.maximum(scored.median[0], 0.0)))
    for fast, slow, base in _split_groups(t, policy):  # scored against the faster half (see _split_groups)
        mc = float(np.median(t.calls[fast]))
        for i in slow[~scored.outlier[0, slow] & ~minor[slow]]:
            sustained = _sustained(p50[i], float(np.median(p50[fast])), t.calls[i], mc, pol.min_excess,
                                   float(t.values[i] - base), float(np.median(per_call[fast])),
                                   calls_share=pol.extra_calls_share)
            if sustained:
                with np.errstate(divide="ignore", invalid="ignore"):  # peers of no time: inf (or nan), as before
                    per_call_ratio = float(per_call[i] / np.median(per_call[fast])) if mc > 0 else 1.0
                rec["minor_outliers"].append(_outlier(good[i], t, int(i), scored, mc, per_call_ratio, False,
                                                      baseline=base))
    rec["outliers"] += _small_stage_outliers(t, good, p50, pol, min_cost)
    for i in np.flatnonzero(scored.outlier[0] | minor):
        g = t.peer == t.peer[i]
        mc = float(np.median(t.calls[g]))
        sustained = _sustained(p50[i], float(np.median(p50[g])), t.calls[i], mc, pol.min_excess,
                               float(t.values[i] - scored.median[0, i]), float(np.median(per_call[g])),
                               calls_share=pol.extra_calls_share)
        with np.errstate(divide="ignore", invalid="ignore"):  # peers of no time: inf (or nan), as before
            per_call_ratio = float(per_call[i] / np.median(per_call[g])) if mc > 0 else 1.0
        if minor[i]:
            if sustained:
                rec["minor_outliers"].append(_outlier(good[i], t, int(i), scored, mc, per_call_ratio, False))
            continue
        intermittent = False
        if not sustained:
            # p50 unmoved: an intermittent slowdown (p90 up over enough calls) must persist
            # one window longer in the diagnoser; otherwise it is one-window jitter
            intermittent = _tail_only(p90[i], float(np.median(p90[g])), counts[i], pol)
            if not intermittent:
                skipped["transient_outlier"] += 1
                continue
        rec["outliers"].append(_outlier(good[i], t, int(i), scored, mc, per_call_ratio, intermittent))


def _small_stage_outliers(t: PeerTable, good: list[FunctionPattern], p50: np.ndarray, pol: DetectionPolicy,
                          min_cost: float) -> list[RankOutlier]:
    """Outliers of layout groups too small to score (a pipeline stage or TP position with fewer
    than ``min_peers`` data-parallel replicas, e.g. 2 stages x 2 replicas). Ranks of different
    stages are never peers (their layers differ), so such a group's rank has only its
    replicas to be told from: it is an outlier when it is above its group-mates' median by
    ``mad_threshold`` x the spread of every other rank of the function and by ``min_excess``,
    its excess costs at least ``min_cost``, and it is sustained (its typical call or its number
    of calls moved). A group this small cannot estimate its own spread, so the spread is at
    least ``min_excess`` of the group-mates' value. Both
    replicas of a stage slower is the stage's shape (stage imbalance), never an outlier here:
    neither is above the other. A GPU rank and a CPU rank show the same: one replica's
    function slower, by host or device time, than the replica doing the same layers."""
    out: list[RankOutlier] = []
    if not any(str(k).startswith(LAYOUT_PREFIX) for k in t.keys):
        return out
    for g in range(len(t.keys)):
        idx = np.flatnonzero(t.peer == g)
        if not str(t.keys[g]).startswith(LAYOUT_PREFIX) or not 2 <= len(idx) < pol.min_peers:
            continue
        for i in idx:
            mates, rest = idx[idx != i], np.flatnonzero(np.arange(len(t.values)) != i)
            base = float(np.median(t.values[mates]))
            # a group of two or three cannot estimate its own spread: at least min_excess of its base
            scale = max(_centre_scale(t.values[rest], pol)[1], pol.min_excess * max(base, 0.0))
            excess = float(t.values[i]) - base
            mc = float(np.median(t.calls[mates]))
            per_call = float(np.median(t.values[mates] / np.maximum(t.calls[mates], 1e-12)))
            if (excess < pol.mad_threshold * scale or excess < pol.min_excess * max(base, 0.0) or excess < min_cost
                    or not _sustained(p50[i], float(np.median(p50[mates])), t.calls[i], mc, pol.min_excess,
                                      excess, per_call, calls_share=pol.extra_calls_share)):
                continue
            out.append(RankOutlier(
                rank=int(good[i]["rank"]), host=str(good[i].get("host", "")), gpu=int(good[i].get("gpu", -1)),
                peer_group=str(t.keys[g]), value_ms_per_step=float(t.values[i]), peer_median_ms_per_step=base,
                ratio=float(t.values[i] / base) if base > 0 else INF_RATIO, robust_z=excess / scale,
                cost_ms_per_step=excess, calls_ratio=float(t.calls[i] / mc) if mc > 0 else INF_RATIO,
                per_call_ratio=1.0, intermittent=False))
    return out


def _split_groups(t: PeerTable, pol: DetectionPolicy) -> Iterator[tuple[np.ndarray, np.ndarray, float]]:
    """(The faster half's ranks, the ranks above it, that half's median) of each peer group
    split in two: as many slow ranks as fast ones or nearly (two slow of four), so the group's
    median sits between the halves and its spread spans both, and no rank stands out (robust
    z ~0.7 for 20 ms against 0.2 ms in a 2-slow-of-4 job). A rank counts here when it is
    above the faster half of its group (the ranks at or below the median) by
    ``mad_threshold`` x that half's own spread and by ``min_excess``, in a group whose two
    halves are apart by ``mad_threshold`` x the larger of their spreads (ordinary noise, one
    population, has no such gap: 16 ranks with 5 % noise have none). Which half is abnormal
    cannot be told from the values alone, so these are only ``minor_outliers``: never findings
    on their own, they name what a rank does with its time once the collectives show that the
    others wait for it (window.py ``_explain_late_by_minor``). A GPU rank and a CPU rank show
    the same: half the replicas slower in one function, by host or device time (decisions
    table, docs/detection.md: "split groups")."""
    for g in range(len(t.keys)):
        idx = np.flatnonzero(t.peer == g)
        if len(idx) < pol.min_peers:
            continue
        v = t.values[idx]
        is_fast = v <= np.median(v)
        if is_fast.all():
            continue
        base, fast_scale = _centre_scale(v[is_fast], pol)
        top, slow_scale = _centre_scale(v[~is_fast], pol)
        if top - base < pol.mad_threshold * max(fast_scale, slow_scale):
            continue  # one population with a spread (ordinary noise), not two halves
        excess = v - base
        above = (excess >= pol.mad_threshold * fast_scale) & (excess >= pol.min_excess * max(base, 0.0))
        yield idx[is_fast], idx[above], base


def _centre_scale(v: np.ndarray, pol: DetectionPolicy) -> tuple[float, float]:
    """Median and robust spread (1.4826 x MAD, floored like the peer scores' scale) of ``v``."""
    m = float(np.median(v))
    return m, max(MAD_TO_SIGMA * float(np.median(np.abs(v - m))), pol.noise_floor_rel * abs(m), pol.noise_floor_ms)


def _sustained(p50: float, peer_p50: float, calls: float, peer_calls: float, min_excess: float,
               excess_ms: float = 0.0, peer_ms_per_call: float = 0.0, *, calls_share: float) -> bool:
    """A real slowdown moves the typical call (p50) or the number of calls per step; one
    slow step spilling into a window moves neither (that is one-window jitter). More calls
    count only when they account for at least ``calls_share`` (``extra_calls_share``, half) of the rank's ``excess_ms`` per step at the
    peers' time per call: a rank with 5 % more garbage collections than its peers whose
    excess is one 350 ms full collection (its peers had theirs in the window before) is not
    slow by its number of calls (decisions table, docs/detection.md: "sustained")."""
    if p50 >= peer_p50 * (1 + min_excess) or peer_calls == 0:
        return True
    if calls < peer_calls * (1 + min_excess / 2):
        return False
    return (calls - peer_calls) * peer_ms_per_call >= calls_share * excess_ms


def _tail_only(p90: float, peer_p90: float, count: float, pol: DetectionPolicy) -> bool:
    """Only the slow tail moved, over enough calls to be more than chance."""
    return bool(count >= pol.intermittent_min_calls and peer_p90 > 0 and p90 >= peer_p90 * (1 + pol.min_excess))


def _outlier(p: FunctionPattern, t: PeerTable, i: int, scored: PeerScores, peer_calls: float, per_call_ratio: float,
             intermittent: bool, baseline: float | None = None) -> RankOutlier:
    """One RankOutlier record (rank ``i`` of the table, pattern ``p``); ``baseline``: the peer
    value it is measured against when not its group's median (a split group's faster half)."""
    med = float(scored.median[0, i]) if baseline is None else baseline
    value = float(t.values[i])
    return RankOutlier(
        rank=int(p["rank"]), host=str(p.get("host", "")), gpu=int(p.get("gpu", -1)),
        peer_group=str(t.keys[t.peer[i]]), value_ms_per_step=value, peer_median_ms_per_step=med,
        ratio=float(t.values[i] / med) if med > 0 else INF_RATIO,
        robust_z=float(scored.z[0, i]), cost_ms_per_step=float(scored.cost[0, i]) if baseline is None else value - med,
        calls_ratio=float(t.calls[i] / peer_calls) if peer_calls > 0 else INF_RATIO,
        per_call_ratio=per_call_ratio, intermittent=bool(intermittent))
