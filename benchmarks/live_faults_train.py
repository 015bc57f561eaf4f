"""The live fault suite's own training job (``python -m benchmarks.live_faults``): a small
model trained with DDP on gloo (CPU), nothing of perftracker in it (`perftracker launch`
attaches the collectors from outside), with named phases and faults chosen by environment.

Phases of one step, each a function: :func:`load_batch` (a DataLoader whose collate
function is :func:`collate_batch`), :func:`forward` (``Net``: the submodules ``encoder``,
``mixer``, ``head``), :func:`backward` (a gradient hook, :func:`grad_hook`, registered on
the mixer's weight), :func:`optimizer_step` (``TrainerSGD.step``), then untimed code:
:func:`after_step` (where checkpoints are saved and host-side copies happen),
:func:`pair_sync` (an all_reduce inside a 2-rank sub-group: ranks 0,1 and 2,3) and
:func:`job_sync` (the per-step loss all_reduce, which also carries rank 0's decisions:
"the fault starts now" and "stop").

Environment (all optional):

    LF_FAULT      none (default) or a name in FAULTS
    LF_RANKS      culprit ranks, comma-separated (default 2)
    LF_ONSET_S    the fault starts this many seconds after the first step (default 20; 0: from the first step)
    LF_DELAY_MS   size of the injected delay (default 20)
    LF_FOR_S      the fault stops this many seconds after it started (default 0: it never stops)
    LF_ONSET_FILE the first culprit (rank 0 for job-wide faults) writes {"wall_time", "pid", ...} there
    LF_RUN_FILE   train while this file exists (rank 0 looks; all ranks stop at the same step)
    LF_MAX_S      stop after this many seconds in any case (default 600)

Fault code lines end with ``# LF:<name>``: the benchmark reads their line numbers to know
which ``file:line`` a correct location names.
"""

from __future__ import annotations

import gc
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist
from perftracker_ml.deploy.workloads import inject  # the workloads' shared fault mechanics
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import default_collate

FAULTS = ("none", "slow-optimizer", "slow-backward-hook", "slow-forward-submodule", "host-copies",
          "cpu-contention", "two-culprits", "stall-before-forward", "subgroup-hang", "killed",
          "checkpoint", "data-imbalance", "gradual-creep", "one-off-spike", "job-wide-slowdown",
          "gc-storm", "intermittent-straggler", "untimed-sleep", "slow-loader-workers", "long-pause",
          "jitter", "gil-thread", "eval-passes")
LONG_PAUSE_S = 12.0  # long-pause: one stall, shorter than a hang (hang_floor_s 30 s)
LOADER_WORKERS = 2  # slow-loader-workers: every rank's DataLoader has this many worker processes
ALL_RANKS = ("job-wide-slowdown", "jitter", "eval-passes")
CREEP_S = 40.0  # gradual-creep: the delay grows from 0 to LF_DELAY_MS x 2 over this many seconds
HOGS = 2  # cpu-contention: busy processes sharing the culprit's core
STALL_MAX_S = 240.0
EVERY_NTH = 4  # intermittent-straggler: one step in this many is slow (by this many times the delay)
GC_OBJECTS = 200_000  # gc-storm: small containers kept alive, which every collection walks
JITTER_P = 0.05  # jitter: each rank's optimizer step is this often 1.5 x the delay slower, at random
EVAL_EVERY = 400  # eval-passes: every rank evaluates every this many steps (~6-8 s here) ...
EVAL_BATCHES = 60  # ... on this many batches, forward only, then all-reduces the loss


class Fault:
    """Which fault this rank runs and whether it is on (rank 0 decides when, for every rank)."""

    def __init__(self, rank: int, env: dict[str, str]) -> None:
        self.name = env.get("LF_FAULT", "none") or "none"
        if self.name not in FAULTS:
            raise SystemExit(f"LF_FAULT={self.name!r}: choose one of {', '.join(FAULTS)}")
        culprits = [int(r) for r in (env.get("LF_RANKS") or "2").split(",") if r.strip()]
        self.rank = rank
        self.mine = self.name != "none" and (rank in culprits or self.name in ALL_RANKS)
        # who writes the onset: the first culprit; rank 0 for job-wide faults and for none
        self.writer = rank == (0 if self.name in ALL_RANKS + ("none",) else min(culprits, default=-1))
        self.culprit_index = culprits.index(rank) if rank in culprits else -1
        self.onset_s = float(env.get("LF_ONSET_S", "20"))
        self.for_s = float(env.get("LF_FOR_S", "0"))  # the fault stops this long after it started (0: never)
        self.delay_s = float(env.get("LF_DELAY_MS", "20")) / 1000
        self.onset_file = env.get("LF_ONSET_FILE", "")
        self.run_file = env.get("LF_RUN_FILE", "")
        self.on = False
        self.since = 0.0
        self.spiked = False
        self.calls = 0
        self.heap: list = []
        self.hogs: list[subprocess.Popen] = []
        self.random = random.Random(rank)  # jitter: each rank its own draws

    def active(self, name: str) -> bool:
        return (self.on and self.mine and self.name == name
                and not (self.for_s and time.monotonic() - self.since >= self.for_s))

    def start(self, step: int) -> None:
        self.on, self.since = True, time.monotonic()
        if self.mine and self.name == "cpu-contention":
            self.hogs = inject.pin_with_hogs(HOGS)
        if self.mine and self.name == "gil-thread":
            threading.Thread(target=gil_hog, name="metrics-export", daemon=True).start()
        if self.writer and self.onset_file:
            inject.write_onset(self.onset_file, self.name, self.rank, step)
        if not self.mine:
            return
        print(f"[live-faults] {self.name} on rank {self.rank} from step {step}", flush=True)
        if self.name == "killed":
            os.kill(os.getpid(), signal.SIGSTOP)  # LF:killed

    def stop(self) -> None:
        inject.stop_hogs(self.hogs)
        self.hogs = []

    def running(self) -> bool:
        return not self.run_file or os.path.exists(self.run_file)


FAULT: Fault


def busy(seconds: float, work: torch.Tensor) -> None:
    """CPU work for ``seconds`` of wall time (small matrix products)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        work = torch.tanh(work @ work.T @ work * 1e-3)


# ---- the model -------------------------------------------------------------------------

class Encoder(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.proj = nn.Linear(64, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if FAULT.active("intermittent-straggler"):
            FAULT.calls += 1
            if FAULT.calls % EVERY_NTH == 0:
                busy(EVERY_NTH * FAULT.delay_s, x.detach()[:16, :16].clone())  # LF:intermittent-straggler
        return torch.relu(self.proj(x))


class Mixer(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.lin = nn.Linear(hidden, hidden)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if FAULT.active("slow-forward-submodule"):
            busy(FAULT.delay_s, h.detach()[:16, :16].clone())  # LF:slow-forward-submodule
        return torch.relu(self.lin(h)) + h


class Head(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.out = nn.Linear(hidden, 8)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.out(h)


class Net(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.encoder, self.mixer, self.head = Encoder(hidden), Mixer(hidden), Head(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.mixer(self.encoder(x)))


class TrainerSGD(torch.optim.SGD):
    """SGD whose step may do extra work on a culprit (slow-optimizer)."""

    def step(self, closure=None):  # type: ignore[override]
        loss = super().step(closure)
        if FAULT.active("slow-optimizer") or (FAULT.active("two-culprits") and FAULT.culprit_index == 1):
            busy(FAULT.delay_s, torch.ones(16, 16))  # LF:slow-optimizer
        if FAULT.active("jitter"):  # every rank: short waits each step, now and then a long one
            long = FAULT.random.random() < JITTER_P
            busy(FAULT.delay_s * (1.5 if long else FAULT.random.uniform(0, 0.1)), torch.ones(16, 16))  # LF:jitter
        return loss


# ---- the phases ------------------------------------------------------------------------

def collate_batch(batch: list) -> object:
    if FAULT.active("two-culprits") and FAULT.culprit_index == 0:
        time.sleep(FAULT.delay_s)  # LF:two-culprits-loader
    if FAULT.active("slow-loader-workers"):  # runs in a loader worker process (forked with FAULT on)
        time.sleep(LOADER_WORKERS * 1.5 * FAULT.delay_s)  # LF:slow-loader-workers
    if FAULT.active("gradual-creep"):
        grown = min(1.0, (time.monotonic() - FAULT.since) / CREEP_S)
        time.sleep(2 * FAULT.delay_s * grown)  # LF:gradual-creep
    return default_collate(batch)


def endless(loader: DataLoader) -> Iterator:
    while True:
        yield from loader


def load_batch(batches: Iterator) -> tuple[torch.Tensor, torch.Tensor]:
    return next(batches)


def forward(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if FAULT.active("stall-before-forward"):
        stall()
    return nn.functional.mse_loss(model(x), y)


def grad_hook(grad: torch.Tensor) -> torch.Tensor:
    if FAULT.active("slow-backward-hook"):
        busy(FAULT.delay_s, grad[:16, :16].clone())  # LF:slow-backward-hook
    return grad


def backward(loss: torch.Tensor) -> None:
    loss.backward()


def optimizer_step(opt: torch.optim.Optimizer) -> None:
    opt.step()
    opt.zero_grad(set_to_none=True)


def after_step(model: nn.Module, step: int, ballast: torch.Tensor, ckpt_path: str) -> None:
    """Untimed code between the optimizer step and the step's collectives."""
    if FAULT.active("host-copies"):
        end = time.perf_counter() + FAULT.delay_s
        while time.perf_counter() < end:
            ballast.clone()  # LF:host-copies
    if FAULT.active("checkpoint") and step % 2 == 0:
        torch.save({"model": model.state_dict(), "ballast": ballast}, ckpt_path)  # LF:checkpoint
    if FAULT.active("one-off-spike") and not FAULT.spiked:
        FAULT.spiked = True
        time.sleep(1.5)  # LF:one-off-spike
    if FAULT.active("long-pause") and not FAULT.spiked:
        FAULT.spiked = True
        time.sleep(LONG_PAUSE_S)  # LF:long-pause
    if FAULT.active("job-wide-slowdown"):
        time.sleep(FAULT.delay_s)  # LF:job-wide-slowdown
    if FAULT.active("untimed-sleep"):
        time.sleep(FAULT.delay_s)  # LF:untimed-sleep
    if FAULT.active("gc-storm"):
        if not FAULT.heap:
            FAULT.heap = [[i] for i in range(GC_OBJECTS)]  # a cache of small objects ...
        gc.collect()  # LF:gc-storm ... walked by a full collection each step (a library's "free memory" call)


def evaluate(model: nn.Module, batches: Iterator) -> float:
    """An evaluation pass as training scripts run one: forward only under no_grad, no optimizer
    step (so no iteration completes), and the mean loss all-reduced across ranks."""
    model.eval()
    total = torch.zeros(1)
    with torch.no_grad():
        for _ in range(EVAL_BATCHES):
            x, y = load_batch(batches)
            total += nn.functional.mse_loss(model(x), y)  # LF:eval-passes
    dist.all_reduce(total)
    model.train()
    return float(total) / (EVAL_BATCHES * dist.get_world_size())


def pair_sync(value: torch.Tensor, group: object) -> None:
    if FAULT.active("subgroup-hang"):
        stall()
    dist.all_reduce(value, group=group)  # type: ignore[arg-type]


def job_sync(loss: torch.Tensor, started: float) -> tuple[float, bool, bool]:
    """The per-step loss all_reduce; rank 0 adds its decisions (fault on, stop) to it."""
    rank0 = dist.get_rank() == 0
    elapsed = time.monotonic() - started
    flags = torch.tensor([float(loss.detach()),
                          float(rank0 and (not FAULT.running() or elapsed > MAX_S)),
                          float(rank0 and elapsed >= FAULT.onset_s)])
    dist.all_reduce(flags)
    return float(flags[0]) / dist.get_world_size(), bool(flags[1] > 0), bool(flags[2] > 0)


def stall() -> None:
    """A rank stuck in plain Python (until the run ends)."""
    end = time.monotonic() + STALL_MAX_S
    while FAULT.running() and time.monotonic() < end:
        time.sleep(0.2)  # LF:stall


def gil_hog() -> None:
    """A background thread of the training process in pure Python (a metrics exporter that
    serializes in a loop, say): it holds the GIL whenever the training thread lets go of it."""
    x = 0
    while FAULT.running():
        for _ in range(100_000):
            x += 1  # LF:gil-thread


MAX_S = float(os.environ.get("LF_MAX_S", "600"))


def main() -> None:
    global FAULT
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    FAULT = Fault(rank, dict(os.environ))
    pairs = [dist.new_group([r, r + 1]) for r in range(0, world - 1, 2)]
    my_pair = pairs[min(rank // 2, len(pairs) - 1)]
    hidden, batch = 128, 32
    g = torch.Generator().manual_seed(rank)
    data = TensorDataset(torch.randn(4096, 64, generator=g), torch.randn(4096, 8, generator=g))
    workers = LOADER_WORKERS if FAULT.name == "slow-loader-workers" else 0  # every rank alike
    loader = DataLoader(data, batch_size=batch, shuffle=True, drop_last=True, collate_fn=collate_batch,
                        num_workers=workers)
    net = Net(hidden)
    net.mixer.lin.weight.register_hook(grad_hook)
    model = DistributedDataParallel(net)
    opt = TrainerSGD(model.parameters(), lr=0.01, momentum=0.9)
    ballast = torch.randn(512, 1024)  # 2 MB: copied by host-copies, saved by checkpoint
    ckpt_path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"lf-ckpt-{os.getpid()}.pt")
    started = time.monotonic()
    step = 0
    stop = False
    batches = endless(loader)
    try:
        while not stop:
            micro = 4 if FAULT.active("data-imbalance") else 1  # LF:data-imbalance
            for i in range(micro):
                x, y = load_batch(batches)
                if i < micro - 1:
                    with model.no_sync():
                        backward(forward(model, x, y))
                    continue
                loss = forward(model, x, y)
                backward(loss)
            optimizer_step(opt)
            after_step(model, step, ballast, ckpt_path)
            pair_sync(torch.ones(4), my_pair)
            mean_loss, stop, fault_on = job_sync(loss, started)
            if fault_on and not FAULT.on:
                FAULT.start(step)
            step += 1
            if FAULT.active("eval-passes") and step % EVAL_EVERY == 0:  # the same step on every rank
                evaluate(model, batches)
            if rank == 0 and step % 500 == 0:
                print(f"step {step} loss {mean_loss:.4f} {time.monotonic() - started:.0f} s", flush=True)
    finally:
        FAULT.stop()
        if os.path.exists(ckpt_path):
            os.unlink(ckpt_path)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
