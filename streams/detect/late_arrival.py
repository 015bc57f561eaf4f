"""Stage 2, collectives: who arrives late at one collective group, from times inside the call.

The members are the ranks that reported seqs for the group this window. Their
(seq, time inside the call) pairs are aligned on the seqs every member reported (edge
seqs missing on a skewed host are dropped, never guessed; a seq with a bad duration on
any member is left out). With at least ``min_seqs`` seqs, :func:`.columnar.collective_lateness`
finds, per seq, the member with the shortest time inside: it arrived last, the shortest
time is the pure transfer, every other member's extra time is waiting. A member last in
at least ``late_fraction`` of the seqs whose caused wait reaches the cost floor is listed
as a straggler with its binomial p-value against chance (1 / members); the diagnoser
applies :func:`is_late_culprit` (culprits), while any late arriver marks the others as victims.
No clocks are compared across ranks.

Culprit rule (:func:`is_late_culprit`), two ways to enough evidence:

* **many calls**: p <= ``late_p_value`` (1e-4), the stream's usual case of tens of seqs
  per window, where chance alone almost never reaches it;
* **few calls, clear majority**: with a handful of seqs (a profiler trace, slow steps) 1e-4
  is out of reach unless a rank is last in every call (4 members, 6 calls: last in 4 of 6
  is p = 0.038). Such a rank is a culprit when it is last in a clear majority: more than
  ``late_majority`` (half) of the seqs and more than halfway from chance (1 / members) to
  every seq (:func:`clear_majority`; in a 2-rank group chance is half, so a bare majority of
  many calls is noise: decisions table, docs/detection.md, "clear majority"), p <=
  ``late_majority_p_value`` (0.05) and the wait it caused per step
  is at least ``late_majority_step_share`` (3 %) of the job's step time (and the absolute
  ``min_cost_ms_per_step``). Noise makes some rank last in a majority of few seqs now and
  then (4 members, 6 seqs: ~15 % of windows), but the wait it causes is the noise's size;
  the step-share floor is what separates a real late arriver from that.
"""

from __future__ import annotations

from collections import Counter
from statistics import median

import numpy as np

from ...schemas.records import CollectiveStall, FunctionComparison, FunctionPattern, Straggler
from .columnar import Lateness, binomial_tail, collective_lateness, seq_matrix
from .policy import DetectionPolicy


def score_collective(rec: FunctionComparison, good: list[FunctionPattern], policy: DetectionPolicy, min_cost: float,
                     skipped: Counter[str]) -> None:
    """Fill ``rec``'s members, transfer and wait times and stragglers from the valid patterns."""
    members = [p for p in good if _has_seqs(p, skipped)]
    rec["members"] = [int(p["rank"]) for p in members]
    rec["member_max_seq"] = [int(max(p["seqs"])) for p in members]
    rec["mixed_signatures"] = len({str(p.get("signature", "")) for p in members}) > 1
    if len(members) < 2:
        skipped["too_few_members"] += len(members)
        return
    common, d = _complete_seqs(members, policy, skipped)
    rec["seqs_compared"] = int(len(common))
    rec["bytes_per_call"] = float(median(p.get("bytes", 0) / max(1, p.get("count", 1)) for p in members))
    if len(common) < policy.min_seqs:
        skipped["too_few_common_seqs"] += 1
        return
    steps = median(p["steps"] for p in members)
    per_member = median(len(p["seqs"]) for p in members)
    late = collective_lateness(d)
    # steps covered by the compared seqs: seqs per step from the median member
    step_n = max(steps * len(common) / max(1.0, per_member), 1e-9)
    rec["transfer_ms_median"] = float(np.median(late.transfer_ns)) / 1e6
    rec["transfer_ms_per_step"] = float(late.transfer_ns.sum()) / 1e6 / step_n
    waits = late.wait_ns / 1e6 / step_n
    rec["wait_ms_per_step"] = float(np.median(waits))
    rec["member_wait_ms_per_step"] = [round(float(w), 3) for w in waits]
    rec["stragglers"].extend(_stragglers(members, late, step_n, policy.late_fraction, min_cost))
    rec["stalls"] = _stalls(members, late, common, steps, float(rec["window_s"]), policy)


def is_late_culprit(s: Straggler, step_ms: float, policy: DetectionPolicy, members: int = 0) -> bool:
    """Whether a listed straggler is a culprit (see the module docstring); ``step_ms`` is the
    job's median step time (0 when unknown: then only the many-calls rule applies);
    ``members``: the group's size (0 when unknown: a majority is more than ``late_majority``)."""
    if s["p_value"] <= policy.late_p_value:
        return True
    if s["late_fraction"] <= clear_majority(members, policy) or s["p_value"] > policy.late_majority_p_value:
        return False
    floor = max(policy.min_cost_ms_per_step, policy.late_majority_step_share * step_ms)
    return step_ms > 0 and s["caused_ms_per_step"] >= floor


def clear_majority(members: int, policy: DetectionPolicy) -> float:
    """The late fraction a clear majority must exceed: ``late_majority`` (half), and halfway
    from chance (1 / members) to every call. Among 3 or more members chance is below half and
    the second bound is 0.67 (3), 0.625 (4), 0.56 (8); in a 2-rank group one of the two is
    always last, chance *is* half, and a majority needs more than 3 calls in 4."""
    if members < 2:
        return policy.late_majority
    return max(policy.late_majority, (1.0 + 1.0 / members) / 2)


def _stragglers(members: list[FunctionPattern], late: Lateness, step_n: float, late_fraction: float,
                min_cost: float) -> list[Straggler]:
    """Members last in at least ``late_fraction`` of the seqs, causing at least ``min_cost``."""
    out = []
    chance = 1.0 / len(members)
    for i in np.flatnonzero(late.late_seqs >= late_fraction * late.seqs):
        caused = float(late.caused_ns[i]) / 1e6 / step_n
        if caused < min_cost:
            continue
        # the p-value is applied by the diagnoser (culprits); any late arriver marks victims
        pval = binomial_tail(int(late.late_seqs[i]), late.seqs, chance)
        p = members[i]
        out.append(Straggler(
            rank=int(p["rank"]), host=str(p.get("host", "")), gpu=int(p.get("gpu", -1)),
            late_seqs=int(late.late_seqs[i]), late_fraction=float(late.late_seqs[i] / late.seqs),
            caused_ms_per_step=caused, p_value=pval))
    return out


def _stalls(members: list[FunctionPattern], late: Lateness, seqs: np.ndarray, steps: float,
            window_s: float, policy: DetectionPolicy) -> list[CollectiveStall]:
    """Single calls at which the last arriver kept the others waiting ``stall_steps`` steps or
    more (and at least ``stall_min_ms``): the largest ``max_stalls`` of them. A step here is the
    window's length over its steps, so a stall inside the window lengthens the step it is
    measured against. ``seqs_per_step`` is the group's seq span over the window's steps: a
    process group numbers all its collectives (FSDP's all-gathers and reduce-scatters share
    one counter), so seq gaps become steps only through the span, not this op's calls."""
    if steps <= 0 or window_s <= 0:
        return []
    floor_ns = max(policy.stall_min_ms * 1e6, policy.stall_steps * window_s * 1e9 / steps)
    hits = np.flatnonzero(late.caused_seq_ns >= floor_ns)
    hits = hits[np.argsort(-late.caused_seq_ns[hits], kind="stable")][:policy.max_stalls]
    out = []
    for j in hits:
        p = members[int(late.last[j])]
        out.append(CollectiveStall(rank=int(p["rank"]), host=str(p.get("host", "")), gpu=int(p.get("gpu", -1)),
                                   seq=int(seqs[j]), wait_ms=float(late.caused_seq_ns[j]) / 1e6,
                                   seqs_per_step=float((seqs[-1] - seqs[0] + 1) / steps)))
    return out


def _has_seqs(p: FunctionPattern, skipped: Counter[str]) -> bool:
    seqs, durs = p.get("seqs") or [], p.get("seq_dur_ns") or []
    if len(seqs) != len(durs) or not seqs:
        skipped["no_seqs"] += 1
        return False
    return True


def _complete_seqs(members: list[FunctionPattern], policy: DetectionPolicy,
                   skipped: Counter[str]) -> tuple[np.ndarray, np.ndarray]:
    """The aligned seqs with a good duration on every member (a bad one is never guessed)."""
    common, d = _aligned(members)
    bad = ~np.isfinite(d) | (d < 0) | (d > policy.max_duration_s * 1e9)
    if bad.any():
        skipped["bad_duration"] += int(bad.sum())
        keep = ~bad.any(axis=0)
        common, d = common[keep], d[:, keep]
    return common, d


def _aligned(members: list[FunctionPattern]) -> tuple[np.ndarray, np.ndarray]:
    """(common seqs, members x seqs durations ns). Fast path when every member reported
    the same strictly increasing seqs (the usual case); else align with seq_matrix."""
    first = members[0]["seqs"]
    if all(p["seqs"] == first for p in members) and all(a < b for a, b in zip(first, first[1:], strict=False)):
        return np.asarray(first, dtype=np.int64), np.array([p["seq_dur_ns"] for p in members], dtype=np.float64)
    series = [(np.asarray(p["seqs"], dtype=np.int64), np.asarray(p["seq_dur_ns"], dtype=np.float64))
              for p in members]
    return seq_matrix(series)
