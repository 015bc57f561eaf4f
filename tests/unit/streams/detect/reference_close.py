"""The close one window and one function at a time (as the product closed windows before the
columnar close, :mod:`perftracker_ml.streams.detect.window_close`; each function's numbers from
one ``percentiles`` and one ``histogram`` call): the oracle test_window_close.py holds the
product to. Each window's accumulators (``WindowAcc.functions``) get the per-kind aggregates,
then one FunctionPattern per function, sorted by name, then the RankWindow."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from perftracker_ml.schemas.records import FunctionPattern
from perftracker_ml.schemas.vocabulary import (
    FUNCTION_PATTERN,
    FUNCTION_PATTERN_VERSION,
    RANK_WINDOW,
    SpanKind,
)
from perftracker_ml.streams.detect.accumulate import FunctionAcc, RankMeta, WindowAcc
from perftracker_ml.streams.detect.device_evidence import (
    DEVICE_AGGREGATES,
    DEVICE_PREFIX,
    device_phase,
)
from perftracker_ml.streams.detect.histogram import histogram
from perftracker_ml.streams.detect.model import COMM_PREFIX, KIND_PREFIX, kind_function
from perftracker_ml.streams.detect.quantiles import percentiles
from perftracker_ml.streams.detect.rank_records import (
    ALWAYS_AGGREGATED,
    Closing,
    Routed,
    rank_window_record,
    signature_of,
    window_fields,
)
from perftracker_ml.streams.detect.step_gating import recorded_steps


class PatternSource(NamedTuple):
    """What one window's FunctionPatterns are made of: its rank, window, signature, functions
    (sorted) and the steps its per-step figures divide by."""

    meta: RankMeta
    window_id: int
    window_s: float
    signature: str
    functions: list[tuple[str, FunctionAcc]]
    steps: int


def pattern_records(sources: Sequence[PatternSource]) -> list[list[FunctionPattern]]:
    """FunctionPattern of each function of each window (collectives: their per-seq durations
    first), one function at a time: ``percentiles`` and ``histogram`` of its values."""
    out: list[list[FunctionPattern]] = []
    for src in sources:
        header = window_fields(FUNCTION_PATTERN_VERSION, src.meta, src.window_id, src.window_s, src.signature)
        mesh = {str(key): int(v) for key, v in src.meta.mesh_coords.items()}
        patterns = []
        for name, acc in src.functions:
            d = np.sort(np.asarray((acc.seq_durs if acc.seqs else []) + acc.durations, dtype=np.int64))
            p50, p90, p99 = percentiles(d)
            first, hist = histogram(d)
            patterns.append(FunctionPattern(
                **header, function=name, kind=int(acc.kind), steps=int(src.steps),
                count=int(len(d) + acc.overflow), total_ns=int(d.sum()),
                p50_ns=int(p50), p90_ns=int(p90), p99_ns=int(p99), max_ns=int(d[-1]) if len(d) else 0,
                hist=[], bytes=int(acc.bytes),
                seqs=acc.seqs, seq_dur_ns=acc.seq_durs, mesh_coords=dict(mesh), hist_first=first, hist_counts=hist,
                **as_range(list(acc.group_ranks))))
        out.append(patterns)
    return out


def as_range(ranks: list[int]) -> dict:
    """The pattern's member fields: three or more equally spaced increasing ranks as a range
    (FunctionPattern v3), anything else listed."""
    step = ranks[1] - ranks[0] if len(ranks) >= 3 else 0
    if step >= 1 and ranks == [ranks[0] + i * step for i in range(len(ranks))]:
        return {"group_ranks": [], "group_ranks_first": ranks[0], "group_ranks_step": step,
                "group_ranks_count": len(ranks)}
    return {"group_ranks": ranks, "group_ranks_first": 0, "group_ranks_step": 0, "group_ranks_count": 0}


def close_windows(closing: Sequence[Closing]) -> list[Routed]:
    """Each closed window's records, in order: [("FunctionPattern", rec), ..., ("RankWindow", rec)],
    its functions sorted, with the patterns of every window computed together
    (:func:`pattern_records`): a timer tick closes one window of each of a job's ranks, and the
    numpy calls then run once for all of them instead of once per rank."""
    parts: list[PatternSource] = []
    signatures: list[str] = []
    for c in closing:
        w = c.w
        sig = signature_of(w.functions)
        if w.functions or w.steps:
            add_kind_aggregates(w)
        # a rank gated to one step in n (step_gating) has its functions' times of the recorded steps only
        per = recorded_steps(w.steps, c.meta.functional_steps)
        parts.append(PatternSource(c.meta, c.window_id, c.window_s, sig, sorted(w.functions.items()), per))
        signatures.append(sig)
    out: list[Routed] = []
    for c, sig, patterns in zip(closing, signatures, pattern_records(parts), strict=True):
        out += [(FUNCTION_PATTERN, p) for p in patterns]
        functions = sorted(n for n in c.w.functions if not n.startswith(KIND_PREFIX))
        out.append((RANK_WINDOW, rank_window_record(c.meta, c.window_id, c.window_s, sig, c.w, c.progress,
                                                     c.health, functions, batches=c.batches, ended=c.ended)))
    return out




def add_kind_aggregates(w: WindowAcc) -> None:
    """Add ``kind:<name>`` patterns (sum of that kind's spans) so every rank reports
    GC, data loading, forward, backward and optimizer time, even when it is zero, and, on a
    rank with device spans, their sums per phase (:data:`.device_evidence.DEVICE_AGGREGATES`)."""
    totals: dict[int, list[int]] = {int(k): [] for k in ALWAYS_AGGREGATED}
    device: dict[int, list[int]] | None = None
    for name, acc in w.functions.items():
        if acc.kind in totals and not name.startswith(COMM_PREFIX):
            totals[acc.kind].extend(acc.durations)
        elif acc.kind == SpanKind.DEVICE and name.startswith(DEVICE_PREFIX):
            device = device if device is not None else {k: [] for k in DEVICE_AGGREGATES}
            phase = device_phase(name)
            if phase in device:
                device[phase].extend(acc.durations)
    for kind, durs in totals.items():
        w.functions[kind_function(kind)] = FunctionAcc(kind, durations=durs)
    for phase, durs in (device or {}).items():  # a GPU rank's device time per phase
        w.functions[DEVICE_AGGREGATES[phase]] = FunctionAcc(int(SpanKind.DEVICE), durations=durs)
