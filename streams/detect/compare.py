"""Stage 2: one function's FunctionPatterns from every rank -> FunctionComparison per window.

A window is evaluated once ``grace`` has passed on the caller's clock since its
first pattern arrived (late ranks get that long). Non-collectives are scored
against peers with :func:`.columnar.peer_scores` on time per completed step;
collectives go through :func:`.columnar.collective_lateness` on the seqs every
member reported. Patterns with no steps, bad numbers or missing seqs are skipped
and counted in the record's ``skipped`` map and in ``self.skipped``.
"""

from __future__ import annotations

from collections import Counter
from statistics import median

import numpy as np

from ...schemas.vocabulary import FUNCTION_COMPARISON_VERSION, SpanKind
from .columnar import binomial_tail, collective_lateness, peer_scores, seq_matrix
from .model import NOT_COMPARED, finite_nonneg, to_ms
from .policy import DetectionPolicy

MAX_EVALUATED_REMEMBERED = 32
MIN_CALLS_INTERMITTENT = 6
INF_RATIO = 1e9  # ratio against peers that spend no time at all (finite: JSON and Avro safe)


class FunctionComparator:
    """Per (job, function) window buffer and evaluator."""

    def __init__(self, job: str, function: str, policy: DetectionPolicy | None = None):
        self.job, self.function = job, function
        self.policy = policy or DetectionPolicy()
        self.peer_map = self.policy.peer_group_map()
        self.skipped: Counter[str] = Counter()
        self.pending: dict[int, dict[int, dict]] = {}  # window -> rank -> pattern
        self.first_seen: dict[int, int | None] = {}  # window -> caller ms of its first pattern
        self.evaluated: list[int] = []
        self.last_now = 0

    def add(self, pattern: dict, now_wall_ms: int | None = None) -> None:
        """Buffer one FunctionPattern (a re-delivered one replaces the earlier copy)."""
        try:
            wid, rank = int(pattern["window_id"]), int(pattern["rank"])
        except (KeyError, TypeError, ValueError):
            self.skipped["bad_pattern"] += 1
            return
        if pattern.get("function") != self.function or pattern.get("job") != self.job:
            self.skipped["wrong_function_or_job"] += 1
            return
        if wid in self.evaluated or (self.evaluated and wid < min(self.evaluated)):
            self.skipped["late_pattern"] += 1
            return
        if wid not in self.pending and len(self.pending) >= self.policy.max_open_windows:
            oldest = min(self.pending)
            self.skipped["window_evicted"] += len(self.pending.pop(oldest))
            self.first_seen.pop(oldest, None)
        self.pending.setdefault(wid, {})[rank] = pattern
        if self.first_seen.get(wid) is None:
            self.first_seen[wid] = now_wall_ms
        self.last_now = max(self.last_now, now_wall_ms or 0)

    def poll(self, now_wall_ms: int) -> list[dict]:
        """FunctionComparison records of every window whose grace has passed, oldest first."""
        out = []
        self.last_now = max(self.last_now, now_wall_ms)
        for wid in sorted(self.pending):
            if self.first_seen.get(wid) is None:
                self.first_seen[wid] = now_wall_ms
            first = self.first_seen[wid]
            if first is not None and now_wall_ms <= first + self.policy.grace_ms:
                continue
            patterns = self.pending.pop(wid)
            self.first_seen.pop(wid, None)
            self.evaluated = (self.evaluated + [wid])[-MAX_EVALUATED_REMEMBERED:]
            out.append(self.evaluate(wid, list(patterns.values())))
        return out

    def idle(self, now_wall_ms: int) -> bool:
        return not self.pending and now_wall_ms - self.last_now > self.policy.idle_after_s * 1000

    # ---- evaluation ---------------------------------------------------------------------
    def evaluate(self, window_id: int, patterns: list[dict]) -> dict:
        """Compare one window's patterns; pure function of its inputs and the policy."""
        skipped: Counter[str] = Counter()
        good = [p for p in patterns if self._valid(p, skipped)]
        rec = _empty_record(self.job, self.function, window_id, patterns)
        if good:
            rec["kind"] = int(good[0].get("kind", 0))
            rec["window_start_ms"] = to_ms(good[0].get("window_start_ms", rec["window_start_ms"]))
        rec["ranks_seen"] = len(good)
        if rec["kind"] == SpanKind.COLLECTIVE:
            self._collective(rec, good, skipped)
        elif good:
            self._peers(rec, good, skipped)
        rec["skipped"] = dict(skipped)
        self.skipped.update(skipped)
        return rec

    def _valid(self, p: dict, skipped: Counter) -> bool:
        try:
            steps, total, count = int(p["steps"]), p["total_ns"], p["count"]
        except (KeyError, TypeError, ValueError):
            skipped["bad_pattern"] += 1
            return False
        if steps <= 0:
            skipped["no_steps"] += 1
            return False
        if not (finite_nonneg(total) and finite_nonneg(count)):
            skipped["bad_duration"] += 1
            return False
        if total / steps > self.policy.max_duration_s * 1e9:
            skipped["absurd_duration"] += 1
            return False
        return True

    def _peer_keys(self, good: list[dict], skipped: Counter) -> list[str]:
        keys = []
        for p in good:
            key = self.peer_map.get(int(p["rank"])) if self.peer_map else None
            if self.peer_map and key is None:
                skipped["rank_not_in_peer_groups"] += 1
            keys.append(key if key is not None else "sig:" + str(p.get("signature", "")))
        return keys

    def _peers(self, rec: dict, good: list[dict], skipped: Counter) -> None:
        pol = self.policy
        steps = np.array([p["steps"] for p in good], dtype=np.float64)
        values = np.array([p["total_ns"] for p in good], dtype=np.float64) / steps / 1e6
        calls = np.array([p["count"] for p in good], dtype=np.float64) / steps
        uniq, peer = np.unique(np.array(self._peer_keys(good, skipped)), return_inverse=True)
        sizes = np.bincount(peer, minlength=len(uniq))
        few = int((sizes[peer] < pol.min_peers).sum())
        if few:
            skipped["too_few_peers"] += few
        rec["ranks_scored"] = int((sizes[peer] >= pol.min_peers).sum())
        rec["peer_groups"] = len(uniq)
        rec["median_ms_per_step"] = float(np.median(values))
        for g, key in enumerate(uniq):
            idx = np.flatnonzero(peer == g)
            rec["groups"].append({
                "key": str(key), "size": int(len(idx)),
                "median_ms_per_step": float(np.median(values[idx])),
                "median_calls_per_step": float(np.median(calls[idx])),
                "ranks": [int(good[i]["rank"]) for i in idx] if len(uniq) > 1 else []})
        if rec["kind"] in NOT_COMPARED:
            return  # waiting and periodic all-rank work (checkpoints) are never outliers
        scored = peer_scores(values[None, :], peer, min_peers=pol.min_peers,
                             mad_threshold=pol.mad_threshold, min_excess=pol.min_excess,
                             min_cost=_min_cost(pol, good), floor_rel=pol.noise_floor_rel,
                             floor_ms=pol.noise_floor_ms)
        p50 = np.array([p.get("p50_ns", 0) for p in good], dtype=np.float64)
        p90 = np.array([p.get("p90_ns", 0) for p in good], dtype=np.float64)
        counts = np.array([p["count"] for p in good], dtype=np.float64)
        per_call = values / np.maximum(calls, 1e-12)
        for i in np.flatnonzero(scored.outlier[0]):
            g = peer == peer[i]
            mc = float(np.median(calls[g]))
            intermittent = False
            if not _sustained(p50[i], float(np.median(p50[g])), calls[i], mc, pol.min_excess):
                # p50 unmoved: an intermittent slowdown (p90 up over enough calls) must persist
                # one window longer in the diagnoser; otherwise it is one-window jitter
                peer_p90 = float(np.median(p90[g]))
                intermittent = counts[i] >= MIN_CALLS_INTERMITTENT and peer_p90 > 0 and \
                    p90[i] >= peer_p90 * (1 + pol.min_excess)
                if not intermittent:
                    skipped["transient_outlier"] += 1
                    continue
            med = float(scored.median[0, i])
            rec["outliers"].append({
                "rank": int(good[i]["rank"]), "host": str(good[i].get("host", "")),
                "gpu": int(good[i].get("gpu", -1)), "peer_group": str(uniq[peer[i]]),
                "value_ms_per_step": float(values[i]), "peer_median_ms_per_step": med,
                "ratio": float(values[i] / med) if med > 0 else INF_RATIO,
                "robust_z": float(scored.z[0, i]), "cost_ms_per_step": float(scored.cost[0, i]),
                "calls_ratio": float(calls[i] / mc) if mc > 0 else INF_RATIO,
                "per_call_ratio": float(per_call[i] / np.median(per_call[g])) if mc > 0 else 1.0,
                "intermittent": bool(intermittent)})

    def _collective(self, rec: dict, good: list[dict], skipped: Counter) -> None:
        pol = self.policy
        members = [p for p in good if _has_seqs(p, skipped)]
        rec["members"] = [int(p["rank"]) for p in members]
        rec["member_max_seq"] = [int(max(p["seqs"])) for p in members]
        rec["mixed_signatures"] = len({str(p.get("signature", "")) for p in members}) > 1
        if len(members) < 2:
            skipped["too_few_members"] += len(members)
            return
        common, d = _aligned(members)
        bad = ~np.isfinite(d) | (d < 0) | (d > pol.max_duration_s * 1e9)
        if bad.any():  # a seq with a bad duration on any member is left out, never guessed
            skipped["bad_duration"] += int(bad.sum())
            keep = ~bad.any(axis=0)
            common, d = common[keep], d[:, keep]
        rec["seqs_compared"] = int(len(common))
        rec["bytes_per_call"] = float(median(p.get("bytes", 0) / max(1, p.get("count", 1)) for p in members))
        if len(common) < pol.min_seqs:
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
        chance = 1.0 / len(members)
        min_cost = _min_cost(pol, good)
        for i in np.flatnonzero(late.late_seqs >= pol.late_fraction * late.seqs):
            caused = float(late.caused_ns[i]) / 1e6 / step_n
            if caused < min_cost:
                continue
            # the p-value is applied by the diagnoser (culprits); any late arriver marks victims
            pval = binomial_tail(int(late.late_seqs[i]), late.seqs, chance)
            p = members[i]
            rec["stragglers"].append({
                "rank": int(p["rank"]), "host": str(p.get("host", "")), "gpu": int(p.get("gpu", -1)),
                "late_seqs": int(late.late_seqs[i]), "late_fraction": float(late.late_seqs[i] / late.seqs),
                "caused_ms_per_step": caused, "p_value": pval})


def _has_seqs(p: dict, skipped: Counter) -> bool:
    seqs, durs = p.get("seqs") or [], p.get("seq_dur_ns") or []
    if len(seqs) != len(durs) or not seqs:
        skipped["no_seqs"] += 1
        return False
    return True


def _aligned(members: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(common seqs, members x seqs durations ns). Fast path when every member reported
    the same strictly increasing seqs (the usual case); else align with seq_matrix."""
    first = members[0]["seqs"]
    if all(p["seqs"] == first for p in members) and all(a < b for a, b in zip(first, first[1:], strict=False)):
        return np.asarray(first, dtype=np.int64), np.array([p["seq_dur_ns"] for p in members], dtype=np.float64)
    series = [(np.asarray(p["seqs"], dtype=np.int64), np.asarray(p["seq_dur_ns"], dtype=np.float64))
              for p in members]
    return seq_matrix(series)


def _min_cost(pol: DetectionPolicy, good: list[dict]) -> float:
    """Cost a finding needs (ms per step): the configured floor, or ``min_step_share`` of the
    step time estimated as window length / median completed steps, whichever is larger."""
    steps = float(np.median([p["steps"] for p in good])) if good else 0.0
    step_ms = pol.window_s * 1000 / steps if steps > 0 else 0.0
    return max(pol.min_cost_ms_per_step, pol.min_step_share * step_ms)


def _sustained(p50: float, peer_p50: float, calls: float, peer_calls: float, min_excess: float) -> bool:
    """A real slowdown moves the typical call (p50) or the number of calls per step; one
    slow step spilling into a window moves neither (that is one-window jitter)."""
    return p50 >= peer_p50 * (1 + min_excess) or calls >= peer_calls * (1 + min_excess / 2) \
        or peer_calls == 0


def _empty_record(job: str, function: str, window_id: int, patterns: list[dict]) -> dict:
    return {
        "schema_version": FUNCTION_COMPARISON_VERSION, "job": job, "window_id": int(window_id),
        "window_start_ms": 0, "window_s": float(patterns[0].get("window_s", 0.0)) if patterns else 0.0,
        "function": function, "kind": 0, "ranks_seen": 0, "ranks_scored": 0, "peer_groups": 0,
        "median_ms_per_step": 0.0, "groups": [], "outliers": [], "members": [], "member_max_seq": [],
        "mixed_signatures": False, "member_wait_ms_per_step": [], "seqs_compared": 0, "transfer_ms_median": 0.0,
        "transfer_ms_per_step": 0.0, "wait_ms_per_step": 0.0, "bytes_per_call": 0.0,
        "stragglers": [], "skipped": {},
    }
