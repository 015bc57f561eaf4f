"""Slow links between sibling collective groups: a group whose pure transfer time exceeds
that of its sibling groups (same op, same number of members), localized by link hardware
evidence or by the members every slow group shares (:func:`slow_links`).

Evidence: each collective group's transfer time (the shortest time inside a call: the last
arriver's, which waited for no one) per call and per step, with at least ``min_seqs`` calls
and ``min_peers`` sibling groups; a group is slow when t >= median * (1 + link_excess),
robust z = (t - median) / max(MAD_TO_SIGMA * MAD, noise_floor_rel * median) >=
mad_threshold, and its excess per step >= min_cost_ms_per_step. A job with one group has no
siblings: its links are named from the hosts' network evidence (:mod:`.net_links`).

GPU/NCCL rank: the link hardware evidence is its GPU's PCIe generation or width below the
group's others, and NVLink errors. CPU rank (gloo): no link hardware readings, so a slow
group is localized by the members every slow group shares, or not at all.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...schemas.causes import Cause
from ...schemas.records import FunctionComparison, RankWindow
from ...schemas.vocabulary import Kind, SpanKind
from .columnar import MAD_TO_SIGMA
from .findings import Finding
from .model import comm_op
from .policy import DetectionPolicy
from .shape import short_ranks


def slow_links(comparisons: list[FunctionComparison], rank_windows: dict[int, RankWindow],
               policy: DetectionPolicy) -> tuple[list[Finding], set[int]]:
    """Collective groups whose transfer time exceeds sibling groups (same op, same size)."""
    siblings: dict[tuple, list[FunctionComparison]] = defaultdict(list)
    for c in comparisons:
        if c["kind"] == SpanKind.COLLECTIVE and c["seqs_compared"] >= policy.min_seqs:
            siblings[(comm_op(c["function"]), len(c["members"]))].append(c)
    slow = []
    for group in siblings.values():
        if len(group) < policy.min_peers:
            continue
        t = np.array([c["transfer_ms_median"] for c in group])
        per_step = np.array([c["transfer_ms_per_step"] for c in group])
        m, mad = float(np.median(t)), float(np.median(np.abs(t - np.median(t))))
        scale = max(MAD_TO_SIGMA * mad, policy.noise_floor_rel * m, 1e-6)
        ms = float(np.median(per_step))
        for c, ti, pi in zip(group, t, per_step, strict=False):
            if ti >= m * (1 + policy.link_excess) and (ti - m) / scale >= policy.mad_threshold \
                    and pi - ms >= policy.min_cost_ms_per_step:
                slow.append((c, ti / m, (ti - m) / scale, pi - ms))
    return _localize_links(slow, rank_windows)


def _link_suspects(members: list[int], rank_windows: dict[int, RankWindow]) -> dict[int, dict]:
    """Members with link hardware evidence: PCIe gen/width below the others, NVLink errors."""
    rws = [rank_windows[r] for r in members if r in rank_windows]
    gens = [rw["pcie_gen_min"] for rw in rws if rw.get("pcie_gen_min", -1) > 0]
    widths = [rw["pcie_width_min"] for rw in rws if rw.get("pcie_width_min", -1) > 0]
    gen_med = float(np.median(gens)) if gens else -1
    width_med = float(np.median(widths)) if widths else -1
    out = {}
    for rw in rws:
        ev: dict[str, Any] = {}
        if 0 < rw.get("pcie_gen_min", -1) < gen_med:
            ev["pcie_gen"], ev["peer_pcie_gen"] = rw["pcie_gen_min"], gen_med
        if 0 < rw.get("pcie_width_min", -1) < width_med:
            ev["pcie_width"], ev["peer_pcie_width"] = rw["pcie_width_min"], width_med
        if rw.get("nvlink_errors", 0) > 0:
            ev["nvlink_errors"] = rw["nvlink_errors"]
        if ev:
            out[int(rw["rank"])] = ev
    return out


def _localize_links(slow: list[tuple], rank_windows: dict[int, RankWindow]) -> tuple[list[Finding], set[int]]:
    if not slow:
        return [], set()
    sets = [set(c["members"]) for c, *_ in slow]
    common = set.intersection(*sets) if len(sets) > 1 else set()
    findings, covered = [], set()
    for c, ratio, z, cost in slow:
        suspects = _link_suspects(c["members"], rank_windows)
        if suspects:
            ranks, how = tuple(sorted(suspects)), "link hardware evidence"
        elif common and len(common) < len(c["members"]):
            ranks, how = tuple(sorted(common)), "the only member of every slow group"
        else:
            ranks, how = tuple(sorted(c["members"])), "not localized within the group"
        covered.update(c["members"])
        seen: list[Mapping[str, Any]] = [rank_windows.get(r, {}) for r in ranks]
        hosts = tuple(sorted({rw.get("host", "?") for rw in seen}))
        gpus = tuple(sorted({int(rw.get("gpu", -1)) for rw in seen}))
        summary = (f"collective {c['function']} transfers {ratio:.2f}x slower than its sibling groups "
                   f"({c['transfer_ms_median']:.2f} ms per call); slow link at rank(s) {short_ranks(ranks)} on "
                   f"{', '.join(hosts[:3])} ({how}); costs ~{cost:.1f} ms per step")
        evidence = {"transfer_ms_median": round(c["transfer_ms_median"], 3), "ratio": round(ratio, 3),
                    "robust_z": round(z, 1), "localized_by": how, "hardware": suspects,
                    "group_members": len(c["members"])}
        findings.append(Finding(kind=Kind.OUTLIER, cause=Cause.SLOW_LINK, identity=f"slow_link|{short_ranks(ranks)}",
                                ranks=ranks, hosts=hosts, gpus=gpus, function=c["function"], score=float(z),
                                impact_ms=float(cost), summary=summary, evidence=evidence))
    return _dedupe(findings), covered


def _dedupe(findings: list[Finding]) -> list[Finding]:
    best: dict[str, Finding] = {}
    for f in findings:
        if f.identity not in best or f.impact_ms > best[f.identity].impact_ms:
            best[f.identity] = f
    return list(best.values())

