"""Per-rank facts computed straight from parsed traces, independent of the detection core.

Used to *derive* what a correct diagnosis of a trace set must say (docs/trace-import.md)
and to check the import against it in tests. Inputs are the EventBatch dicts of
:func:`.kineto.parse_trace`; times are reported in microseconds.

* :func:`rank_table` -- per rank: step time, named span totals, GPU compute-kernel time
  and CPU-op time (from the op summaries), and time inside collectives.
* :func:`collective_matrix` -- per (group, op): ranks x seqs of time inside the call, and
  the last arriver of each seq (shortest time inside: it never waited).
* :func:`late_gap_us` -- how much earlier each seq would have finished had its last
  arriver come with the next-latest one (second-shortest minus shortest time inside).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ...schemas.vocabulary import OpKind


def _us(ns: float) -> float:
    return round(float(ns) / 1000.0, 1)


def span_totals_us(batch: dict) -> dict[str, float]:
    """Total duration (us) per span name of one batch."""
    totals: dict[str, float] = defaultdict(float)
    names = batch["names"]
    for n, d in zip(batch["spans"]["name"], batch["spans"]["dur_ns"], strict=True):
        totals[names[n]] += d / 1000.0
    return {k: round(v, 1) for k, v in totals.items()}


def rank_table(batches: dict[int, dict]) -> dict[int, dict[str, float]]:
    """rank -> step_us, compute_kernel_us, cpu_op_us, comm_us, and every span total."""
    out = {}
    for rank, b in sorted(batches.items()):
        ops = b["kernels"]
        row = {
            "step_us": _us(sum(b["iterations"]["dur_ns"])),
            "compute_kernel_us": _us(sum(o["total_ns"] for o in ops if o["kind"] == OpKind.CUDA_KERNEL)),
            "cpu_op_us": _us(sum(o["total_ns"] for o in ops if o["kind"] == OpKind.CPU_OP)),
            "comm_us": _us(sum(b["comms"]["dur_ns"])),
        }
        row.update(span_totals_us(b))
        out[rank] = row
    return out


def op_total_us(batches: dict[int, dict], name: str, kind: int = OpKind.CPU_OP) -> dict[int, float]:
    """rank -> total time (us) of one named op (e.g. ``cudaLaunchKernel`` is a runtime call,
    not an op summary; use CPU op names such as ``aten::mm``)."""
    out = {}
    for rank, b in sorted(batches.items()):
        total = sum(o["total_ns"] for o in b["kernels"] if o["kind"] == kind and b["names"][o["name"]] == name)
        out[rank] = _us(total)
    return out


def collective_matrix(batches: dict[int, dict]) -> dict[tuple[str, str], tuple[list[int], np.ndarray]]:
    """(group, op) -> (ranks, ranks x seqs matrix of time inside the call in us) over the seqs
    every rank reported."""
    per: dict[tuple[str, str], dict[int, dict[int, float]]] = defaultdict(dict)
    for rank, b in batches.items():
        c, names, groups = b["comms"], b["names"], b["groups"]
        for op, g, seq, dur in zip(c["op"], c["group"], c["seq"], c["dur_ns"], strict=True):
            per[(groups[g]["group_id"], names[op])].setdefault(rank, {})[int(seq)] = dur / 1000.0
    out = {}
    for key, by_rank in per.items():
        ranks = sorted(by_rank)
        common = sorted(set.intersection(*(set(by_rank[r]) for r in ranks)))
        out[key] = (ranks, np.array([[by_rank[r][s] for s in common] for r in ranks]).reshape(len(ranks), len(common)))
    return out


def last_arrivers(ranks: list[int], matrix: np.ndarray) -> list[int]:
    """Per seq, the rank with the shortest time inside the call (it arrived last)."""
    return [ranks[i] for i in np.argmin(matrix, axis=0)] if matrix.size else []


def late_gap_us(matrix: np.ndarray) -> np.ndarray:
    """Per seq, second-shortest minus shortest time inside (us): what the last arriver's
    lateness alone cost that call."""
    if matrix.shape[0] < 2:
        return np.zeros(matrix.shape[1])
    srt = np.sort(matrix, axis=0)
    return srt[1] - srt[0]
