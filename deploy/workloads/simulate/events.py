"""Event-level simulator: a data-parallel job (gloo-like) emitting EventBatch dicts.

Each step on rank r: dataloader, forward (optionally a GC pause inside), backward with
the gradient all-reduce nested at its end, optimizer. The all-reduce ends for everyone
at max(arrival) + transfer; a rank's time inside it is that end minus its own arrival.
Each host has its own wall-clock skew (tens of ms) and each rank its own monotonic
origin, so nothing but durations and seqs can be compared across ranks. Each batch also
carries one CPU sample (EventBatch v3 ``cpu``): run-queue wait of ~2 % of the step on
every rank, plus, on a CPU-contended rank, the time its step lost to the contention.

A GPU job (``EventJob.gpu``) also emits what the collectors time between CUDA events on a
CUDA rank: per step, the device time of forward, backward and the optimizer step, a
``SpanKind.DEVICE`` span named ``cuda:`` + the host span's name, starting with it. The
device time is the host time (the device waits for the host's launches: CPU contention,
a GC pause or a late entry stretch both alike), except under ``slow-gpu``: the rank's
device needs ``magnitude_ms`` more per step, spread over its forward, backward and
optimizer in proportion; its host forward and optimizer spans stay as they were (the
host launches asynchronously and runs ahead), its host backward grows by the device's
excess of forward and backward (the host waits at the end of backward for the
gradients' all-reduce, as DDP does), and the rank arrives at the all-reduce and finishes
its step as late as its device. That device-only excess is the evidence the detection
needs to name a slow GPU; a CPU job (the default) has no device spans.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ....collectors.cuda_timing import DEVICE_PREFIX
from ....schemas.vocabulary import SpanKind

MS = 1_000_000
DEVICE = int(SpanKind.DEVICE)
STACK_HZ = 25.0


@dataclass(frozen=True)
class EventFault:
    kind: str = "none"  # none | slow-dataloader | cpu-contention | slow-collective | gc-storm | slow-gpu
    rank: int = 0
    magnitude_ms: float = 10.0
    start_s: float = 0.0
    end_s: float = 1e9


@dataclass(frozen=True)
class EventJob:
    ranks: int = 4
    ranks_per_host: int = 1
    step_ms: dict = field(default_factory=lambda: {"dl": 3.0, "fwd": 8.0, "bwd": 14.0, "opt": 3.0})
    transfer_ms: float = 2.0
    jitter: float = 0.08  # lognormal sigma
    skew_ms: float = 40.0
    batch_s: float = 1.0
    gpu: bool = False


def _lognormal(rng: np.random.Generator, mean: float, sigma: float, n: int) -> np.ndarray:
    return mean * rng.lognormal(-sigma * sigma / 2, sigma, n)


class EventSimulator:
    """Steps the job forward in simulated time and yields batches per rank."""

    def __init__(self, job: EventJob, fault: EventFault, seed: int = 0, job_id: str = "job",
                 t0_ms: int = 1_700_000_000_000, also: tuple[EventFault, ...] = ()):
        self.job, self.fault, self.job_id = job, fault, job_id
        self.faults = (fault, *also)  # ``also``: more faults at once (two culprits, a culprit and a victim's GC)
        self.rng = np.random.default_rng(seed)
        self.t0_ns = t0_ms * MS
        hosts = (job.ranks + job.ranks_per_host - 1) // job.ranks_per_host
        self.skew_ns = (self.rng.uniform(-job.skew_ms, job.skew_ms, hosts) * MS).astype(np.int64)
        self.mono0 = self.rng.integers(10**9, 10**12, job.ranks)
        self.clock = np.zeros(job.ranks)  # ns since t0, per rank (true time)
        self.step = 0
        self.seq = 0
        self.batch_seq = np.zeros(job.ranks, dtype=np.int64)
        self.rq_wait_ns = np.zeros(job.ranks)  # run-queue wait since the last batch, per rank
        self.last_batch_ns = np.zeros(job.ranks)
        self.late_ns = np.zeros(job.ranks)  # time spent late before the all-reduce since the last batch
        self.pending: list[list[tuple]] = [[] for _ in range(job.ranks)]
        self.names = ["DataLoader.__next__", "Model.forward", "Model.backward", "Optimizer.step",
                      "gc.collect", "all_reduce"]
        # GPU ranks: name index of the device span of each timed phase (host span name 1, 2, 3)
        self.device_name = {h: len(self.names) + i for i, h in enumerate((1, 2, 3))} if job.gpu else {}
        self.names += [DEVICE_PREFIX + self.names[h] for h in self.device_name]
        if any(f.kind == "slow-gpu" for f in self.faults) and not job.gpu:
            raise ValueError("a slow-gpu fault needs a GPU job (EventJob.gpu)")

    @staticmethod
    def _active(f: EventFault, t_s: float) -> bool:
        return f.start_s <= t_s < f.end_s

    def run_step(self) -> None:
        j, n = self.job, self.job.ranks
        sig = j.jitter
        d = {k: _lognormal(self.rng, v, sig, n) * MS for k, v in j.step_ms.items()}
        gc = np.zeros(n)
        late = np.zeros(n)
        excess = {k: np.zeros(n) for k in ("fwd", "bwd", "opt")}  # device time beyond the host's (slow-gpu)
        transfer = j.transfer_ms * MS * self.rng.lognormal(0, sig / 2)
        for f in self.faults:
            if f.kind != "none" and self._active(f, float(self.clock.max()) / 1e9):
                self._inject(f, d, gc, late, excess)
        self.rq_wait_ns += 0.02 * sum(d.values())
        start = self.clock.copy()
        t_fwd = start + d["dl"]
        t_bwd = t_fwd + d["fwd"] + gc
        # backward's own work ends when the device's does: the host waits for the gradients
        bwd_work = d["bwd"] + excess["fwd"] + excess["bwd"]
        arrive = t_bwd + bwd_work + late
        end = arrive.max() + transfer
        comm_dur = end - arrive
        t_opt = end + (d["bwd"] * 0.02)
        # DDP: the all-reduce is nested at the end of backward; a late entry (sleep before
        # the call) happens outside any instrumented span, after backward's own work
        bwd_end = np.where(late > 0, t_bwd + bwd_work, t_opt)
        finish = t_opt + d["opt"] + excess["opt"]
        for i in range(n):
            p = self.pending[i]
            p.append(("span", 1, 0, start[i], d["dl"][i]))
            p.append(("span", 3, 1, t_fwd[i], d["fwd"][i] + gc[i]))
            if gc[i] > 0:
                p.append(("span", 5, 4, t_fwd[i] + d["fwd"][i] * 0.5, gc[i]))
            p.append(("span", 4, 2, t_bwd[i], bwd_end[i] - t_bwd[i]))
            p.append(("comm", self.seq, arrive[i], comm_dur[i]))
            p.append(("span", 2, 3, t_opt[i], d["opt"][i]))
            if self.device_name:  # device time = host time, plus a slow GPU's excess (module docstring)
                dn = self.device_name
                p.append(("span", DEVICE, dn[1], t_fwd[i], d["fwd"][i] + gc[i] + excess["fwd"][i]))
                p.append(("span", DEVICE, dn[2], t_bwd[i], bwd_end[i] - t_bwd[i] - excess["fwd"][i]))
                p.append(("span", DEVICE, dn[3], t_opt[i], d["opt"][i] + excess["opt"][i]))
            p.append(("iter", self.step, start[i], finish[i] - start[i]))
        self.clock = finish
        self.step += 1
        self.seq += 1

    def _inject(self, f: EventFault, d: dict, gc: np.ndarray, late: np.ndarray, excess: dict) -> None:
        r, m = f.rank, f.magnitude_ms * MS
        if f.kind == "slow-dataloader":
            d["dl"][r] += m
        elif f.kind == "cpu-contention":
            total = sum(v[r] for v in d.values())
            for v in d.values():
                v[r] *= 1 + m / total
            self.rq_wait_ns[r] += m
        elif f.kind == "slow-collective":
            late[r] = m
            self.late_ns[r] += m
        elif f.kind == "gc-storm":
            gc[r] = m
        elif f.kind == "slow-gpu":  # the device's part only; the host spans follow in run_step
            total = sum(d[k][r] for k in excess)
            for k, v in excess.items():
                v[r] += m * d[k][r] / total

    def batch(self, rank: int, now_true_ns: float) -> dict:
        """Drain rank's pending events into one EventBatch dict."""
        j = self.job
        host = rank // j.ranks_per_host
        mono = lambda t: int(self.mono0[rank] + t)  # noqa: E731
        ev = self.pending[rank]
        self.pending[rank] = []
        spans = [e for e in ev if e[0] == "span"]
        comms = [e for e in ev if e[0] == "comm"]
        iters = [e for e in ev if e[0] == "iter"]
        self.batch_seq[rank] += 1
        return {
            "schema_version": 2, "job": self.job_id, "rank": rank, "local_rank": rank % j.ranks_per_host,
            "world_size": j.ranks, "host": f"host{host}", "gpu": rank % j.ranks_per_host if j.gpu else -1,
            "gpu_uuid": "", "pid": 1000 + rank, "seq": int(self.batch_seq[rank]), "dropped_events": 0,
            "wall_ns": int(self.t0_ns + now_true_ns + self.skew_ns[host]), "mono_ns": mono(now_true_ns),
            "names": [*self.names, "/job/train.py step", "loss.backward()", "x.clone()"], "groups": [{"group_id": "world", "ranks": list(range(j.ranks))}],
            "iterations": {"step": [e[1] for e in iters], "start_ns": [mono(e[2]) for e in iters],
                           "dur_ns": [int(e[3]) for e in iters]},
            "spans": {"kind": [e[1] for e in spans], "name": [e[2] for e in spans],
                      "path": [-1] * len(spans), "step": [-1] * len(spans),
                      "start_ns": [mono(e[3]) for e in spans], "dur_ns": [int(e[4]) for e in spans]},
            "comms": {"op": [5] * len(comms), "group": [0] * len(comms), "seq": [e[1] for e in comms],
                      "bytes": [4 << 20] * len(comms), "step": [-1] * len(comms),
                      "start_ns": [mono(e[2]) for e in comms], "dur_ns": [int(e[3]) for e in comms]},
            "kernels": [], "stacks": self._stacks(rank, now_true_ns), "cpu": [self._cpu_sample(rank, now_true_ns)],
        }

    def _stacks(self, rank: int, now_true_ns: float) -> dict:
        """25 Hz stack samples: the step's own work at train.py:40, a late entry's at train.py:88."""
        hz = STACK_HZ / 1e9
        busy = int((now_true_ns - self.last_batch_ns[rank] - self.late_ns[rank]) * hz)
        late = int(round(self.late_ns[rank] * hz))
        self.late_ns[rank] = 0.0
        n = len(self.names)
        rows = [(40, n + 1, busy)] + ([(88, n + 2, late)] if late else [])
        return {"frame": [n] * len(rows), "line": [r[0] for r in rows], "kind": [1] * len(rows),
                "code": [r[1] for r in rows], "count": [r[2] for r in rows]}

    def _cpu_sample(self, rank: int, now_true_ns: float) -> dict:
        interval = int(max(1.0, now_true_ns - self.last_batch_ns[rank]))
        wait = int(self.rq_wait_ns[rank])
        self.last_batch_ns[rank], self.rq_wait_ns[rank] = now_true_ns, 0.0
        return {"interval_ns": interval, "thread_cpu_ns": int(interval * 0.95), "runqueue_wait_ns": wait,
                "voluntary_switches": -1, "involuntary_switches": -1, "major_faults": 0, "load1": -1.0,
                "steal_pct": -1.0, "cpus": -1, "stack_samples": int(interval * STACK_HZ / 1e9),
                "stack_hz": STACK_HZ}
