"""A 3D-parallel training job's EventBatches, built by the collectors' own BatchBuilder.

Each rank records, per step, the event tuples the collector's hooks append
(:mod:`perftracker_ml.collectors.events` layouts): a data-loader fetch, the root forward,
``torch.autograd.backward``, a ``timed`` user block (loss) and a ``@timed`` Python
function (gradient clipping), the optimizer step, now and then a GC pause, and the
collectives of tensor, pipeline and data parallelism: per step ``tp_collectives``
all-gathers in forward and as many reduce-scatters in backward in the rank's TP group,
one send and one recv to the neighbouring pipeline stages (point-to-point pair groups),
and ``dp_buckets`` gradient all-reduces in the DP group nested at the end of backward.
With the defaults that is about 23 events per 250 ms step, ~92 events per rank per
second. Every ``flush_s`` the rank's events go through
:class:`perftracker_ml.collectors.batch.BatchBuilder` (so names, groups and columns are
exactly what a collector sends); the header's ``wall_ns``/``mono_ns`` are then set to
the simulated send time, as a live collector's would be. With the collector's defaults
each batch also carries one CPU-evidence sample and the stack sampler's rows of that
second (25 Hz: nine frames, :data:`STACK_ROWS`). Durations are lognormal around the
nominal ones; each rank has its own monotonic origin and each host a wall-clock skew.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ...collectors.batch import BatchBuilder
from ...collectors.events import COMM, ITER, SPAN, GroupRef
from ...collectors.groups import group_ref, pair_ref
from ...collectors.identity import RankIdentity
from ...schemas.vocabulary import SpanKind

MS = 1_000_000
GPUS_PER_HOST = 8
FETCH = "torch.utils.data.DataLoader.__next__"
FORWARD = "megatron.core.models.gpt.gpt_model.GPTModel.forward"
BACKWARD = "torch.autograd.backward"
LOSS = "train.loss"
CLIP = "megatron.core.optimizer.clip_grads.clip_grad_norm_fp32"
OPTIMIZER = "torch.optim.adamw.AdamW.step"
GC_NAMES = ("gc.gen0", "gc.gen1", "gc.gen2")
# the stack sampler's rows of one second at 25 Hz (file function, line, kind 0 innermost / 1 user frame,
# samples, source text): where a training loop's thread is found most of the time
STACK_ROWS = (
    ("/usr/lib/python3.11/site-packages/torch/autograd/graph.py _engine_run_backward", 825, 0, 11,
     "return Variable._execution_engine.run_backward("),
    ("/usr/lib/python3.11/site-packages/torch/nn/modules/module.py _call_impl", 1747, 0, 7,
     "return forward_call(*args, **kwargs)"),
    ("/usr/lib/python3.11/site-packages/torch/optim/adamw.py _fused_adamw", 760, 0, 3, "torch._fused_adamw_("),
    ("/usr/lib/python3.11/site-packages/torch/utils/data/dataloader.py __next__", 708, 0, 2,
     "data = self._next_data()"),
    ("/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py all_reduce", 2806, 0, 2,
     "work = group.allreduce([tensor], opts)"),
    ("/workspace/train.py train_step", 214, 1, 12, "loss.backward()"),
    ("/workspace/train.py train_step", 209, 1, 8, "loss = model(batch).loss"),
    ("/workspace/train.py train_step", 218, 1, 3, "optimizer.step()"),
    ("/workspace/train.py main", 301, 1, 2, "batch = next(loader)"),
)
# nominal durations (ms) of one 250 ms step
NOMINAL_MS = {"fetch": 4.0, "forward": 75.0, "loss": 1.0, "backward": 140.0, "clip": 3.0,
              "optimizer": 20.0, "gc": 2.0, "tp": 0.8, "p2p": 1.5, "bucket": 4.0}


@dataclass(frozen=True)
class Workload:
    """Job shape and collector rate; ``ranks`` must be a multiple of ``tp * pp``."""

    ranks: int = 1024
    seconds: int = 12
    tp: int = 8
    pp: int = 4
    step_ms: float = 250.0
    tp_collectives: int = 4
    dp_buckets: int = 6
    gc_every: int = 10  # one GC pause every this many steps (on average)
    flush_s: float = 1.0
    jitter: float = 0.05
    seed: int = 0
    job: str = "bench"

    @property
    def dp(self) -> int:
        return self.ranks // (self.tp * self.pp)

    def check(self) -> None:
        if self.ranks <= 0 or self.ranks % (self.tp * self.pp):
            raise ValueError(f"ranks ({self.ranks}) must be a positive multiple of tp*pp ({self.tp * self.pp})")


class _Groups:
    """The TP, DP and pipeline pair groups of every rank (Megatron order: tp fastest)."""

    def __init__(self, w: Workload):
        self.w = w
        self.tp: dict[int, GroupRef] = {}
        self.dp: dict[tuple[int, int], GroupRef] = {}
        self._pp_parent: dict[tuple[int, int], GroupRef] = {}

    def coords(self, rank: int) -> tuple[int, int, int]:
        w = self.w
        return rank // (w.dp * w.tp), (rank // w.tp) % w.dp, rank % w.tp

    def tp_group(self, rank: int) -> GroupRef:
        first = rank - rank % self.w.tp
        if first not in self.tp:
            self.tp[first] = group_ref(f"tp{first}", list(range(first, first + self.w.tp)))
        return self.tp[first]

    def dp_group(self, rank: int) -> GroupRef:
        p, _, t = self.coords(rank)
        if (p, t) not in self.dp:
            base = p * self.w.dp * self.w.tp + t
            self.dp[(p, t)] = group_ref(f"dp{p}.{t}", [base + d * self.w.tp for d in range(self.w.dp)])
        return self.dp[(p, t)]

    def pp_pair(self, src: int, dst: int) -> GroupRef:
        key = (min(src, dst), max(src, dst))
        if key not in self._pp_parent:
            self._pp_parent[key] = group_ref(f"pp{key[0]}.{key[1]}", list(key))
        return pair_ref(self._pp_parent[key], src, dst)


def _rank_step(w: Workload, g: _Groups, rank: int, step: int, t0: int, d: dict[str, float],
               seqs: dict[str, int], gc_pause: bool) -> list[tuple]:
    """Event tuples of one rank's step starting at ``t0`` (ns, rank's monotonic clock)."""
    ev: list[tuple] = []
    p, _, _ = g.coords(rank)
    stage = w.ranks // w.pp
    t = t0
    ev.append((SPAN, int(SpanKind.DATALOADER), FETCH, step, t, int(d["fetch"])))
    t += int(d["fetch"])
    fwd0 = t
    tp, dp = g.tp_group(rank), g.dp_group(rank)
    for i in range(w.tp_collectives):  # sequence-parallel all-gathers inside forward
        at = fwd0 + int(d["forward"] * (i + 1) / (w.tp_collectives + 1))
        seqs[tp.group_id] = seqs.get(tp.group_id, -1) + 1
        ev.append((COMM, "all_gather_into_tensor", tp, seqs[tp.group_id], 8 << 20, step, at, int(d["tp"])))
    if gc_pause:
        ev.append((SPAN, int(SpanKind.GC), GC_NAMES[step % 3], step, fwd0 + int(d["forward"] / 2), int(d["gc"])))
    t += int(d["forward"])
    ev.append((SPAN, int(SpanKind.FORWARD), FORWARD, step, fwd0, t - fwd0))
    if p < w.pp - 1:  # activations to the next stage
        pair = g.pp_pair(rank, rank + stage)
        ev.append((COMM, "send", pair, step, 16 << 20, step, t, int(d["p2p"])))
    ev.append((SPAN, int(SpanKind.USER), LOSS, step, t, int(d["loss"])))
    t += int(d["loss"])
    bwd0 = t
    if p > 0:  # gradients back to the previous stage
        pair = g.pp_pair(rank - stage, rank)
        ev.append((COMM, "recv", pair, step, 16 << 20, step, bwd0, int(d["p2p"])))
    for i in range(w.tp_collectives):
        at = bwd0 + int(d["backward"] * (i + 1) / (w.tp_collectives + 2))
        seqs[tp.group_id] += 1
        ev.append((COMM, "reduce_scatter_tensor", tp, seqs[tp.group_id], 8 << 20, step, at, int(d["tp"])))
    t += int(d["backward"])
    for b in range(w.dp_buckets):  # DDP buckets: all-reduces nested at the end of backward
        at = t - int((w.dp_buckets - b) * d["bucket"])
        seqs[dp.group_id] = seqs.get(dp.group_id, -1) + 1
        ev.append((COMM, "all_reduce", dp, seqs[dp.group_id], 25 << 20, step, at, int(d["bucket"])))
    ev.append((SPAN, int(SpanKind.BACKWARD), BACKWARD, step, bwd0, t - bwd0))
    ev.append((SPAN, int(SpanKind.PYTHON), CLIP, step, t, int(d["clip"])))
    t += int(d["clip"])
    ev.append((SPAN, int(SpanKind.OPTIMIZER), OPTIMIZER, step, t, int(d["optimizer"])))
    t += int(d["optimizer"])
    ev.append((ITER, step, t0, t - t0))
    return ev


def _end_ns(ev: tuple) -> int:
    """When the event was recorded (its end) on the rank's clock."""
    tag = ev[0]
    if tag == SPAN:
        return int(ev[4] + ev[5])
    if tag == COMM:
        return int(ev[6] + ev[7])
    return int(ev[2] + ev[3])


def _cpu_sample(flush_s: float, rng: np.random.Generator) -> dict:
    """One flush interval's CPU evidence, as ``CpuEvidence.collect`` records it (defaults on)."""
    interval = int(flush_s * 1e9)
    return {"interval_ns": interval, "thread_cpu_ns": int(interval * rng.uniform(0.85, 0.98)),
            "runqueue_wait_ns": int(rng.integers(1, 5) * MS), "voluntary_switches": int(rng.integers(200, 400)),
            "involuntary_switches": int(rng.integers(0, 20)), "major_faults": 0, "load1": 9.5,
            "steal_pct": 0.0, "cpus": 96, "stack_samples": 25, "stack_hz": 25.0}


def identity(w: Workload, rank: int) -> RankIdentity:
    host = rank // GPUS_PER_HOST
    return RankIdentity(w.job, rank, rank % GPUS_PER_HOST, w.ranks, f"node{host:05d}",
                        rank % GPUS_PER_HOST, "", 10_000 + rank)


def batches(w: Workload, wall0_ns: int = 1_700_000_000_000 * MS) -> Iterator[tuple[int, dict]]:
    """(rank, EventBatch dict) in send order: every ``flush_s``, one batch per rank."""
    w.check()
    rng = np.random.default_rng(w.seed)
    g = _Groups(w)
    builders = [BatchBuilder(identity(w, r), compact_groups=True) for r in range(w.ranks)]  # as collectors write v9
    mono0 = rng.integers(10**12, 10**13, w.ranks)
    skew = rng.integers(-50, 50, w.ranks // GPUS_PER_HOST + 1) * MS
    seqs: list[dict[str, int]] = [{} for _ in range(w.ranks)]
    pending: list[list[tuple]] = [[] for _ in range(w.ranks)]
    clock = np.zeros(w.ranks, dtype=np.int64)  # job time (ns) of each rank's next step
    step, flush_ns = 0, int(w.flush_s * 1e9)
    for flush in range(1, int(w.seconds / w.flush_s) + 1):
        end = flush * flush_ns
        while clock.min() < end:
            scale = rng.lognormal(0, w.jitter, (len(NOMINAL_MS), w.ranks))
            gc = rng.random(w.ranks) < 1 / max(w.gc_every, 1)
            for r in range(w.ranks):
                d = {k: NOMINAL_MS[k] * MS * scale[i, r] for i, k in enumerate(NOMINAL_MS)}
                ev = _rank_step(w, g, r, step, int(mono0[r] + clock[r]), d, seqs[r], bool(gc[r]))
                pending[r].extend(ev)
                clock[r] += ev[-1][3]  # the iteration's duration
            clock[:] = clock.max()  # synchronous steps: everyone leaves the last collective together
            step += 1
        for r in range(w.ranks):
            cut = int(mono0[r] + end)
            done = [e for e in pending[r] if _end_ns(e) <= cut]  # recorded by now
            pending[r] = [e for e in pending[r] if _end_ns(e) > cut]
            rec = builders[r].build(done, 0, (), [_cpu_sample(w.flush_s, rng)], STACK_ROWS)
            rec["mono_ns"] = int(mono0[r] + end)
            rec["wall_ns"] = int(wall0_ns + end + skew[r // GPUS_PER_HOST])
            yield r, rec
