"""Synthetic ranks at any scale: one EventBatch per rank per simulated second, vectorized.

A tensor- and data-parallel layout (:class:`Layout`) of ``ranks`` ranks runs a step of
``functions`` timed functions every ``STEP_MS``; rank ``SLOW_RANK``'s layer ``SLOW_LAYER`` is
``SLOW_EXCESS_MS`` slower, and its data-parallel peers wait that long in their all-reduce
(victims). Batches are built from per-class step templates with numpy, fast enough to feed
100,000 ranks (``benchmarks.scale``, ``benchmarks.catch_up``, the stream tests).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ...collectors.groups import group_ref
from ...schemas.records import group_entry
from ...schemas.vocabulary import SpanKind

MS = 1_000_000
STEP_MS = 250
STEPS_PER_S = 1000 // STEP_MS
SLOW_RANK = 1
SLOW_LAYER = 3
SLOW_EXCESS_MS = 5.0
TICK_MS = 500  # the stages' timer (topology.POLL_INTERVAL_S)


@dataclasses.dataclass(frozen=True)
class Layout:
    ranks: int
    tp: int
    pp: int

    @classmethod
    def for_ranks(cls, ranks: int) -> Layout:
        tp = 8 if ranks >= 64 else 1
        pp = 4 if ranks >= 512 else 1
        if ranks % (tp * pp):
            raise ValueError(f"ranks ({ranks}) must be a multiple of tp*pp ({tp * pp})")
        return cls(ranks, tp, pp)

    @property
    def dp(self) -> int:
        return self.ranks // (self.tp * self.pp)

    def dp_members(self, rank: int) -> list[int]:
        stage, t = rank // (self.dp * self.tp), rank % self.tp
        base = stage * self.dp * self.tp + t
        return [base + d * self.tp for d in range(self.dp)]

    def tp_members(self, rank: int) -> list[int]:
        first = rank - rank % self.tp
        return list(range(first, first + self.tp))


@dataclasses.dataclass
class StepTemplate:
    """One step's events of a rank class as columns (offsets from the step start, ns)."""

    span_kind: np.ndarray
    span_name: np.ndarray
    span_off: np.ndarray
    span_dur: np.ndarray
    comm_op: np.ndarray
    comm_group: np.ndarray  # 0 = TP group, 1 = DP group
    comm_seq: np.ndarray  # per group, within the step
    comm_bytes: np.ndarray
    comm_off: np.ndarray
    comm_dur: np.ndarray
    step_ns: int


def names_for(functions: int) -> list[str]:
    if functions < 7:
        raise ValueError(f"functions ({functions}) must be at least 7")
    fixed = ["torch.utils.data.DataLoader.__next__", "model.GPT.forward", "train.loss", "torch.autograd.backward",
             "clip_grad_norm_", "torch.optim.adamw.AdamW.step"]
    layers = [f"model.layers.{i}.forward" for i in range(functions - len(fixed))]
    return fixed + layers + ["all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce"]


def step_template(functions: int, tp: bool, slow: bool, wait_ms: float) -> StepTemplate:
    """A rank's step: ``slow``: its layer block is SLOW_EXCESS_MS longer (arrives last);
    ``wait_ms``: extra wait in the last DP bucket (a victim of the slow rank)."""
    names = names_for(functions)
    idx = {n: i for i, n in enumerate(names)}
    layers = functions - 6
    spans: list[tuple[int, int, float, float]] = []  # kind, name, offset ms, dur ms
    comms: list[tuple[int, int, int, int, float, float]] = []  # op, group, seq, bytes, offset, dur
    t = 0.0
    spans.append((SpanKind.DATALOADER, 0, t, 4.0))
    t += 4.0
    fwd0, layer_ms = t, 60.0 / layers
    for i in range(layers):
        d = layer_ms + (SLOW_EXCESS_MS if slow and i == SLOW_LAYER else 0.0)
        spans.append((SpanKind.PYTHON, 6 + i, t + 0.1, d - 0.2))
        t += d
    if tp:
        for i in range(4):
            comms.append((idx["all_gather_into_tensor"], 0, i, 8 << 20, fwd0 + (i + 1) * 12.0, 0.8))
    t += 2.0
    spans.append((SpanKind.FORWARD, 1, fwd0, t - fwd0))
    spans.append((SpanKind.USER, 2, t, 1.0))
    t += 1.0
    bwd0 = t
    if tp:
        for i in range(4):
            comms.append((idx["reduce_scatter_tensor"], 0, 4 + i, 8 << 20, bwd0 + (i + 1) * 25.0, 0.8))
    t += 130.0
    for b in range(6):
        d = 4.0 + (wait_ms if b == 5 else 0.0)
        comms.append((idx["all_reduce"], 1, b, 25 << 20, t - (6 - b) * 4.0, d))
    t += wait_ms
    spans.append((SpanKind.BACKWARD, 3, bwd0, t - bwd0))
    spans.append((SpanKind.PYTHON, 4, t, 3.0))
    t += 3.0
    spans.append((SpanKind.OPTIMIZER, 5, t, 20.0))
    t += 20.0
    s = np.array(spans, dtype=np.float64).reshape(-1, 4)
    c = np.array(comms, dtype=np.float64).reshape(-1, 6)
    return StepTemplate(s[:, 0].astype(np.int64), s[:, 1].astype(np.int64), (s[:, 2] * MS).astype(np.int64),
                        s[:, 3] * MS, c[:, 0].astype(np.int64), c[:, 1].astype(np.int64),
                        c[:, 2].astype(np.int64), c[:, 3].astype(np.int64), (c[:, 4] * MS).astype(np.int64),
                        c[:, 5] * MS, int(t * MS))


class SyntheticRanks:
    """One batch per rank per simulated second, built from the step templates (vectorized per rank)."""

    def __init__(self, ranks: int, functions: int = 30, job: str = "scale", seed: int = 0,
                 jitter: float = 0.03, wall0_ns: int = 1_700_000_000_000 * MS, slow_from_s: int = 0):
        self.layout = Layout.for_ranks(ranks)
        self.job, self.jitter, self.wall0_ns = job, jitter, wall0_ns
        self.slow_from_s = slow_from_s  # the slow rank (and its victims' wait) from this simulated second on
        self.rng = np.random.default_rng(seed)
        self.mono0 = self.rng.integers(10**12, 10**13, ranks)
        self.names = names_for(functions)
        tp = self.layout.tp > 1
        slow_dp = set(self.layout.dp_members(SLOW_RANK)) if ranks > SLOW_RANK else set()
        self.templates = {"normal": step_template(functions, tp, False, 0.0),
                          "slow": step_template(functions, tp, True, 0.0),
                          "victim": step_template(functions, tp, False, SLOW_EXCESS_MS)}
        self.kind = ["slow" if r == SLOW_RANK else "victim" if r in slow_dp else "normal" for r in range(ranks)]
        self._groups: dict[tuple[str, int], dict] = {}
        self.events_per_batch = 0

    def _group(self, which: str, rank: int) -> dict:
        members = self.layout.tp_members(rank) if which == "tp" else self.layout.dp_members(rank)
        key = (which, members[0])
        g = self._groups.get(key)
        if g is None:
            ref = group_ref(f"{which}{members[0]}", members)
            g = self._groups[key] = group_entry(ref.group_id, ref.ranks)  # as the collectors write EventBatch v9
        return g

    def batch(self, rank: int, second: int, seconds: int = 1) -> dict[str, Any]:
        """The batch rank ``rank`` sends at the end of simulated second ``second + seconds - 1``
        (0-based), holding the events of the ``seconds`` seconds from ``second`` on (a collector
        sending one batch per ``seconds``: its batch number ``second // seconds``). Before
        ``slow_from_s`` every rank runs the normal step; a batch may not span that second."""
        if second < self.slow_from_s < second + seconds:
            raise ValueError(f"a batch of seconds {second}..{second + seconds - 1} spans the onset {self.slow_from_s}")
        t = self.templates[self.kind[rank] if second >= self.slow_from_s else "normal"]
        steps = np.arange(second * STEPS_PER_S, (second + seconds) * STEPS_PER_S)
        base = self.mono0[rank] + steps * STEP_MS * MS
        ns, nc = len(t.span_kind), len(t.comm_op)
        jit_s = self.rng.lognormal(0.0, self.jitter, (len(steps), ns))
        jit_c = self.rng.lognormal(0.0, self.jitter, (len(steps), nc))
        nseq = np.bincount(t.comm_group, minlength=2)
        seq = steps[:, None] * nseq[t.comm_group][None, :] + t.comm_seq[None, :]
        groups = [self._group("tp", rank), self._group("dp", rank)] if self.layout.tp > 1 else \
            [self._group("dp", rank)]
        group_col = t.comm_group if self.layout.tp > 1 else t.comm_group - 1
        rec = {
            "job": self.job, "rank": rank, "local_rank": rank % 8, "world_size": self.layout.ranks,
            "host": f"node{rank // 8:05d}", "gpu": rank % 8, "gpu_uuid": "", "pid": 10_000 + rank,
            "seq": second // seconds, "dropped_events": 0,
            "mono_ns": int(self.mono0[rank] + (second + seconds) * 1_000_000_000),
            "wall_ns": int(self.wall0_ns + (second + seconds) * 1_000_000_000),
            "names": self.names, "groups": groups,
            "iterations": {"step": steps.tolist(), "start_ns": base.tolist(),
                           "dur_ns": [t.step_ns] * len(steps)},
            "spans": {"kind": np.tile(t.span_kind, len(steps)).tolist(),
                      "name": np.tile(t.span_name, len(steps)).tolist(), "path": [-1] * (ns * len(steps)),
                      "step": np.repeat(steps, ns).tolist(),
                      "start_ns": (base[:, None] + t.span_off[None, :]).ravel().tolist(),
                      "dur_ns": (t.span_dur[None, :] * jit_s).astype(np.int64).ravel().tolist()},
            "comms": {"op": np.tile(t.comm_op, len(steps)).tolist(),
                      "group": np.tile(group_col, len(steps)).tolist(), "seq": seq.ravel().tolist(),
                      "bytes": np.tile(t.comm_bytes, len(steps)).tolist(), "step": np.repeat(steps, nc).tolist(),
                      "start_ns": (base[:, None] + t.comm_off[None, :]).ravel().tolist(),
                      "dur_ns": (t.comm_dur[None, :] * jit_c).astype(np.int64).ravel().tolist()},
            "kernels": [], "cpu": [], "stacks": {"frame": [], "line": [], "kind": [], "count": [], "code": []},
        }
        self.events_per_batch = len(steps) * (1 + ns + nc)
        return rec
