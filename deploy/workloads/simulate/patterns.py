"""Pattern-level simulator: a data x tensor x pipeline job emitting FunctionPattern and
RankWindow dicts per window (what stage 1 would produce), vectorized over ranks.

Each step, per rank (ms, lognormal jitter): python ``Trainer.log_metrics``, data loading,
forward (GC pauses and MoE expert calls nested inside), tensor-parallel all-reduce,
pipeline send/recv across stages, backward, tensor-parallel all-reduce, data-parallel
all-reduce, optimizer, and every few windows an all-rank checkpoint. A collective ends
for all members at the last arrival + transfer; each member's time inside it is that end
minus its own arrival, so waits propagate across groups as in a real job. Steps land in
windows by the rank's host wall clock (hosts skewed by tens of ms). Noise: rare
one-window spikes on a random rank, sparse GC pauses, SW power-cap throttle bits.

Every rank is on a GPU (:mod:`.layout`), so each also reports what the collectors time
between CUDA events: the device time of its forward, backward and optimizer step
(``SpanKind.DEVICE`` patterns named ``cuda:`` + the host function's name, see
:mod:`.records`). The device time of a phase is its host time (the device waits for the
host's launches: CPU contention, a stage's extra layers, creep, a spike stretch both
alike), except under ``slow_gpu`` and ``gpu_throttle``: the device's forward, backward and
optimizer take ``magnitude`` times as long while the host's forward and optimizer spans do
not change (the host launches asynchronously and runs ahead) and its backward grows by the
device's excess of forward and backward (the host waits at the end of backward for the
gradients' all-reduce, as DDP does); the rank reaches its collectives, and ends its step,
as late as its device. That device-only excess is the GPU-side evidence the detection
needs to name a slow GPU.
"""

from __future__ import annotations

import numpy as np

from .faults import Fault
from .layout import Layout
from .records import emit_window

BASE_MS = {"dl": 25.0, "py": 3.0, "fwd": 100.0, "opt": 20.0}
RUNQUEUE_MS = 0.5  # a healthy rank's run-queue wait per step
XFER_MS = {"tp": 2.0, "pp": 3.0, "dp": 40.0}
EXPERT_CALLS, EXPERT_MS = 4, 6.0
CKPT_EVERY_WINDOWS, CKPT_MS = 6, 2500.0


class PatternSim:
    """Steps a job and emits closed windows; see the module docstring."""

    def __init__(self, layout: Layout, faults: tuple[Fault, ...] = (), seed: int = 0, job: str = "job",
                 window_s: float = 5.0, moe: bool = False, jitter: float = 0.05, spike_prob: float = 0.3):
        self.layout, self.faults, self.job, self.moe = layout, faults, job, moe
        self.rng = np.random.default_rng(seed)
        self.w_ms = window_s * 1000
        self.window_s = window_s
        self.jitter, self.spike_prob = jitter, spike_prob
        n = layout.ranks
        self.p, self.d, self.t = layout.coords()
        self.host = np.arange(n) // 8
        self.skew = self.rng.uniform(-30, 30, self.host.max() + 1)[self.host]
        f = BASE_MS["fwd"] * (1 + 0.08 * (self.p == 0) + 0.12 * ((self.p == layout.pp - 1) & (layout.pp > 1)))
        self.fwd_base = f
        self.clk = np.zeros(n) + self.rng.uniform(0, 50, n)
        self.steps: list[dict] = []
        self.step_no = 0
        self.next_window = 0
        self.spikes: dict[int, tuple[int, float]] = {}  # window -> (rank or -1, spike start ms)
        self.hung_at: float | None = None
        self.ckpt_done: set[int] = set()

    def _j(self, shape: int | tuple = 0) -> np.ndarray:
        n = shape or self.layout.ranks
        s = self.jitter
        return self.rng.lognormal(-s * s / 2, s, n)

    def _sync(self, c: np.ndarray, axis: int, xfer_ms: float, factor: np.ndarray | None = None):
        g = self.layout.grid(c)
        shape = list(g.shape)
        shape[axis] = 1
        xfer = xfer_ms * self.rng.lognormal(0, 0.03, shape)
        if factor is not None:
            xfer = xfer * factor.reshape(shape)
        end = g.max(axis=axis, keepdims=True) + xfer
        return np.broadcast_to(end, g.shape).reshape(-1).copy(), (end - g).reshape(-1)

    def _spike_rank(self, now_ms: float) -> int:
        """Noise: per window, maybe one random rank slowed for half a window at a random offset."""
        w = int(now_ms // self.w_ms)
        if w not in self.spikes:
            hit = self.rng.random() < self.spike_prob
            rank = int(self.rng.integers(self.layout.ranks)) if hit else -1
            self.spikes[w] = (rank, (w + self.rng.uniform(0, 0.5)) * self.w_ms)
        rank, start = self.spikes[w]
        return rank if start <= now_ms < start + 0.5 * self.w_ms else -1

    def run_step(self) -> None:
        lay, n = self.layout, self.layout.ranks
        w_now = float(np.median(self.clk)) / self.w_ms
        v = {"dl": BASE_MS["dl"] * self._j(), "py": BASE_MS["py"] * self._j(),
             "fwd": self.fwd_base * self._j(), "bwd": 2 * self.fwd_base * self._j(),
             "opt": BASE_MS["opt"] * self._j(),
             "gc": (self.rng.random(n) < 0.03) * 10.0 * self._j(),
             "calls": np.full(n, EXPERT_CALLS if self.moe else 0, dtype=np.float64),
             "gpu_x": np.ones(n),  # device slowdown of fwd/bwd/opt already in them (slow_gpu, gpu_throttle)
             "rq": np.full(n, RUNQUEUE_MS)}  # run-queue wait (scheduler evidence); no draw: the noise stays as it was
        spike = self._spike_rank(float(np.median(self.clk)))
        if spike >= 0:
            v["fwd"][spike] *= 1.6
            v["bwd"][spike] *= 1.6
        links = {"dp": np.ones(lay.pp * lay.tp), "pp": np.ones(lay.dp * lay.tp)}
        for f in self.faults:
            if f.active(w_now) and self.step_no % f.every == 0:
                apply_fault(self, f, v, links, w_now)
        v["experts"] = v["calls"] * EXPERT_MS * self._j()
        w_int = int(w_now)
        ckpt = 0.0
        if w_int % CKPT_EVERY_WINDOWS == CKPT_EVERY_WINDOWS - 1 and w_int not in self.ckpt_done:
            self.ckpt_done.add(w_int)
            ckpt = CKPT_MS
        start = self.clk.copy()
        fwd_total = v["fwd"] + v["experts"] + v["gc"]
        c = start + v["py"] + v["dl"] + fwd_total
        # v holds device times (the clock follows them); the host's: module docstring
        excess = {k: v[k] * (1 - 1 / v["gpu_x"]) for k in ("fwd", "bwd", "opt")}
        rec = {"start": start, "dl": v["dl"], "py": v["py"], "fwd": fwd_total - excess["fwd"],
               "bwd": v["bwd"] + excess["fwd"], "opt": v["opt"] - excess["opt"],
               "dev_fwd": fwd_total, "dev_bwd": v["bwd"], "dev_opt": v["opt"],
               "gc": v["gc"], "experts": v["experts"], "calls": v["calls"], "ckpt": np.full(n, ckpt),
               "rq": v["rq"]}
        if lay.tp > 1:
            c, rec["tp1"] = self._sync(c, 2, XFER_MS["tp"])
        if lay.pp > 1:
            c, rec["pp"] = self._sync(c, 0, XFER_MS["pp"], links["pp"])
        c = c + v["bwd"]
        if lay.tp > 1:
            c, rec["tp2"] = self._sync(c, 2, XFER_MS["tp"])
        if lay.dp > 1:
            c, rec["dp"] = self._sync(c, 1, XFER_MS["dp"], links["dp"])
        c = c + v["opt"] + ckpt
        rec["iter"] = c - start
        rec["end_wall"] = c + self.skew
        rec["step"] = self.step_no
        self.steps.append(rec)
        self.clk = c
        self.step_no += 1

    def windows(self, count: int):
        """Yield (window_id, records) for windows 0..count-1 as they close."""
        while self.next_window < count:
            end = (self.next_window + 1) * self.w_ms
            while self.hung_at is None and (self.clk + self.skew).min() < end + 200:
                self.run_step()
            yield self.next_window, emit_window(self, self.next_window)
            self.steps = [s for s in self.steps if (s["end_wall"] >= end).any()]
            self.next_window += 1


def apply_fault(sim: PatternSim, f: Fault, v: dict, links: dict, w_now: float) -> None:
    """Mutate this step's per-rank times for one active fault."""
    r = np.asarray(f.ranks, dtype=np.int64)
    m = f.magnitude
    fam = f.family
    if fam in ("slow_gpu", "gpu_throttle"):  # on the device: run_step derives the host's times
        for k in ("fwd", "bwd", "opt"):
            v[k][r] *= m
        v["gpu_x"][r] *= m
    elif fam == "cpu_contention":
        before = sum(v[k][r] for k in ("dl", "py", "opt", "fwd", "bwd"))
        for k in ("dl", "py", "opt"):
            v[k][r] *= m
        for k in ("fwd", "bwd"):
            v[k][r] *= 1 + (m - 1) * 0.5
        # the extra time is the thread waiting for a CPU: what the scheduler counts as run-queue wait
        v["rq"][r] += sum(v[k][r] for k in ("dl", "py", "opt", "fwd", "bwd")) - before
    elif fam == "slow_dataloader":
        v["dl"][r] += m
    elif fam == "gc_pause":
        v["gc"][r] += m
    elif fam in ("shared_gc", "shared_dataloader", "shared_python"):
        v[{"shared_gc": "gc", "shared_dataloader": "dl", "shared_python": "py"}[fam]] += m
    elif fam == "stage_imbalance":
        s = sim.p == f.stage
        v["fwd"][s] *= m
        v["bwd"][s] *= m
    elif fam == "data_imbalance":
        v["calls"][r] = np.round(EXPERT_CALLS * m)
    elif fam == "creep":
        grow = 1 + 0.04 * (w_now - f.start_window + 1)
        v["fwd"] *= grow
        v["bwd"] *= grow
    elif fam == "slow_link":
        lay = sim.layout
        for rank in r:
            links["dp"][sim.p[rank] * lay.tp + sim.t[rank]] = m
            links["pp"][sim.d[rank] * lay.tp + sim.t[rank]] = m
    elif fam == "hang" and sim.hung_at is None and w_now >= f.start_window + 0.2:
        sim.hung_at = w_now
